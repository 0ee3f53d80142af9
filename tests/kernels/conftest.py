"""Kernel-test configuration: GPU pinning per xdist worker, cell selection, figures into JUnit.

Options:
  --kvgate-cell ID           run only the kernel tests of that matrix cell (kvgate kernels passes it)
  --kvgate-timings-dir DIR   also write each speed test's entry to DIR/<worker>.entries.json
                             (kvgate kernels merges them into <cell>/kernels/timings.json)
Each kernel test carries ``@pytest.mark.kvgate_kernel(family=..., kv=...)``; a cell selects the tests
of its families and its kv dtype (fp8 and fp8_e4m3 both select the e4m3 tests).
"""

from __future__ import annotations

import os

from kvgate.kernels import gpus

gpus.pin_this_worker()  # before anything initialises CUDA in this xdist worker

import pytest  # noqa: E402

from kvgate.kernels.families import ARCH_FAMILIES, STORAGE_KIND, kernels_for_cell  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvgate")
    group.addoption("--kvgate-cell", default=None, metavar="ID", help="run only this matrix cell's kernel tests")
    group.addoption("--kvgate-timings-dir", default=None, metavar="DIR",
                    help="write speed-test entries here (merged into timings.json by kvgate kernels)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kvgate_kernel(family, kv): a decode-kernel test of one family and kv dtype")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cell_id = config.getoption("--kvgate-cell")
    if not cell_id:
        return
    from kvgate.matrix import cells as matrix

    cell = matrix.load().cell(cell_id)
    plan = kernels_for_cell(cell.backend, cell.kv_cache_dtype, cell.arch, cell.mla)
    wanted = {family.name for family in plan.families}
    storage = STORAGE_KIND[cell.kv_cache_dtype]
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("kvgate_kernel")
        if marker and marker.kwargs["family"] in wanted and marker.kwargs["kv"] == storage:
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def record_figures(request: pytest.FixtureRequest, record_property):
    """record(name, value): a JUnit property when the JUnit family keeps them (xunit1), always printed."""
    keeps_properties = request.config.getini("junit_family") in ("xunit1", "legacy")

    def record(name: str, value) -> None:
        print(f"{name}={value}")
        if keeps_properties:
            record_property(name, value)

    return record


@pytest.fixture(scope="session")
def timings_dir(request: pytest.FixtureRequest) -> str | None:
    return request.config.getoption("--kvgate-timings-dir")


@pytest.fixture(scope="session")
def worker_id_or_main() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


__all__ = ["ARCH_FAMILIES"]
