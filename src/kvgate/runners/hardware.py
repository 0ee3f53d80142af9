"""Which arch this machine is, as a matrix arch name (sm90, cpu, ...). Stdlib only."""

from __future__ import annotations

import os
import shutil
import subprocess

ARCH_ENV = "KVGATE_ARCH"


def compute_capability_to_arch(capability: str) -> str:
    """'9.0' -> 'sm90', '10.0' -> 'sm100', '12.1' -> 'sm120' (the family, as the matrix names it)."""
    major, _, minor = capability.strip().partition(".")
    if int(major) >= 10:  # Blackwell families: sm100/sm103/sm107 -> sm100, sm120/sm121 -> sm120
        return f"sm{major}0"
    return f"sm{major}{minor or '0'}"


def local_arch() -> str:
    """$KVGATE_ARCH if set, else the first visible GPU's arch from nvidia-smi, else 'cpu'."""
    forced = os.environ.get(ARCH_ENV)
    if forced:
        return forced
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    lines = [line for line in out.splitlines() if line.strip()]
    return compute_capability_to_arch(lines[0]) if lines else "cpu"
