"""Spreading kernel tests over the visible GPUs with pytest-xdist. Stdlib only.

Knob: ``kvgate kernels --gpus N`` (or ``KVGATE_KERNEL_WORKERS=N``) runs pytest with ``-n N``. Each xdist
worker (``PYTEST_XDIST_WORKER=gw<i>``) then pins itself to one GPU before torch initialises CUDA:
tests/kernels/conftest.py sets ``CUDA_VISIBLE_DEVICES`` to the i-th visible device (round robin when
there are more workers than GPUs). ``--gpus 0`` / unset runs in one process on the first GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

WORKERS_ENV = "KVGATE_KERNEL_WORKERS"
PINNED_ENV = "KVGATE_PINNED_GPU"


def worker_index(worker_id: str | None) -> int | None:
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(match.group(1)) if match else None


def visible_devices(environ: dict[str, str] | None = None) -> list[str]:
    """CUDA_VISIBLE_DEVICES as a list when set, else one entry per GPU nvidia-smi lists."""
    environ = os.environ if environ is None else environ
    if environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(line for line in out.splitlines() if line.startswith("GPU "))]


def device_for_worker(worker_id: str | None, devices: list[str]) -> str | None:
    """The device a worker pins to; None when not an xdist worker or no GPU is visible."""
    index = worker_index(worker_id)
    if index is None or not devices:
        return None
    return devices[index % len(devices)]


def pin_this_worker(environ: dict[str, str] | None = None) -> str | None:
    """Set CUDA_VISIBLE_DEVICES for this xdist worker (once); returns the device pinned, if any."""
    environ = os.environ if environ is None else environ
    if environ.get(PINNED_ENV):
        return environ[PINNED_ENV]
    device = device_for_worker(environ.get("PYTEST_XDIST_WORKER"), visible_devices(environ))
    if device is not None:
        environ["CUDA_VISIBLE_DEVICES"] = device
        environ[PINNED_ENV] = device
    return device


def workers_from_env(default: int = 0) -> int:
    raw = os.environ.get(WORKERS_ENV, "").strip()
    return int(raw) if raw.isdigit() else default
