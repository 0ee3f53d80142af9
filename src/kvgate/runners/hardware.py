"""This machine's GPU, as kvgate needs to know it. Stdlib only: the noxfile imports it before anything is installed.

    local_arch()        the matrix arch (sm90, cpu, ...) of the first GPU this process may use

CUDA_VISIBLE_DEVICES is honoured the way CUDA reads it: a comma-separated list of GPU indices or UUIDs
(`GPU-...`, `MIG-...`); the first entry is the GPU device 0 of the engine; set but empty hides every GPU.
nvidia-smi ignores the variable, so kvgate asks it about that one device (`nvidia-smi -i <entry>`). An index
means CUDA's order, which is nvidia-smi's (PCI bus) order only with CUDA_DEVICE_ORDER=PCI_BUS_ID: on a host
with GPUs of different archs, name GPUs by UUID or set that variable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

ARCH_ENV = "KVGATE_ARCH"
VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"

SMI_TIMEOUT_S = 30


def compute_capability_to_arch(capability: str) -> str:
    """'9.0' -> 'sm90', '10.0' -> 'sm100', '12.1' -> 'sm120' (the family, as the matrix names it)."""
    major, _, minor = capability.strip().partition(".")
    if int(major) >= 10:  # Blackwell families: sm100/sm103/sm107 -> sm100, sm120/sm121 -> sm120
        return f"sm{major}0"
    return f"sm{major}{minor or '0'}"


def first_visible_device(environ: Mapping[str, str]) -> str | None:
    """The first entry of CUDA_VISIBLE_DEVICES; None when unset (every GPU is visible), "" when it hides all."""
    value = environ.get(VISIBLE_DEVICES_ENV)
    if value is None:
        return None
    return value.split(",")[0].strip()


def local_arch(environ: Mapping[str, str] | None = None) -> str:
    """$KVGATE_ARCH if set, else the arch of the first GPU this process may use (nvidia-smi), else 'cpu'."""
    environ = os.environ if environ is None else environ
    forced = environ.get(ARCH_ENV)
    if forced:
        return forced
    device = first_visible_device(environ)
    if device == "" or device == "-1":  # CUDA sees no GPU, so neither does the engine
        return "cpu"
    capabilities = _query_gpus("compute_cap", device)
    if not capabilities and device is not None:
        # A device nvidia-smi cannot name (e.g. some MIG UUID forms): on a host whose GPUs are all of one kind,
        # which one it is does not matter.
        every = _query_gpus("compute_cap", None)
        capabilities = every[:1] if len(set(every)) == 1 else []
    return compute_capability_to_arch(capabilities[0]) if capabilities else "cpu"


def _query_gpus(field: str, device: str | None) -> list[str]:
    """One value per GPU (or of `device` alone) from `nvidia-smi --query-gpu`; [] when it cannot answer."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    argv = [smi, f"--query-gpu={field}", "--format=csv,noheader"]
    if device is not None:
        argv += ["-i", device]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]
