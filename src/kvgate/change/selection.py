"""Which cells a vLLM change can affect, from vLLM's own import graph. Pure: paths, rules and graphs in, a plan out.

A cell's engine loads its closure: from the engine's roots (matrix/backends.toml [selection]: the engine, its
arch's platform and worker), the cell's backend module (vLLM's attention backend registry) and its model's module
(vLLM's model registry, by the workload's architectures), every module those load (kvgate.change.import_graph),
except that shared code never enters another backend's or another model's own module on the cell's behalf (vLLM's
spec-decode proposer imports backends.triton_attn: that does not make triton_attn.py every cell's); a backend's or a
model's own module that imports another one does carry it. The closures are taken on both sides of the change,
base and head, and united.

Each changed path then gets one verdict:
    loaded    a module of the vllm package: the cells whose closure holds it (the import chain says why)
    unloaded  a module no cell's engine loads (another backend's or model's own, or unreached): no cell, said so
    inert     a path of [selection] inert (docs, examples, vLLM's own tests, CI files): no cell
    compiled  what the graph cannot see (csrc/, CMake, build files): the backends whose `sources` globs claim it,
              every cell for [shared] sources
    feature   a path that only a feature's vllm_paths claim (matrix/axes.toml [features]): that feature's cells
    unknown   anything else, a module no side of the change has included: every cell, with the reason (never
              silently none)
    no_graph  a module of the package when no vLLM source was given to read the graph from: every cell

A path a feature's vllm_paths claim (vllm/v1/spec_decode/** for spec_decode, vllm/distributed/... and the all-reduce
kernels for tp2) selects that feature's cells besides whatever its verdict selects: the change implies the feature,
whether or not the import graph reaches it (vLLM loads some of it lazily, and kernels are not in the graph).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvgate.change.import_graph import ImportGraph, chain, module_of, reach
from kvgate.matrix.cells import Cell, Matrix, glob_matches

VERDICTS = ("loaded", "unloaded", "inert", "compiled", "feature", "unknown", "no_graph")


@dataclass(frozen=True, slots=True)
class VllmCode:
    """One side of a change: its import graph and what vLLM's two registries name."""

    graph: ImportGraph
    backend_modules: Mapping[str, str]  # attention backend name -> its module (AttentionBackendEnum)
    model_modules: Mapping[str, str]  # model architecture -> its module (the model registry)

    @classmethod
    def from_graph(cls, graph: ImportGraph, registry_texts: Mapping[str, str | None], matrix: Matrix) -> VllmCode:
        rules = matrix.selection
        attention = registry_texts.get(rules.attention_registry)
        models = registry_texts.get(rules.model_registry)
        # A backend's module is the one its class path names ("vllm.a.b.Class" -> vllm.a.b), never a package above
        # it: vLLM 0.32's registry names NO_ATTENTION in a module it does not ship, and taking the longest prefix made
        # all of vllm.v1.attention.backends that backend's own, out of every other cell's reach (registry.py,
        # fa_utils.py and mla/prefill/ planned no FP8 cell). A backend whose module the tree lacks is not in this
        # side's registry (_missing_backend: its cells count as touched by any module change).
        backends = {name: _class_module(graph, path) for name, path in attention_registry(attention or "").items()}
        return cls(graph=graph, backend_modules={k: v for k, v in backends.items() if v},
                   model_modules={arch: module for arch, module in model_registry(models or "").items()
                                  if graph.resolve(module) == module})

    def owners(self) -> dict[str, str]:
        """Own module -> its owner ("backend:NAME" or "model:<module>")."""
        owned = {module: f"model:{module}" for module in self.model_modules.values()}
        owned.update({module: f"backend:{name}" for name, module in self.backend_modules.items()})
        return owned


def _class_module(graph: ImportGraph, class_path: str) -> str | None:
    """The module of the tree that "vllm.a.b.Class" (or "vllm.a.b") names: vllm.a.b, or None where the tree has no
    such module (a package above it is another module, not this backend's)."""
    module = graph.resolve(class_path)
    return module if module in (class_path, class_path.rpartition(".")[0]) else None


def attention_registry(text: str) -> dict[str, str]:
    """NAME -> "vllm.a.b.Class" of the AttentionBackendEnum class in the registry's source (pure)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # nested past the parser's limits: names nothing
        return {}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "AttentionBackendEnum":
            for item in node.body:
                if (isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name)
                        and isinstance(item.value, ast.Constant) and isinstance(item.value.value, str)
                        and item.value.value.startswith("vllm.")):
                    found[item.targets[0].id] = item.value.value
    return found


def model_registry(text: str) -> dict[str, str]:
    """architecture -> module of every `"Arch": ("module", "Class")` entry of the model registry's dicts (pure); a
    relative module name is under vllm.model_executor.models, a dotted one taken as it is (vLLM's own rule)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # nested past the parser's limits: names nothing
        return {}
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2 and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                     for e in value.elts)):
                module = value.elts[0].value
                found[key.value] = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
    return found


@dataclass(frozen=True, slots=True)
class PathVerdict:
    path: str
    verdict: str  # one of VERDICTS
    cells: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class CellReason:
    """Why a cell was selected: the first changed path that did, and the import chain (paths) that reaches it."""

    path: str
    chain: tuple[str, ...] = ()
    side: str = ""  # base | head: the side whose graph holds the chain
    feature: str = ""  # the feature the path implies (matrix/axes.toml features.<name>.vllm_paths), when that selected it


@dataclass(slots=True)
class Selection:
    cells: list[Cell]
    paths: list[PathVerdict]
    reasons: dict[str, CellReason] = field(default_factory=dict)
    tree: str = ""  # which vLLM source the import graph was read from, for people (the CLI says)

    def explain(self) -> list[str]:
        """Lines for people: the vLLM source read; per cell, the path that selected it and through which chain; then
        every path."""
        lines = [f"vLLM source read: {self.tree}"] if self.tree else []
        for cell in self.cells:
            reason = self.reasons.get(cell.id)
            if reason is None:
                continue
            via = f" via {' -> '.join(reason.chain)}" if len(reason.chain) > 1 else ""
            implies = f" (implies feature {reason.feature})" if reason.feature else ""
            lines.append(f"{cell.id}: {reason.path}{via}{implies}" + (f" ({reason.side})" if reason.side and via else ""))
        lines += [f"{v.path}: {v.verdict}, {len(v.cells)} cells: {v.reason}" for v in self.paths]
        return lines

    def markdown(self, seconds: float | None = None) -> str:
        """The plan's explanation for a step summary: per cell the path and chain, then every path's verdict."""
        took = f" in {seconds:.1f} s" if seconds is not None else ""
        out = ["### Why these cells", "", f"{len(self.paths)} changed paths select {len(self.cells)} cells{took} "
               "(kvgate.change.selection: vLLM's import graph on both sides of the change).", ""]
        if self.tree:
            out += [f"vLLM source read: {self.tree}.", ""]
        if self.cells:
            out += ["| cell | selected by | import chain |", "|---|---|---|"]
            for cell in self.cells:
                reason = self.reasons.get(cell.id)
                if reason is not None:
                    chain = " → ".join(f"`{p}`" for p in reason.chain) if len(reason.chain) > 1 else ""
                    if reason.feature:
                        chain = f"implies feature `{reason.feature}`"
                    out.append(f"| `{cell.id}` | `{reason.path}` | {chain} |")
            out.append("")
        counts = {v: sum(1 for p in self.paths if p.verdict == v) for v in VERDICTS}
        out += ["| path verdict | paths |", "|---|---|", *[f"| {v} | {n} |" for v, n in counts.items() if n], ""]
        notable = [p for p in self.paths if p.verdict in ("unknown", "no_graph", "unloaded")][:50]
        if notable:
            out += ["<details><summary>Paths that select every cell or none, and why</summary>", "",
                    *[f"- `{p.path}`: {p.verdict}: {p.reason}" for p in notable], "", "</details>", ""]
        return "\n".join(out)


def select(matrix: Matrix, changed: Sequence[str], candidates: Sequence[Cell], *, base: VllmCode | None = None,
           head: VllmCode | None = None) -> Selection:
    """The candidates a change of these paths can affect, and a verdict for every path."""
    rules = matrix.selection
    sides = [(name, code) for name, code in (("base", base), ("head", head)) if code is not None]
    closures = _closures(matrix, candidates, sides)
    every = tuple(c.id for c in candidates)
    selected: dict[str, CellReason] = {}
    verdicts = []
    for path in dict.fromkeys(p for p in changed if p):
        judged = _with_features(matrix, path, candidates,
                                _judge_path(matrix, path, candidates, closures, sides, every, rules.inert))
        verdicts.append(judged.result)
        for cell_id in judged.result.cells:
            if cell_id not in selected:
                selected[cell_id] = judged.reasons.get(cell_id, CellReason(path=path))
    cells = [c for c in candidates if c.id in selected]
    return Selection(cells=cells, paths=verdicts, reasons=selected)


@dataclass(frozen=True, slots=True)
class _Judged:
    result: PathVerdict
    reasons: dict[str, CellReason]


def implied_features(matrix: Matrix, path: str) -> list[str]:
    """The features whose vllm_paths claim this path (matrix/axes.toml [features]); pure."""
    return [name for name, feature in matrix.features.items()
            if any(glob_matches(pattern, path) for pattern in feature.vllm_paths)]


def _with_features(matrix: Matrix, path: str, candidates: Sequence[Cell], judged: _Judged) -> _Judged:
    """The path's verdict, and the cells of the features it implies besides. A path the graph selects nothing for,
    or an unknown path, that a feature claims: that feature's cells alone (verdict `feature`)."""
    names = implied_features(matrix, path)
    if not names or judged.result.verdict == "inert":
        return judged
    mine = {c.id: CellReason(path=path, feature=c.feature_name) for c in candidates if c.feature_name in names}
    claims = f"implies {', '.join(names)} (matrix/axes.toml features.<name>.vllm_paths)"
    if judged.result.verdict in ("unloaded", "unknown"):
        return _Judged(PathVerdict(path, "feature", tuple(mine), f"{claims}: {len(mine)} cells"), mine)
    cells = tuple(dict.fromkeys([*judged.result.cells, *mine]))
    reasons = {**judged.reasons, **mine}
    return _Judged(PathVerdict(path, judged.result.verdict, cells, f"{judged.result.reason}; {claims}"), reasons)


def _judge_path(matrix: Matrix, path: str, candidates: Sequence[Cell], closures, sides, every: tuple[str, ...],
                inert: Sequence[str]) -> _Judged:
    if any(glob_matches(pattern, path) for pattern in inert):
        return _Judged(PathVerdict(path, "inert", (), "declared inert (matrix/backends.toml [selection] inert)"), {})
    module = module_of(path)
    if module is not None:
        if not sides:
            return _Judged(PathVerdict(path, "no_graph", every, "a module of the vllm package, and no vLLM source was "
                                                                 "given to read its import graph from: every cell"), {})
        if not any(module in code.graph.paths for _, code in sides):
            # The tree read is not the change's (`--changed-files` over the pinned release, which predates the pull
            # request): a module it lacks, a new file or one vLLM's main added since, has importers and imports it
            # cannot see. It planned no cell (vllm/v1/attention/backends/new_backend.py, vllm/attention/ops/*.py)
            return _Judged(PathVerdict(path, "unknown", every, "a module of the vllm package that no side of the "
                                                               "change has (the vLLM source read predates it), so "
                                                               "what loads it is unknown: every cell"), {})
        reasons: dict[str, CellReason] = {}
        for cell in candidates:
            for side, code in sides:
                came_from = closures[(side, _key(cell, code, matrix))]
                if module in came_from:
                    modules = chain(came_from, module)
                    reasons[cell.id] = CellReason(path=path, side=side,
                                                  chain=tuple(code.graph.paths.get(m, m) for m in modules))
                    break
            else:
                missing = _missing_backend(cell, sides)
                if missing:
                    reasons[cell.id] = CellReason(path=path, chain=(missing,))
        if reasons:
            return _Judged(PathVerdict(path, "loaded", tuple(reasons), f"loaded by the engine of {len(reasons)} "
                                                                      "cells (their import closure holds it)"), reasons)
        return _Judged(PathVerdict(path, "unloaded", (), _unloaded_reason(module, sides, candidates)), {})
    if any(glob_matches(pattern, path) for pattern in matrix.shared_sources):
        return _Judged(PathVerdict(path, "compiled", every, "a shared build or kernel path ([shared] sources): every "
                                                            "cell"), {})
    claimed = {name for name, backend in matrix.backends.items()
               if any(glob_matches(pattern, path) for pattern in backend.sources)}
    if claimed:
        cells = tuple(c.id for c in candidates if c.backend in claimed)
        return _Judged(PathVerdict(path, "compiled", cells, f"claimed by the sources of {', '.join(sorted(claimed))}"),
                       {})
    return _Judged(PathVerdict(path, "unknown", every, "neither inert nor a module the import graph can see (a "
                                                       "compiled or build file no backend's sources claim): every "
                                                       "cell"), {})


def _missing_backend(cell: Cell, sides) -> str:
    """Why a cell counts as touched by any module change: its backend is not in a side's registry."""
    for side, code in sides:
        if cell.backend not in code.backend_modules:
            return f"{cell.backend} is not in the {side} side's attention backend registry"
    return ""


def _unloaded_reason(module: str, sides, candidates: Sequence[Cell]) -> str:
    for _, code in sides:
        owner = _owner(module, code.owners())
        if owner and owner.startswith("backend:"):
            name = owner.split(":", 1)[1]
            if not any(c.backend == name for c in candidates):
                return f"no cell loads it: it is the attention backend {name}'s own, and no selected cell runs {name}"
        if owner and owner.startswith("model:"):
            return f"no cell loads it: it is the model module {owner.split(':', 1)[1]}'s own, and no workload runs it"
    return "no cell's engine loads it (no import chain from any cell's roots reaches it)"


def _key(cell: Cell, code: VllmCode, matrix: Matrix) -> tuple:
    kind = "cpu" if cell.arch == "cpu" else "gpu"
    architectures = cell.workload.architectures
    models = tuple(sorted({code.model_modules[a] for a in architectures if a in code.model_modules})) \
        if architectures else tuple(sorted(set(code.model_modules.values())))
    return (cell.backend, kind, models)


def _closures(matrix: Matrix, candidates: Sequence[Cell], sides) -> dict[tuple, dict[str, str | None]]:
    rules = matrix.selection
    found: dict[tuple, dict[str, str | None]] = {}
    for side, code in sides:
        owners = code.owners()
        for cell in candidates:
            key = _key(cell, code, matrix)
            if (side, key) in found:
                continue
            backend, kind, models = key
            mine = {f"model:{m}" for m in models} | {f"backend:{backend}"}
            roots = [*rules.engine_roots, *rules.arch_roots.get(kind, ()), *models]
            if backend in code.backend_modules:
                roots.append(code.backend_modules[backend])

            def may_enter(source: str, target: str, owners=owners, mine=mine) -> bool:
                owner = _owner(target, owners)
                return owner is None or owner in mine or _owner(source, owners) is not None

            found[(side, key)] = reach(code.graph, roots, may_enter)
    return found


def _owner(module: str, owners: Mapping[str, str]) -> str | None:
    """The owner of a module: the longest own-module prefix of it (a package's submodules are its own too)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        owner = owners.get(".".join(parts[:end]))
        if owner is not None:
            return owner
    return None


def closure_sizes(matrix: Matrix, candidates: Sequence[Cell], code: VllmCode) -> dict[tuple, int]:
    """Modules in each distinct closure (backend, cpu|gpu, model modules), for the plan's figures."""
    return {key: len(came_from) for (_, key), came_from in _closures(matrix, candidates, [("base", code)]).items()}


def paths_by_verdict(selection: Selection) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {v: [] for v in VERDICTS}
    for verdict in selection.paths:
        out[verdict.verdict].append(verdict.path)
    return out


def changed_modules(paths: Iterable[str]) -> list[str]:
    return [p for p in paths if module_of(p) is not None]


def code_from_sources(sources: Mapping[str, str], matrix: Matrix) -> VllmCode:
    """One side's code from a whole tree's Python sources (path -> text)."""
    graph = ImportGraph.from_sources(sources)
    return VllmCode.from_graph(graph, _registry_texts(graph, matrix, sources.get), matrix)


def code_with_changes(base: VllmCode, base_sources: Mapping[str, str], files: Mapping[str, str | None],
                      matrix: Matrix) -> VllmCode:
    """The other side: the base tree with these files changed, added (text) or deleted (None)."""
    graph = base.graph.changed(files)

    def text(path: str) -> str | None:
        return files[path] if path in files else base_sources.get(path)

    return VllmCode.from_graph(graph, _registry_texts(graph, matrix, text), matrix)


def _registry_texts(graph: ImportGraph, matrix: Matrix, text) -> dict[str, str | None]:
    rules = matrix.selection
    return {module: text(graph.paths[module]) if module in graph.paths else None
            for module in (rules.attention_registry, rules.model_registry)}
