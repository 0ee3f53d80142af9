"""vLLM's Python sources as the import graph needs them, read from where a run or a plan has them (I/O).

    folder_sources(root)        every vllm/**/*.py under `root` (a vLLM checkout, or a folder holding the installed
                                `vllm` package, e.g. site-packages or an overlay)
    git_sources(repo, rev)      every vllm/**/*.py of a commit of a vLLM git checkout (git ls-tree + cat-file)
    git_files(repo, rev, paths) those paths' text at a commit (None where the commit has no such file)
    installed_vllm_root()       the folder holding this Python's `vllm` package (found, never imported)

A module that is a symlink (or lies in a symlinked folder) to another file of the package is read with the target's
text and an import of the target's module (`through_link`): Python runs the target's code as both modules, so a
change to the target plans the cells that load the link (it planned none: the target's own module is imported by no
one). Nothing is imported or executed. A tree of thousands of files is read in well under a second by git, a few
seconds from a folder.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import posixpath
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

from kvgate import InputError
from kvgate.change.import_graph import PACKAGE, module_of
from kvgate.matrix import regular_files

MAX_SOURCE_BYTES = 16 * 1024 * 1024  # one .py file; vLLM's largest is well under 1 MiB
MAX_SOURCE_FILES = 100_000  # vLLM has a few thousand


def folder_sources(root: Path) -> dict[str, str]:
    """Every vllm/**/*.py under `root`, as Python would import them: through symlinked folders (a loop back to a
    folder above is not followed), at any depth. A file that cannot be read is one error naming it, never skipped (its
    imports would be missing from the graph and the cells they reach unplanned); one that Python could not import
    either (a link to nothing, or to itself) is left out."""
    package = Path(root) / PACKAGE
    if not (package / "__init__.py").is_file():
        raise InputError(str(root), f"no {PACKAGE}/__init__.py here", hint="Pass a vLLM checkout or a folder holding "
                                                                          "the installed vllm package")
    sources: dict[str, str] = {}
    real_package = os.path.realpath(package)
    top = os.stat(package)
    stack = [(package, PACKAGE, frozenset({(top.st_dev, top.st_ino)}))]
    while stack:
        folder, relative, above = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name, reverse=True)
        except OSError as error:
            raise InputError(str(folder), f"cannot list this folder of the vLLM tree ({error.strerror})",
                             hint="Pass a vLLM tree kvgate can read") from None
        for entry in entries:
            name = f"{relative}/{entry.name}"
            try:
                info = entry.stat()  # follows links
            except OSError as error:
                if entry.is_symlink() and error.errno in (errno.ENOENT, errno.ELOOP):
                    continue  # a link to nothing: Python cannot import it either
                raise InputError(name, f"cannot read this file of the vLLM tree {root} ({error.strerror})",
                                 hint="Pass a vLLM tree kvgate can read") from None
            if stat.S_ISDIR(info.st_mode):
                if entry.name != "__pycache__" and not entry.name.startswith(".") and \
                        (info.st_dev, info.st_ino) not in above:
                    stack.append((Path(entry.path), name, above | {(info.st_dev, info.st_ino)}))
            elif entry.name.endswith(".py"):
                text = _read_source(Path(entry.path), name, info, root)
                real = os.path.realpath(entry.path)
                if os.path.commonpath([real, real_package]) == real_package:
                    text = through_link(text, name, posixpath.join(PACKAGE, *Path(real).relative_to(real_package).parts))
                sources[name] = text
                if len(sources) > MAX_SOURCE_FILES:
                    raise InputError(str(root), f"holds more than {MAX_SOURCE_FILES} vllm/**/*.py files",
                                     hint="Pass a vLLM checkout or a folder holding the installed vllm package")
    return sources


def through_link(text: str, path: str, real: str) -> str:
    """A module's text, with an import of the module of the file it is a link to when that is another module of the
    package (Python runs that file's code as this module: a change to it changes this one)."""
    target = module_of(real)
    if real == path or target is None:
        return text
    return f"{text}\nimport {target}  # kvgate: {path} is a link to {real}\n"


def _read_source(path: Path, name: str, info: os.stat_result, root: Path) -> str:
    """One .py file's text; a FIFO or device (reading it would block or never end), a file past MAX_SOURCE_BYTES or
    one that cannot be read is one error naming it."""
    where = f"the vLLM tree {root}"
    if regular_files.kind(info) is None and info.st_size > MAX_SOURCE_BYTES:
        raise InputError(name, f"is {info.st_size} bytes, more than the {MAX_SOURCE_BYTES} kvgate reads from one source "
                               f"file, in {where}", hint="Pass a clean vLLM checkout")
    try:
        data = regular_files.read_bytes(path, MAX_SOURCE_BYTES, info=info)
    except regular_files.NotRegularFile as error:
        raise InputError(name, f"is not a regular file ({error.kind}) in {where}",
                         hint="Remove it, or pass a clean vLLM checkout") from None
    except regular_files.FileTooLarge:
        raise InputError(name, f"is more than the {MAX_SOURCE_BYTES} bytes kvgate reads from one source file, in {where}",
                         hint="Pass a clean vLLM checkout") from None
    except OSError as error:
        raise InputError(name, f"cannot read this file of {where} ({error.strerror})",
                         hint="Pass a vLLM tree kvgate can read") from None
    return data.decode("utf-8", "replace")


def git_sources(repo: Path, rev: str) -> dict[str, str]:
    """Every vllm/**/*.py of the commit; a symlink (mode 120000, whose blob is its target's path) to a file or a folder
    of the package is read as Python would import it: the target's text (through_link)."""
    listing = _git(repo, "ls-tree", "-r", "-z", "--full-tree", rev, "--", f"{PACKAGE}/")
    entries = [(meta.split(), path) for meta, path in
               (line.split("\t", 1) for line in listing.decode("utf-8", "surrogateescape").split("\0") if line)]
    blobs = [(meta[2], path) for meta, path in entries if meta[1] == "blob" and meta[0] != "120000"
             and path.endswith(".py")]
    sources = dict(zip([path for _, path in blobs], _cat_blobs(repo, [sha for sha, _ in blobs]), strict=True))
    links = [(meta[2], path) for meta, path in entries if meta[0] == "120000"]
    targets = dict(zip([path for _, path in links], _cat_blobs(repo, [sha for sha, _ in links]), strict=True))
    return {**sources, **_through_git_links(sources, targets)}


def _through_git_links(sources: dict[str, str], targets: dict[str, str]) -> dict[str, str]:
    """The modules a commit's symlinks make: link path (or a path under a linked folder) -> the target's text."""
    def resolve(path: str) -> str | None:  # the real path of a path whose folders or self may be links
        for _ in range(40):  # Linux's limit on links followed
            parts, done = path.split("/"), True
            for end in range(len(parts), 0, -1):
                prefix = "/".join(parts[:end])
                if prefix in targets:
                    target = targets[prefix]
                    if target.startswith("/"):
                        return None  # outside the commit: nothing to read
                    path = posixpath.normpath(posixpath.join(posixpath.dirname(prefix), target, *parts[end:]))
                    done = False
                    break
            if done:
                return path
        return None  # a loop of links: Python cannot import it either

    found = {}
    for link in targets:
        real = resolve(link)
        if real is None:
            continue
        if link.endswith(".py") and real in sources:
            found[link] = through_link(sources[real], link, real)
        for path in sources:
            if path.startswith(f"{real}/") and path.endswith(".py"):
                alias = f"{link}{path[len(real):]}"
                if resolve(alias) == path:
                    found.setdefault(alias, through_link(sources[path], alias, path))
    return found


def git_files(repo: Path, rev: str, paths: Iterable[str]) -> dict[str, str | None]:
    paths = list(dict.fromkeys(paths))
    if not paths:
        return {}
    process = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch"], input="".join(
        f"{rev}:{path}\n" for path in paths).encode("utf-8", "surrogateescape"), capture_output=True, check=False)
    if process.returncode != 0:
        raise InputError(f"git cat-file in {repo}", process.stderr.decode("utf-8", "replace").strip() or "failed")
    # the paths the commit has: cat-file says "missing" both for a path the commit lacks and for a blob the clone lacks
    listed = set(_git(repo, "ls-tree", "-r", "-z", "--name-only", "--full-tree", rev).decode(
        "utf-8", "surrogateescape").split("\0"))
    found, data, index = {}, process.stdout, 0
    for path in paths:
        header_end = data.index(b"\n", index)
        header = data[index:header_end].decode("utf-8", "replace")
        index = header_end + 1
        if header.endswith(" missing") or not header.rpartition(" ")[2].isdigit():
            if path in listed:
                # the commit has the file, the clone lacks its blob: read as deleted, it planned no cell
                raise InputError(f"git cat-file in {repo}", f"{path} at {rev} is not in the repository "
                                                            f"({header[:80]})",
                                 hint="Check out the full history (fetch-depth: 0), without a blob filter")
            found[path] = None  # no such path at that commit: deleted there
            continue
        size = int(header.split()[-1])
        found[path] = data[index:index + size].decode("utf-8", "replace")
        index += size + 1
    return found


def _cat_blobs(repo: Path, shas: list[str]) -> list[str]:
    if not shas:
        return []
    process = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch"], input="".join(f"{s}\n" for s in shas)
                             .encode(), capture_output=True, check=False)
    if process.returncode != 0:
        raise InputError(f"git cat-file in {repo}", process.stderr.decode("utf-8", "replace").strip() or "failed")
    texts, data, index = [], process.stdout, 0
    for sha in shas:
        header_end = data.index(b"\n", index)
        header = data[index:header_end].split()
        if len(header) != 3 or not header[2].isdigit():  # "<sha> missing": a shallow, partial or damaged clone
            raise InputError(f"git cat-file in {repo}", f"blob {sha} is not in the repository "
                                                        f"({b' '.join(header).decode('utf-8', 'replace')[:80]})",
                             hint="Check out the full history (fetch-depth: 0), without a blob filter")
        size = int(header[2])
        index = header_end + 1
        texts.append(data[index:index + size].decode("utf-8", "replace"))
        index += size + 1
    return texts


def _git(repo: Path, *args: str) -> bytes:
    try:
        process = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    except OSError as error:
        raise InputError("git", f"cannot run git ({error.strerror})", hint="Install git") from None
    if process.returncode != 0:
        stderr = process.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InputError(f"git {' '.join(args[:2])} in {repo}", stderr[-1] if stderr else "failed",
                         hint="Check out both commits (fetch-depth: 0)")
    return process.stdout


def installed_vllm_root() -> Path | None:
    """The folder that holds this Python's `vllm` package, without importing it; None when there is none."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent.parent
