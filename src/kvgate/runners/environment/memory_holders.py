"""Which other processes hold memory on the GPU an engine starts on, as nvidia-smi lists them. Stdlib only.

An engine start that found too little free memory for its KV cache (kvgate.runners.engine.infrastructure) is the
machine's failure when something else holds the GPU; the stage's error then names what did, where nvidia-smi can say.

    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits [-i <device>]
    12345, /usr/bin/python3, 81920
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping

from kvgate.runners.environment.gpu import SMI_TIMEOUT_S, first_visible_device

QUERY = "--query-compute-apps=pid,process_name,used_memory"


def parse_compute_apps(text: str) -> list[str]:
    """nvidia-smi's CSV (no header, no units: MiB) -> "pid 12345 (python3, 80.0 GiB)" per process."""
    found = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        name = fields[1].rsplit("/", 1)[-1][:60] or "?"
        try:
            memory = f", {float(fields[2]) / 1024:.1f} GiB"
        except ValueError:
            memory = ""
        found.append(f"pid {fields[0]} ({name}{memory})")
    return found


def other_gpu_processes(environ: Mapping[str, str] | None = None,
                        run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str | None:
    """The processes on the engine's GPU (its first visible device) in words, "none" when nvidia-smi lists none;
    None when it cannot be known (no nvidia-smi: a CPU host, or no answer)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    device = first_visible_device(os.environ if environ is None else environ)
    argv = [smi, QUERY, "--format=csv,noheader,nounits", *(["-i", device] if device else [])]
    try:
        out = run(argv, capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    listed = parse_compute_apps(out)
    return "; ".join(listed) if listed else "none"
