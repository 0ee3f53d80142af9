"""The changed paths of a vLLM change and the code of its two sides, read from where the change is (I/O).

    from_git(repo, base, head, changed)     a vLLM pull request: the base commit's tree from git, the head's by
                                            changing the changed files (both sides of renames, as git lists them)
    from_spec(spec)                         `--vllm` spec against the installed release: the release's tree is the
                                            base; the overlay (patch, source checkout, wheel) is the head
    from_folder(folder, changed)            listed paths over one tree (a checkout, or a folder holding the
                                            installed vllm package): both sides are that tree
Each returns (changed paths, base code, head code); code is None where no vLLM source is at hand, and the
selection then says it plans every cell for the package's modules.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvgate import InputError
from kvgate.change.import_graph import module_of
from kvgate.change.selection import VllmCode, code_from_sources, code_with_changes
from kvgate.change.vllm_tree import folder_sources, git_files, git_sources, installed_vllm_root
from kvgate.matrix.cells import Matrix

if TYPE_CHECKING:
    from kvgate.change.overlay import Release

Sides = tuple[list[str], VllmCode | None, VllmCode | None]


def from_git(repo: Path, base: str, head: str, changed: Sequence[str] | None, matrix: Matrix) -> Sides:
    for flag, rev in (("--vllm-base", base), ("--vllm-head", head)):
        if not rev or rev.startswith("-"):
            raise InputError(flag, f"{rev!r} is not a git revision", hint="Pass a commit SHA, a branch or a tag")
    # each side is a commit, read at its SHA: `HEAD:vllm` (a tree) diffed as one and found no file at `<tree>:vllm/...`
    base, head = _commit(repo, "--vllm-base", base), _commit(repo, "--vllm-head", head)
    paths = list(changed) if changed is not None else git_changed_paths(repo, base, head)
    base_sources = git_sources(repo, base)
    base_code = code_from_sources(base_sources, matrix)
    modules = [p for p in paths if module_of(p) is not None]
    head_code = code_with_changes(base_code, base_sources, git_files(repo, head, modules), matrix)
    return paths, base_code, head_code


def _commit(repo: Path, flag: str, rev: str) -> str:
    try:
        process = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "--end-of-options",
                                  f"{rev}^{{commit}}"], capture_output=True, check=False)
    except OSError as error:
        raise InputError("git", f"cannot run git ({error.strerror})", hint="Install git") from None
    if process.returncode != 0:
        raise InputError(flag, f"{rev!r} is not a commit of the git checkout {repo}",
                         hint="Pass a commit SHA, a branch or a tag, and check out both commits (fetch-depth: 0)")
    return process.stdout.decode().strip()


def git_changed_paths(repo: Path, base: str, head: str) -> list[str]:
    """Every path that differs between base and head, both sides of renames and copies."""
    try:
        process = subprocess.run(["git", "-C", str(repo), "-c", "core.quotePath=false", "diff", "-z", "--name-status",
                                  "-M", "-C", "--no-ext-diff", "--no-textconv", base, head, "--"],
                                 capture_output=True, check=False)
    except OSError as error:
        raise InputError("git", f"cannot run git ({error.strerror})", hint="Install git") from None
    if process.returncode != 0:
        stderr = process.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InputError(f"git diff {base} {head} in {repo}", stderr[-1] if stderr else "failed",
                         hint="Check out both commits (fetch-depth: 0)")
    fields = process.stdout.decode("utf-8", "surrogateescape").split("\0")
    paths, index = [], 0
    while index < len(fields) and fields[index]:
        count = 2 if fields[index][:1] in ("R", "C") else 1
        paths += fields[index + 1:index + 1 + count]
        index += 1 + count
    return list(dict.fromkeys(paths))


def from_spec(spec_text: str, matrix: Matrix, release: Release | None = None) -> Sides:
    """`release`: the release the spec changes (default: this Python's installed vLLM)."""
    from kvgate.change.overlay import installed_release, prepare
    from kvgate.change.spec import parse_spec

    release = release if release is not None else installed_release()
    prepared = prepare(parse_spec(spec_text, "--changed-by-vllm"), release)
    paths = list(prepared.changed_paths)
    base_sources = folder_sources(release.package_dir.parent)
    base_code = code_from_sources(base_sources, matrix)
    if prepared.overlay is None:
        return paths, base_code, base_code
    files = {}
    for path in paths:
        if module_of(path) is None:
            continue
        candidate = prepared.overlay / path
        files[path] = candidate.read_text(encoding="utf-8", errors="replace") if candidate.is_file() else None
    return paths, base_code, code_with_changes(base_code, base_sources, files, matrix)


def from_folder(folder: Path | None, changed: Sequence[str], matrix: Matrix) -> Sides:
    root = folder if folder is not None else installed_vllm_root()
    if root is None:
        return list(changed), None, None
    code = code_from_sources(folder_sources(root), matrix)
    return list(changed), code, code
