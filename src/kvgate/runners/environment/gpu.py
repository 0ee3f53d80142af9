"""This machine's GPU, as kvgate needs to know it. Stdlib only: the noxfile imports it before anything is installed.

    local_arch()        the matrix arch (sm90, cpu, ...) of the first GPU this process may use
    visible_gpu_count() how many GPUs this process may use (a cell of tensor parallel 2 needs 2)
    check_gpu_driver()  refuse, with one line, a driver too old for kvgate's CUDA 13 engine

CUDA_VISIBLE_DEVICES is honoured the way CUDA reads it: a comma-separated list of GPU indices or UUIDs
(`GPU-...`, `MIG-...`); the first entry is the GPU device 0 of the engine; set but empty hides every GPU.
nvidia-smi ignores the variable, so kvgate asks it about that one device (`nvidia-smi -i <entry>`). An index
means CUDA's order, which is nvidia-smi's (PCI bus) order only with CUDA_DEVICE_ORDER=PCI_BUS_ID: on a host
with GPUs of different archs, name GPUs by UUID or set that variable.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from kvgate import InputError

ARCH_ENV = "KVGATE_ARCH"
VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"

# kvgate's GPU engine is built for CUDA 13.0: torch 2.11.0+cu130 and vLLM 0.26.0, whose _C links
# libcudart.so.13 (docs/facts/h200.md#the-gpu-engine-needs-cuda-13). CUDA 13.0 runs on NVIDIA drivers of branch 580
# and newer.
GPU_ENGINE = "torch 2.11.0+cu130"
GPU_ENGINE_CUDA = "13.0"
MIN_DRIVER_MAJOR = 580
PROC_DRIVER_VERSION = Path("/proc/driver/nvidia/version")  # "NVRM version: NVIDIA UNIX ... Kernel Module  580.159.04 ..."
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


def visible_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES's entries when set (up to a -1, which hides the rest, as CUDA
    reads it), else every GPU nvidia-smi lists; 0 without either."""
    environ = os.environ if environ is None else environ
    value = environ.get(VISIBLE_DEVICES_ENV)
    if value is not None:
        entries = []
        for entry in (part.strip() for part in value.split(",")):
            if not entry or entry == "-1":
                break
            entries.append(entry)
        return len(entries)
    return len(_query_gpus("uuid", None))


def driver_version(environ: Mapping[str, str] | None = None) -> str | None:
    """The NVIDIA driver version ("580.159.04") from nvidia-smi, else from the kernel module; None if neither says."""
    environ = os.environ if environ is None else environ
    device = first_visible_device(environ)
    versions = _query_gpus("driver_version", device or None) or _query_gpus("driver_version", None)
    if versions:
        return versions[0]
    try:
        text = PROC_DRIVER_VERSION.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match[1] if match else None


def driver_problem(version: str) -> InputError | None:
    """Why this driver cannot run kvgate's GPU engine; None when it can. Pure."""
    major = re.match(r"\s*(\d+)", version)
    if major is not None and int(major[1]) >= MIN_DRIVER_MAJOR:
        return None
    return InputError(
        f"nvidia driver {version}",
        f"kvgate's GPU engine ({GPU_ENGINE}, CUDA {GPU_ENGINE_CUDA}) needs >= {MIN_DRIVER_MAJOR}",
        hint=f"Upgrade the runner's NVIDIA driver to the {MIN_DRIVER_MAJOR} branch or newer (`nvidia-smi` shows "
             f"the version), or run the GPU cells on a runner that has it")


def check_gpu_driver(environ: Mapping[str, str] | None = None) -> str | None:
    """Raise InputError when the driver is too old for the GPU engine; return a warning when it cannot be read."""
    version = driver_version(environ)
    if version is None:
        return (f"cannot read the NVIDIA driver version (no nvidia-smi answer, no {PROC_DRIVER_VERSION}); "
                f"kvgate's GPU engine ({GPU_ENGINE}) needs a driver >= {MIN_DRIVER_MAJOR}")
    problem = driver_problem(version)
    if problem is not None:
        raise problem
    return None


def check_gpu_driver_for(archs: Iterable[str], local: str, environ: Mapping[str, str] | None = None) -> str | None:
    """check_gpu_driver() when any of `archs` is this machine's GPU arch (its cells will run here), else nothing."""
    if local == "cpu" or local not in set(archs):
        return None
    return check_gpu_driver(environ)


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
