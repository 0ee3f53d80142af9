"""Which stages the plan asks of a cell: every stage it can run, and for the others the reason.

A stage planned is a stage required: the gate fails one that ends skipped, error, timeout or absent, unless a
waiver names it. So the plan never plans a stage a cell cannot run: a cell whose backend has no kernel family
here (kvgate.kernels.families: CUTLASS_MLA's kernel ships only in a CUDA build and runs on SM100 only, for one)
has no kernels stage, and the reason travels with the plan (run.json `not_planned`, the CI plan's entries) so
the report can say it.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.kernels.families import kernels_for_cell
from kvgate.matrix.cells import Cell

STAGES = ("kernels", "accuracy", "throughput")  # in the order `kvgate run cell` runs them


def planned_stages(cell: Cell, asked: Sequence[str] = STAGES) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the stages of `asked` the cell can run, {stage: why not} for the rest)."""
    not_planned: dict[str, str] = {}
    if "kernels" in asked:
        kernels = kernels_for_cell(cell.backend, cell.kv_cache_dtype, cell.arch, cell.mla)
        if kernels.skip_reason is not None:
            not_planned["kernels"] = f"no kernels stage planned: {kernels.skip_reason}"
    return tuple(stage for stage in asked if stage not in not_planned), not_planned
