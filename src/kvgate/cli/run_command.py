"""`kvgate run accuracy|throughput|cell`: run the real tools (lm-eval + vLLM, `vllm bench throughput`,
the kernel tests) for the selected cells and write the results folder (docs/results-folder.md).

    kvgate run accuracy --run-dir reports/runs/x --arch-default cpu -- --limit 250
    kvgate run throughput --run-dir reports/runs/x --backend CPU_ATTN
    kvgate run cell --cell cpu_attn-fp8-cpu --run-dir reports/runs/x [--stages kernels,accuracy]
    kvgate run accuracy --run-dir reports/runs/x --vllm patch:fix.diff --base-vllm release   (A/B)

Without filters the cells of --arch-default run (the noxfile passes this machine's arch). Flags kvgate does
not know go to lm_eval (accuracy) or `vllm bench throughput` (throughput).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvgate import InputError
from kvgate.change.sides import add_vllm_arguments, prepare_sides
from kvgate.cli.matrix_command import add_filter_arguments
from kvgate.matrix.cells import load as load_matrix
from kvgate.runners.environment import gpu
from kvgate.runners.environment.cpu import plan_or_refuse

HELP = "run lm-eval gsm8k (+ probe), vllm bench throughput or every stage of cells into a results folder"
PASSES_THROUGH = True
WHATS = ("accuracy", "throughput", "cell")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=WHATS,
                        help="accuracy: gsm8k via lm-eval's vllm model + the logprob probe; throughput: vllm "
                             "bench throughput repeats; cell: every stage (see --stages)")
    parser.add_argument("--run-dir", type=Path, required=True, help="the results folder (created if absent)")
    parser.add_argument("--arch-default", default=None,
                        help="arch whose cells run when no filter is given (default: this machine's)")
    add_filter_arguments(parser)
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="per stage of a cell; the stage's process group is killed after it (default: the "
                             "cell's workload's, matrix/workloads.toml `timeouts`; 3600 where it declares none)")
    parser.add_argument("--stages", default=None,
                        help="for `run cell`: comma-separated, of kernels,accuracy,throughput (default: all)")
    parser.add_argument("--powered", action="store_true",
                        help="a reference run (a baseline, the base side --base-from reuses): every cell answers "
                             "the policy's questions for a comparison in full, with no base side too, and none "
                             "stops early")
    parser.add_argument("--base-from", type=Path, default=None, metavar="RUN_DIR",
                        help="an A/B run: reuse the base side of this earlier A/B run on this machine (same "
                             "--base-vllm, every stage ok) instead of running it again; accuracy and kernels only")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="CPU accuracy engines side by side, each on cores of its own (default 1: one at a time; "
                             "on 2 cores, 2 measured no faster cold); GPU cells, throughput and kernels always "
                             "run one at a time")
    parser.add_argument("--allow-shared-gpu", action="store_true",
                        help="time throughput on a GPU that other processes already use (by default a throughput "
                             "engine refuses such a GPU, and a repeat that another process shared is measured once "
                             "more, then the stage's infrastructure error): its figures are then not evidence")
    add_vllm_arguments(parser)


def _stages(args: argparse.Namespace) -> list[str]:
    from kvgate.runners.stage_plan import STAGES

    if args.what != "cell":
        if args.stages is not None:
            raise InputError("--stages", "only `kvgate run cell` takes --stages",
                             hint=f"`kvgate run {args.what}` runs the {args.what} stage")
        return [args.what]
    if args.stages is None:
        return list(STAGES)
    names = [name.strip() for name in args.stages.split(",") if name.strip()]
    for name in names:
        if name not in STAGES:
            from kvgate import unknown_name_hint

            raise InputError("--stages", f"unknown stage '{name}'", hint=unknown_name_hint(name, STAGES))
    if not names:
        raise InputError("--stages", "no stage named", hint=f"Name some of {', '.join(STAGES)}")
    return [stage for stage in STAGES if stage in names]


def _program() -> str:
    name = Path(sys.argv[0]).name
    return f"{Path(sys.executable).name} -m kvgate" if name == "__main__.py" else name


def run(args: argparse.Namespace) -> int:
    stages = _stages(args)
    passthrough = list(args.passthrough)
    if passthrough[:1] == ["--"]:
        passthrough = passthrough[1:]
    if args.what == "cell":
        if not args.cell:
            raise InputError("kvgate run cell", "no cell named", hint="Pass --cell ID (see `kvgate matrix`)")
        if passthrough:
            raise InputError("kvgate run cell", f"unrecognized arguments: {' '.join(passthrough)}",
                             hint="Pass-through flags go to one tool: use `kvgate run accuracy` (lm_eval) or "
                                  "`kvgate run throughput` (vllm bench throughput)")
    if args.timeout is not None and args.timeout <= 0:
        raise InputError("--timeout", f"expected a positive number of seconds, got {args.timeout:g}")
    matrix = load_matrix(args.matrix_dir)
    filtered = bool(args.arch or args.backend or args.kv_cache_dtype or args.cell)
    local_arch = gpu.local_arch()
    arch_default = args.arch_default or local_arch
    archs = list(args.arch) if filtered else [arch_default]
    if not filtered and arch_default not in matrix.archs:
        from kvgate import unknown_name_hint

        raise InputError("--arch-default", f"unknown arch '{arch_default}'",
                         hint=unknown_name_hint(arch_default, matrix.archs))
    cells = matrix.select(archs=archs, backends=args.backend, kv_cache_dtypes=args.kv_cache_dtype,
                          cell_ids=args.cell)
    if not cells:
        from kvgate.cli.matrix_command import no_cell_error

        raise no_cell_error(f"kvgate run {args.what}", matrix, archs=archs, backends=args.backend,
                            kv_cache_dtypes=args.kv_cache_dtype, cell_ids=args.cell)

    plan = plan_or_refuse(cells, local_arch, f"kvgate run {args.what}")
    warning = gpu.check_gpu_driver_for([cell.arch for cell in cells], local_arch)  # before any GPU cell runs
    if warning:
        print(f"kvgate: WARNING {warning}", file=sys.stderr, flush=True)
    sides = prepare_sides(args.vllm, args.base_vllm)  # every spec checked before a folder is touched
    base_from = None
    if args.base_from is not None:
        if len(sides) < 2:
            raise InputError("--base-from", "reuses the base side of an A/B run", hint="Pass --base-vllm too")
        if "throughput" in stages:
            raise InputError("--base-from", "throughput compares the two sides run by turns on one machine, so its "
                             "base side is never reused", hint="Leave out --base-from, or run --stages without "
                                                                "throughput")
        from kvgate.runners.matrix_run import check_base_from

        base_from = check_base_from(args.base_from, cells, [*stages, *(["probe"] if "accuracy" in stages else [])],
                                    sides[0])

    from kvgate.runners.matrix_run import RunOptions, run_cells
    from kvgate.runners.side_by_side import DEFAULT_JOBS

    if args.jobs is not None and not 1 <= args.jobs <= 64:
        raise InputError("--jobs", f"expected engines side by side from 1 to 64, got {args.jobs}",
                         hint="Write --jobs 1 for one at a time")

    designs, questions_note = accuracy_designs(cells, args.matrix_dir, ab=len(sides) > 1 or args.powered,
                                               passthrough=passthrough) if "accuracy" in stages else ({}, None)
    options = RunOptions(run_dir=args.run_dir, stages=stages, passthrough=passthrough, sides=sides,
                         timeout=args.timeout, designs=designs, questions_note=questions_note,
                         base_from=base_from, stop_early=not args.powered,
                         command=[_program(), *sys.argv[1:]], arch=None if filtered else arch_default,
                         matrix_dir=args.matrix_dir, local_arch=local_arch, host=plan,
                         allow_shared_gpu=args.allow_shared_gpu,
                         jobs=DEFAULT_JOBS if args.jobs is None else args.jobs, jobs_asked=args.jobs is not None)
    status, _ = run_cells(cells, options)
    return status



USER_SAMPLING_FLAGS = ("--limit", "--samples")


def accuracy_designs(cells, matrix_dir: Path | None, *, ab: bool, passthrough: list[str]) -> tuple[dict, str | None]:
    """(cell id -> the questions its accuracy stage answers and where it may stop: the policy's plan
    (kvgate.gate.question_plan) from the matrix folder's policy, never the results folder's; a note for the run). When
    the caller chose the questions itself (`-- --limit N`) no cell has a plan and the note says so (the gate then
    states the power those questions give)."""
    from kvgate.gate import policy as policy_module
    from kvgate.gate import question_plan
    from kvgate.matrix.cells import load as load_matrix
    from kvgate.runners.stages.looks import Design

    chosen = [flag for flag in passthrough if flag.split("=", 1)[0] in USER_SAMPLING_FLAGS]
    if chosen:  # said by the run, after what the host cannot run (kvgate.runners.matrix_run)
        return {}, (f"{chosen[0].split('=', 1)[0]} given: the accuracy stage answers the questions asked, not the "
                    "policy's plan (the gate states the power they give)")
    matrix_dir = Path(matrix_dir) if matrix_dir is not None else None
    policy = policy_module.load(matrix_dir / policy_module.POLICY_FILE if matrix_dir else None,
                                matrix=load_matrix(matrix_dir))
    acc = policy.accuracy
    designs = {}
    for cell in cells:
        plan = question_plan.plan(policy, arch=cell.arch, task=str(cell.workload.gsm8k["task"]), model=cell.model,
                                  ab=ab)
        designs[cell.id] = Design(
            questions=plan.questions, looks=plan.looks, alpha=acc.alpha, beta=1 - acc.power,
            rho=acc.sequential.beta_spending_rho, gap_points=acc.gap_points, filter=acc.primary_filter,
            margins={"fp8_accuracy": policy.fp8_tax_points(cell.model),
                     "baseline_accuracy": acc.baseline_margin_points},
            reason=plan.reason)
    return designs, None
