"""vLLM's Python sources as the import graph needs them, read from where a run or a plan has them (I/O).

    folder_sources(root)        every vllm/**/*.py under `root` (a vLLM checkout, or a folder holding the installed
                                `vllm` package, e.g. site-packages or an overlay)
    git_sources(repo, rev)      every vllm/**/*.py of a commit of a vLLM git checkout (git ls-tree + cat-file)
    git_files(repo, rev, paths) those paths' text at a commit (None where the commit has no such file)
    installed_vllm_root()       the folder holding this Python's `vllm` package (found, never imported)

Nothing is imported or executed. A tree of thousands of files is read in well under a second by git, a few
seconds from a folder.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from kvgate import InputError
from kvgate.change.import_graph import PACKAGE


def folder_sources(root: Path) -> dict[str, str]:
    package = Path(root) / PACKAGE
    if not (package / "__init__.py").is_file():
        raise InputError(str(root), f"no {PACKAGE}/__init__.py here", hint="Pass a vLLM checkout or a folder holding "
                                                                          "the installed vllm package")
    sources = {}
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                try:
                    sources[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
    return sources


def git_sources(repo: Path, rev: str) -> dict[str, str]:
    listing = _git(repo, "ls-tree", "-r", "-z", "--full-tree", rev, "--", f"{PACKAGE}/")
    entries = [line.split("\t", 1) for line in listing.decode("utf-8", "surrogateescape").split("\0") if line]
    blobs = [(meta.split()[2], path) for meta, path in entries if meta.split()[1] == "blob" and path.endswith(".py")]
    return dict(zip([path for _, path in blobs], _cat_blobs(repo, [sha for sha, _ in blobs]), strict=True))


def git_files(repo: Path, rev: str, paths: Iterable[str]) -> dict[str, str | None]:
    paths = list(dict.fromkeys(paths))
    if not paths:
        return {}
    process = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch"], input="".join(
        f"{rev}:{path}\n" for path in paths).encode("utf-8", "surrogateescape"), capture_output=True, check=False)
    if process.returncode != 0:
        raise InputError(f"git cat-file in {repo}", process.stderr.decode("utf-8", "replace").strip() or "failed")
    found, data, index = {}, process.stdout, 0
    for path in paths:
        header_end = data.index(b"\n", index)
        header = data[index:header_end].decode("utf-8", "replace")
        index = header_end + 1
        if header.endswith(" missing"):
            found[path] = None
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
    for _ in shas:
        header_end = data.index(b"\n", index)
        size = int(data[index:header_end].split()[-1])
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
