"""vLLM's import graph, read statically: which of its modules a module loads. Pure (source text in, edges out).

A module u has an edge to v when u
  - imports v (`import vllm.a.b`, `from vllm.a import b`, relative forms resolved), at module level, inside a
    function, or under `if TYPE_CHECKING:` (over-approximation is safe: it can only select more cells), or
    imports a name from it (`from vllm.a.b import C` is an edge to vllm.a.b); importing vllm.a.b also runs the
    packages vllm and vllm.a, so there are edges to them too;
  - names v in a string constant that spells a dotted path into the tree (`"vllm.v1.attention.backends.flash_attn.
    FlashAttentionBackend"`: vLLM's registries, worker classes and platform plugins load code this way); the
    longest prefix that is a module is the target.
Nothing is imported or run, and the text is scanned, not parsed (`referenced_names`), so a file that would not
even parse still has its edges.

    ImportGraph.from_sources({path: text})    the graph of a tree (paths as git has them: vllm/a/b.py)
    graph.changed({path: text or None})       the same tree with some files changed, added (text) or deleted (None)
    reach(graph, roots, may_enter)            every module reachable from the roots, with the edge that first
                                              reached it (for the import chain a plan explains)
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

PACKAGE = "vllm"
_DOTTED = re.compile(r"vllm(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def module_of(path: str) -> str | None:
    """'vllm/a/b.py' -> 'vllm.a.b', 'vllm/a/__init__.py' -> 'vllm.a'; None for anything else."""
    if not path.endswith(".py") or not (path == f"{PACKAGE}/__init__.py" or path.startswith(f"{PACKAGE}/")):
        return None
    parts = path[:-3].split("/")
    if not all(part.isidentifier() for part in parts):
        return None
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@dataclass(frozen=True, slots=True)
class ImportGraph:
    paths: Mapping[str, str]  # module -> its path in the tree
    packages: frozenset[str]  # modules that are packages (__init__.py)
    raw: Mapping[str, frozenset[str]]  # module -> dotted names it refers to (imports and strings), unresolved
    _edges: dict[str, frozenset[str]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_sources(cls, sources: Mapping[str, str]) -> ImportGraph:
        paths, packages, raw = {}, set(), {}
        for path, text in sources.items():
            module = module_of(path)
            if module is None:
                continue
            paths[module] = path
            is_package = path.endswith("/__init__.py")
            if is_package:
                packages.add(module)
            raw[module] = frozenset(referenced_names(text, module, is_package))
        return cls(paths=paths, packages=frozenset(packages), raw=raw)

    def changed(self, files: Mapping[str, str | None]) -> ImportGraph:
        """This tree with files changed or added (their new text) or deleted (None)."""
        paths, packages, raw = dict(self.paths), set(self.packages), dict(self.raw)
        for path, text in files.items():
            module = module_of(path)
            if module is None:
                continue
            if text is None:
                if paths.get(module) == path:
                    del paths[module], raw[module]
                    packages.discard(module)
                continue
            paths[module] = path
            is_package = path.endswith("/__init__.py")
            (packages.add if is_package else packages.discard)(module)
            raw[module] = frozenset(referenced_names(text, module, is_package))
        return ImportGraph(paths=paths, packages=frozenset(packages), raw=raw)

    def edges(self, module: str) -> frozenset[str]:
        """The modules of the tree that `module` loads (resolved, computed once)."""
        found = self._edges.get(module)
        if found is None:
            targets = set()
            for name in self.raw.get(module, ()):
                target = self.resolve(name)
                if target is not None and target != module:
                    targets.add(target)
                    targets.update(self.parents(target))
            targets.update(self.parents(module))
            targets.discard(module)
            found = self._edges[module] = frozenset(targets)
        return found

    def resolve(self, dotted: str) -> str | None:
        """The longest prefix of a dotted name that is a module of the tree."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in self.paths:
                return candidate
        return None

    def parents(self, module: str) -> list[str]:
        """The packages importing `module` runs first (vllm, vllm.a for vllm.a.b), those in the tree."""
        parts = module.split(".")
        return [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in self.paths]


_FROM = re.compile(r"(?m)(?:^|[;:])[ \t]*from[ \t]+(\.*[A-Za-z_][\w.]*|\.+)[ \t]+import[ \t]*(\([^)(]*\)|[^\n;]*)")
_IMPORT = re.compile(r"(?m)(?:^|[;:])[ \t]*import[ \t]+([^\n;]*)")
_STRING = re.compile(r"""["'](vllm(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\.?["']""")
_COMMENT = re.compile(r"#[^\n]*")


def referenced_names(text: str, module: str, is_package: bool) -> set[str]:
    """The dotted names a module's text refers to: what its import statements name (relative ones resolved) and
    every string that spells a dotted vllm path (a trailing dot kept apart, for strings split over lines). Pure.

    A static scan of the text, not a parse: seven times faster than `ast` on vLLM's million lines (the plan's
    budget), and tested to miss no edge `ast` finds on a real vLLM tree (tests/test_selection.py). It can only err
    towards more edges (an import statement quoted in a docstring, a commented-out one), which selects more cells,
    never fewer. Code is never imported or run."""
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    names.update(_STRING.findall(text))
    code = _COMMENT.sub("", text.replace("\\\n", " "))
    for base, imported in _FROM.findall(code):
        level = len(base) - len(base.lstrip("."))
        absolute = _absolute(base.lstrip(".") or None, level, package)
        if absolute is None or absolute.split(".")[0] != PACKAGE:
            continue
        names.add(absolute)
        for part in imported.strip().strip("()").split(","):
            name = part.strip().split(" as ")[0].strip()
            if name.isidentifier():
                names.add(f"{absolute}.{name}")
    for imported in _IMPORT.findall(code):
        for part in imported.split(","):
            name = part.strip().split(" as ")[0].strip()
            if name.split(".")[0] == PACKAGE and all(p.isidentifier() for p in name.split(".")):
                names.add(name)
    return names


def _absolute(module: str | None, level: int, package: str) -> str | None:
    if level == 0:
        return module
    parts = package.split(".")
    if level - 1 > len(parts) - 1:
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def reach(graph: ImportGraph, roots: Iterable[str], may_enter: Callable[[str, str], bool]) -> dict[str, str | None]:
    """module -> the module that first reached it (None for a root), over the edges `may_enter(from, to)` allows."""
    came_from: dict[str, str | None] = {}
    queue: deque[str] = deque()
    for root in roots:
        if root in graph.paths and root not in came_from:
            came_from[root] = None
            queue.append(root)
    while queue:
        module = queue.popleft()
        for target in sorted(graph.edges(module)):
            if target not in came_from and may_enter(module, target):
                came_from[target] = module
                queue.append(target)
    return came_from


def chain(came_from: Mapping[str, str | None], module: str) -> list[str]:
    """The modules from a root to `module`, along the edges that reached it."""
    path = [module]
    while came_from.get(path[-1]) is not None:
        path.append(came_from[path[-1]])  # type: ignore[arg-type]
    return path[::-1]
