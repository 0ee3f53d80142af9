"""`kvgate kernels`: run the decode-kernel tests of the selected cells into a results folder.

    kvgate kernels --run-dir DIR [--cell ID ...] [--arch A] [--backend B] [--kv-cache-dtype D]
                   [--arch-default ARCH] [--gpus N] [--vllm SPEC [--base-vllm SPEC]] [pytest args ...]

Without filters it selects the cells of --arch-default (the noxfile passes this machine's arch). Each
cell's JUnit lands in <run dir>/<cell id>/kernels/junit.xml, its timings in kernels/timings.json
(kvgate.kernels.runner). Unknown flags go to pytest. Exit status 1 when any cell's kernels stage
errored or timed out, 0 otherwise (skipped cells included). With --vllm the tests import the vLLM under
test (kvgate.change.spec); with --base-vllm too, each cell runs once per side (A/B folders).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvgate import EXIT_FAILED, EXIT_OK, InputError
from kvgate.change.sides import add_vllm_arguments, prepare_sides
from kvgate.cli.matrix_command import add_filter_arguments, no_cell_error_for, selected_cells
from kvgate.kernels import gpus, runner
from kvgate.results.records import SIDES
from kvgate.runners.environment import gpu
from kvgate.runners.environment.cpu import RUNNER_LABEL_ENV, misrouted_reason, plan_or_refuse

HELP = "run the decode-kernel tests (FP8 and bf16 KV vs a PyTorch reference) of the selected cells"
PASSES_THROUGH = True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, required=True, help="the results folder (one subfolder per cell)")
    add_filter_arguments(parser)
    parser.add_argument("--arch-default", default=None, metavar="ARCH",
                        help="with no --cell/--arch/--backend/--kv-cache-dtype filter, select this arch's cells "
                             "(default: this machine's)")
    parser.add_argument("--gpus", type=int, default=None, metavar="N",
                        help=f"pytest-xdist workers, one GPU each (default ${gpus.WORKERS_ENV} or 0: one process)")
    parser.add_argument("--timeout", type=float, default=runner.DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="per cell")
    add_vllm_arguments(parser)
    parser.add_argument("--side", choices=SIDES, default=None,
                        help="write the cell as this side of an A/B run (`kvgate run` passes it; the vLLM of "
                             "that side comes with the environment)")


def run(args: argparse.Namespace) -> int:
    local_arch = gpu.local_arch()
    if not (args.cell or args.arch or args.backend or args.kv_cache_dtype):
        args.arch = [args.arch_default or local_arch]
    matrix, cells, _ = selected_cells(args)
    if not cells:
        raise no_cell_error_for("kvgate kernels", matrix, args)
    if not runner.TESTS_DIR.is_dir():
        raise InputError("kvgate kernels", f"the kernel tests are missing ({runner.TESTS_DIR})",
                         hint="Run kvgate from a checkout of its repository")
    workers = args.gpus if args.gpus is not None else gpus.workers_from_env()
    if workers < 0:
        raise InputError("kvgate kernels", f"--gpus must be 0 or more, got {workers}")
    if args.side is not None and (args.vllm or args.base_vllm):
        raise InputError("kvgate kernels", "--side comes with the environment of that side's vLLM",
                         hint="Pass either --side or --vllm/--base-vllm")
    plan = plan_or_refuse(cells, local_arch, "kvgate kernels")
    for line in plan.start_lines(len(cells)):
        print(line, flush=True)
    label = os.environ.get(RUNNER_LABEL_ENV, "")
    refused = {p.cell.id: misrouted_reason(p, label) for p in plan.planned_out} if label else {}
    warning = gpu.check_gpu_driver_for([cell.arch for cell in cells], local_arch)  # before any GPU test runs
    if warning:
        print(f"kvgate: WARNING {warning}", file=sys.stderr, flush=True)
    sides = prepare_sides(args.vllm, args.base_vllm)
    failed = False
    runnable = list(plan.runnable) + [p.cell for p in plan.planned_out if p.cell.id in refused]
    runs = [(cell, side) for cell in runnable for side in sides]
    for cell, side in runs:
        name = args.side or (side.name if side.ab else None)
        env = side.vllm.environment(os.environ) if side.vllm is not None else None
        if cell.id in refused:  # CI sent it here: an error of the cell, never a pass without it
            outcome = runner.refuse_cell(cell, args.run_dir, refused[cell.id], side=name)
        else:
            outcome = runner.run_cell(cell, args.run_dir, local_arch=local_arch, workers=workers,
                                      pytest_args=args.passthrough, timeout_s=args.timeout, side=name, env=env)
        counts = outcome.counts
        figures = (f" ({counts.passed} passed, {counts.failures + counts.errors} failed, {counts.skipped} skipped"
                   f", {outcome.seconds:.0f} s)") if counts.tests else ""
        shown = cell.id if name is None else f"{cell.id} ({name})"
        print(f"{shown}: {outcome.status}{figures}" + (f" - {outcome.reason}" if outcome.reason else ""))
        failed |= outcome.status in ("error", "timeout")
    print(f"kvgate kernels: {len(runnable)} cells under {args.run_dir}", file=sys.stderr)
    for line in ([] if refused else plan.end_lines()):
        print(line, flush=True)
    return EXIT_FAILED if failed else EXIT_OK
