"""Shared test configuration. GPU tests skip with a reason where no CUDA device is visible."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
