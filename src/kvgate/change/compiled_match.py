"""Whose compiled kernels a `source:` change may run over (I/O: git).

The change's Python files are overlaid on an installed vLLM; that is only a test of the change where that vLLM was
built from the same compiled and build sources (csrc/, CMake, setup.py) as the commit the change is counted from:
the installed release's tag must hold BASE's compiled sources, or the foundation must be vLLM's own wheel of BASE.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from kvgate import InputError
from kvgate.change.patch import classify

SHOWN_LIMIT = 6  # paths named in one error line


def git(checkout: Path, *args: str, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=text, check=False)


PER_COMMIT_WHEELS = "https://wheels.vllm.ai/<commit>"  # vLLM's per-commit wheels (its installation docs)


def compiled_parts_match(checkout: Path, shown: str, base: str, base_commit: str, release_version: str) -> str:
    """Why the change's Python may run over the installed release's compiled kernels: the release's tag and BASE hold
    the same compiled and build sources (csrc/, CMake, setup.py, ...). Otherwise, or when that cannot be checked,
    an InputError: BASE's Python over another commit's kernels would test neither; a wheel of each side can."""
    tag = f"v{release_version}"
    fix = (f"Pass the two sides as wheels instead (wheel:PATH; vLLM publishes one per commit at {PER_COMMIT_WHEELS}), "
           f"or source:PATH@{tag}")
    resolved = git(checkout, "rev-parse", "--verify", "--quiet", f"{tag}^{{commit}}")
    if resolved.returncode != 0:
        raise InputError(shown, f"has no tag {tag} (the installed release) to hold {base}'s compiled sources against",
                         hint=f"Fetch it (git fetch origin tag {tag}). {fix}")
    if resolved.stdout.strip() == base_commit:
        return f"the change is counted from {tag}, the release whose compiled kernels it runs over"
    diff = git(checkout, "diff", "-z", "--name-only", "--no-ext-diff", resolved.stdout.strip(), base_commit,
                text=False)
    if diff.returncode != 0:
        raise InputError(shown, f"git diff {tag} {base} failed: {diff.stderr.decode(errors='replace').strip()[:200]}")
    built = [p for p in diff.stdout.decode("utf-8", "surrogateescape").split("\0") if p and classify(p) == "build"]
    if built:
        listed = ", ".join(built[:SHOWN_LIMIT]) + (f" (+{len(built) - SHOWN_LIMIT} more)" if len(built) > SHOWN_LIMIT
                                                   else "")
        raise InputError(shown, f"{base} is not built like the installed release {tag}: {len(built)} compiled or "
                                f"build source(s) differ ({listed}), so its Python over {tag}'s kernels would test "
                                f"neither", hint=fix)
    return (f"{base} ({base_commit[:12]}) and {tag}, the release whose compiled kernels the change runs over, hold "
            f"the same compiled and build sources (csrc/, CMake, setup.py; checked with git)")


_GIT_LOCAL = re.compile(r"\+g?([0-9a-f]{7,40})(?:\.|$)")


def wheel_is_base(wheel_version: str, shown: str, base: str, base_commit: str) -> str:
    """The source change goes over the base side's wheel: that wheel must be vLLM's build of BASE (its version's
    local part names the commit, as vLLM's per-commit wheels do: 0.11.1.dev45+g1234567)."""
    found = _GIT_LOCAL.search(wheel_version)
    if found is None or not base_commit.startswith(found.group(1)):
        built = f"a build of {found.group(1)}" if found else "of no commit its version names"
        raise InputError(shown, f"its Python changes would go over the base side's wheel {wheel_version}, which is "
                                f"{built}, not of {base} ({base_commit[:12]})",
                         hint="Give the base side vLLM's per-commit wheel of BASE, or both sides as wheels")
    return (f"the change's Python since {base} ({base_commit[:12]}) over the base side's wheel {wheel_version}, vLLM's "
            f"build of that commit: the same compiled kernels on both sides")


def release_drift(checkout: Path, base_commit: str, package_dir: Path) -> list[str]:
    """Python files of the installed release whose content is not BASE's (git blob ids compared)."""
    tree = git(checkout, "ls-tree", "-r", "-z", base_commit, "--", "vllm", text=False)
    if tree.returncode != 0:
        return []
    blobs = {}
    for entry in tree.stdout.decode("utf-8", "surrogateescape").split("\0"):
        meta, _, name = entry.partition("\t")
        if name.endswith(".py"):
            blobs[name] = meta.split()[-1] if meta else ""
    drift = []
    for name, blob in sorted(blobs.items()):
        if name.endswith("_version.py"):
            continue  # generated at build time
        path = package_dir.parent / name
        try:
            data = path.read_bytes()
        except OSError:
            drift.append(name)
            continue
        if hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() != blob:
            drift.append(name)
    return drift
