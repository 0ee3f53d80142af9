"""Run the selected stages of the selected cells into one results folder (docs/results-folder.md), then summarise.

A stage that crashes, hangs past its timeout or runs the wrong backend is recorded in its cell's
status.json and the run goes on with the other stages and cells; the exit status says whether all passed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvgate import EXIT_FAILED, EXIT_OK
from kvgate.change.sides import Side, sides_record
from kvgate.matrix.cells import Cell
from kvgate.results import cell_folder
from kvgate.results.records import HEAD
from kvgate.runners import progress
from kvgate.runners.context import CellContext
from kvgate.runners.environment import gpu
from kvgate.runners.environment.cpu import RUNNER_LABEL_ENV, HostPlan, head_size_problems, misrouted_reason
from kvgate.runners.environment.engine_options import (
    has_calculate_kv_scales,
    kv_scales_argument,
    vllm_package_dir,
)
from kvgate.runners.environment.hub_cache import missing_from_cache
from kvgate.runners.environment.process_env import engine_environment
from kvgate.runners.outcome import StageOutcome
from kvgate.runners.run_record import now_utc, run_record, write_run_record
from kvgate.runners.side_by_side import CPU_BIND_VARIABLE, core_groups, run_side_by_side, why_one_at_a_time
from kvgate.runners.stage_plan import planned_stages
from kvgate.runners.stages.accuracy import run_accuracy
from kvgate.runners.stages.commands import HUB_POOL_GSM8K_TASK, LOCAL_GSM8K_TASK
from kvgate.runners.stages.kernels import run_kernels
from kvgate.runners.stages.looks import Design, Plan, Reference
from kvgate.runners.stages.throughput import run_throughput, run_throughput_interleaved
from kvgate.runners.stages.tool_process import stop_every_run

DEFAULT_TIMEOUT_SECONDS = 3600.0  # a stage whose workload declares no timeout, and the kernels stage
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass(kw_only=True)
class RunOptions:
    run_dir: Path
    stages: Sequence[str]
    timeout: float | None = None  # seconds, every stage (`--timeout`); None: each stage's own (stage_timeout)
    passthrough: Sequence[str] = ()
    command: Sequence[str] = field(default_factory=lambda: list(sys.argv))
    arch: str | None = None
    local_arch: str | None = None  # this machine's arch; other archs' cells are skipped (None: run them all)
    matrix_dir: Path | None = None
    echo: bool = True
    say: Callable[[str], None] = field(default=lambda line: print(line, flush=True))
    sides: Sequence[Side] = (Side(name=HEAD, vllm=None),)  # [head], or [base, head] for an A/B run
    host: HostPlan | None = None  # which selected cells this host cannot run (kvgate.runners.environment.cpu); None: all run
    designs: Mapping[str, Design] = field(default_factory=dict)  # cell id -> its accuracy questions (the policy's)
    questions_note: str | None = None  # why no cell has the policy's questions (the caller chose them: --limit)
    base_from: tuple[Path, str] | None = None  # an earlier run's folder and side reused as the base (check_base_from)
    stop_early: bool = True  # False: a reference run (--powered), every cell answers its design's questions in full
    allow_shared_gpu: bool = False  # `--allow-shared-gpu`: time throughput on a GPU that other processes hold
    environ: dict[str, str] | None = None  # default os.environ
    jobs: int = 1  # CPU accuracy engines side by side, each on cores of its own (kvgate.runners.side_by_side)
    jobs_asked: bool = False  # --jobs was given: say why the engines still start one at a time, where they do


@dataclass(kw_only=True)
class _CellSide:
    side: Side
    cell_dir: Path
    ctx: CellContext | None  # None: the cell is for another machine
    setup_error: str | None
    wrong_machine: str | None
    misrouted: str | None = None  # CI sent the cell to a host that cannot run it: every stage is an error


def run_cells(cells: Sequence[Cell], options: RunOptions) -> tuple[int, list[StageOutcome]]:
    """Exit status (EXIT_OK / EXIT_FAILED) and every stage's outcome."""
    run_dir = options.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    started = now_utc()
    sides = list(options.sides)
    environ = os.environ if options.environ is None else options.environ
    plan = options.host
    label = environ.get(RUNNER_LABEL_ENV, "")
    misrouted = {p.cell.id: misrouted_reason(p, label) for p in plan.planned_out} if plan and label else {}
    planned_out = [] if misrouted or plan is None else list(plan.planned_out)
    for line in (plan.start_lines(len(cells)) if plan and not misrouted else []):
        options.say(line)
    skipped_here = {p.cell.id for p in planned_out}
    cells = [c for c in cells if c.id not in skipped_here]
    stage_plan = {c.id: planned_stages(c, options.stages) for c in cells}  # a stage planned is a stage required
    for cell_id, (_, reasons) in stage_plan.items():
        for reason in reasons.values():
            options.say(f"kvgate: {cell_id}: {reason}")
    record = dict(repo=REPO_ROOT, command=options.command, started_at=started, arch=options.arch,
                  cells=[c.id for c in cells], stages=list(options.stages),
                  planned_stages={cell_id: list(stages) for cell_id, (stages, _) in stage_plan.items()},
                  not_planned={cell_id: dict(reasons) for cell_id, (_, reasons) in stage_plan.items() if reasons},
                  sides=[s.name for s in sides], vllm_under_test=sides_record(sides),
                  host_cpu=plan.host.as_record() if plan and plan.host else None,
                  base_from=str(options.base_from[0]) if options.base_from else None,
                  planned_out=[p.as_record() for p in planned_out])
    write_run_record(run_dir, run_record(**record, finished_at=None))
    point_latest(run_dir)
    for side in sides:
        if side.vllm is not None:
            options.say(f"kvgate: {side.name}: {side.vllm.short()}")
    if options.questions_note:
        options.say(f"kvgate: {options.questions_note}")
    for cell in cells:
        design = options.designs.get(cell.id)
        if design is not None and "accuracy" in stage_plan[cell.id][0]:
            options.say(f"kvgate: {cell.id}: {design.questions} questions ({design.reason})")
        if "accuracy" in stage_plan[cell.id][0]:
            long_context = long_context_plan(cell)
            if long_context:
                options.say(f"kvgate: {cell.id}: {long_context}")
    warned: set[str] = set()
    outcomes: list[StageOutcome] = []
    answered: dict[tuple[str, str], Path] = {}  # (cell id, side) -> its accuracy folder, answered in this invocation
    total = sum(len(stage_plan[c.id][0]) for c in cells) * len(sides)
    grouped = environ.get("GITHUB_ACTIONS") == "true"  # each stage's output folds under its start line in the job log
    index = 0
    previous_handler = _terminate_like_ctrl_c()
    try:
        alone = options.jobs > 1 and _side_by_side_reason(cells, options, environ)
        if alone and options.jobs_asked:
            options.say(f"kvgate: --jobs {options.jobs}: {alone}")
        parts_of = {}
        for cell in cells:
            parts = parts_of[cell.id] = [_cell_side(cell, side, run_dir, options, warned, misrouted.get(cell.id))
                                         for side in sides]
            if options.jobs > 1 and not alone:
                continue  # side by side, below
            for stage in stage_plan[cell.id][0]:
                if stage == "throughput" and len(parts) > 1 and all(p.ctx and not p.setup_error and not p.misrouted
                                                                    for p in parts):
                    for n, part in enumerate(parts):
                        index += 1
                        line = progress.start_line(index, total, part.ctx.label, stage)
                        options.say(progress.group_start(line) if grouped and n == 0 else line)
                    stage_outcomes = _guarded(parts, stage, run_throughput_interleaved,
                                              [_for_stage(p.ctx, stage, options) for p in parts])
                    if grouped:
                        options.say(progress.GROUP_END)
                    for outcome in stage_outcomes:
                        outcomes.append(outcome)
                        options.say(progress.end_line(index, total, outcome))
                    continue
                for part in parts:
                    index += 1
                    label = part.ctx.label if part.ctx else cell.id
                    line = progress.start_line(index, total, label, stage)
                    options.say(progress.group_start(line) if grouped else line)
                    stage_outcomes = _one_side(cell, part, stage, options, cells, sides, answered)
                    if grouped:
                        options.say(progress.GROUP_END)
                    for outcome in stage_outcomes:
                        outcomes.append(outcome)
                        options.say(progress.end_line(index, total, outcome))
        if options.jobs > 1 and not alone:
            outcomes += _accuracy_side_by_side(cells, sides, parts_of, options, answered, total)
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
        write_run_record(run_dir, run_record(**record, finished_at=now_utc()))
        if outcomes:
            options.say("")
            options.say(progress.summary_table(outcomes))
            options.say(f"kvgate: results in {run_dir}")
            for line in (plan.end_lines() if plan and planned_out else []):
                options.say(line)
            options.say(f"kvgate: next, judge them: `nox -s gate -- {run_dir}` (or `kvgate gate {run_dir}`)")
    return (EXIT_OK if outcomes and not any(o.failed for o in outcomes) else EXIT_FAILED), outcomes


SAME_VLLM_KEYS = ("spec", "kind", "version", "release", "changes_sha256", "changed_paths", "source_commit")


def check_base_from(folder: Path, cells: Sequence[Cell], stages: Sequence[str], base: Side) -> tuple[Path, str]:
    """The folder of an earlier run on this machine whose cells stand for this A/B run's base side, and which side
    of it they are: the base side of an A/B run, or the only side of a run (`kvgate run --vllm SPEC --powered`).
    That side must have run the same vLLM as this run's --base-vllm (run.json vllm_under_test: spec, version,
    changes) and hold every selected cell with each stage ok. Raises InputError naming what is wrong."""
    import json

    from kvgate import InputError

    folder = Path(folder).resolve()
    try:
        record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InputError(str(folder / "run.json"), f"cannot read it ({error})",
                         hint="--base-from takes the results folder of an earlier run on this machine") from None
    sides = record.get("sides") if isinstance(record, dict) else None
    source_side = base.name if isinstance(sides, list) and base.name in sides else HEAD
    ran = (record.get("vllm_under_test") or {}).get(source_side) if isinstance(record, dict) else None
    wanted = base.vllm.as_record() if base.vllm is not None else None

    def identity(vllm: object) -> dict | None:
        return {key: vllm.get(key) for key in SAME_VLLM_KEYS} if isinstance(vllm, dict) else None

    if identity(ran) is None or identity(ran) != identity(wanted):
        shown = ran.get("spec") if isinstance(ran, dict) else ran
        raise InputError(str(folder / "run.json"), f"its {source_side} side ran {shown!r}, not this run's --base-vllm "
                         f"({wanted.get('spec') if wanted else None!r}) with the same changes",
                         f"vllm_under_test.{source_side}", "Reuse a run of the same vLLM, or run the base side again")
    for cell in cells:
        cell_dir = folder / cell_folder.folder_name(cell.id, source_side)
        try:
            status = json.loads((cell_dir / "status.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise InputError(str(cell_dir), f"no readable status.json: cell {cell.id} did not run there",
                             hint="Run the base side again (leave out --base-from)") from None
        for stage in stages:
            entry = status.get(stage) if isinstance(status, dict) else None
            if not isinstance(entry, dict) or entry.get("status") != "ok":
                raise InputError(str(cell_dir / "status.json"), f"its {stage} stage is not ok", stage,
                                 "Reuse a run whose stages all passed, or run the base side again")
        plan = (status.get("accuracy") or {}).get("question_plan") if "accuracy" in stages else None
        if isinstance(plan, dict) and plan.get("answered") != plan.get("questions"):
            raise InputError(str(cell_dir / "status.json"), f"cell {cell.id} stopped after {plan.get('answered')} of "
                             f"{plan.get('questions')} questions", "accuracy.question_plan",
                             "A base side answers them all: make it with `kvgate run ... --powered`")
    return folder, source_side


def reuse_base_stage(source_run: tuple[Path, str], cell_dir: Path, cell: Cell, stage: str,
                     label: str) -> list[StageOutcome]:
    """The base side's stage copied from the earlier run (its outputs, its status.json entries), not run again."""
    import json
    import shutil

    folder, side = source_run
    source = Path(folder) / cell_folder.folder_name(cell.id, side)
    status = json.loads((source / "status.json").read_text(encoding="utf-8"))
    reported = reported_stages(stage, cell) + (["long_context"] if stage == "accuracy" and "long_context" in status
                                               and cell.workload.long_context is None else [])
    out = []
    for name in reported:
        if (source / name).is_dir():
            shutil.rmtree(cell_dir / name, ignore_errors=True)
            shutil.copytree(source / name, cell_dir / name)
        entry = dict(status.get(name) or {"status": "error", "reason": f"not in {source}/status.json"})
        entry["reused_from"] = str(source)
        state = entry.pop("status")
        reason = entry.pop("reason", None)
        entry.pop("log_tail", None)
        cell_folder.write_status(cell_dir, name, state, reason, **entry)
        out.append(StageOutcome(cell_id=label, stage=name, status=state, reason=reason,
                                headline=f"reused from {source}"))
    return out


def _cell_side(cell: Cell, side: Side, run_dir: Path, options: RunOptions, warned: set[str],
               misrouted: str | None = None) -> _CellSide:
    """One side of one cell: its folder, its environment (the side's vLLM first on PYTHONPATH), its context."""
    cell_dir = cell_folder.prepare_cell(run_dir, side.record(cell_record(cell)))
    env, warnings = engine_environment(os.environ, arch=cell.arch, local_model=cell.workload.is_local_model,
                                       home=Path.home(), cpu_ranks=_cpu_ranks(cell), allowed_cores=_allowed_cores())
    if side.vllm is not None:
        env = side.vllm.environment(env)
    for warning in warnings:
        if warning not in warned:
            warned.add(warning)
            options.say(f"kvgate: WARNING {warning}")
    if misrouted:
        return _CellSide(side=side, cell_dir=cell_dir, ctx=None, setup_error=None, wrong_machine=None,
                         misrouted=misrouted)
    wrong_machine = _wrong_machine(cell, options.local_arch)
    if wrong_machine:
        return _CellSide(side=side, cell_dir=cell_dir, ctx=None, setup_error=None, wrong_machine=wrong_machine)
    ctx, setup_error = _context(cell, cell_dir, run_dir, env, options, side)
    return _CellSide(side=side, cell_dir=cell_dir, ctx=ctx, setup_error=setup_error, wrong_machine=None)


def _one_side(cell: Cell, part: _CellSide, stage: str, options: RunOptions, cells: Sequence[Cell],
              sides: Sequence[Side], answered: dict[tuple[str, str], Path], *,
              cores: str | None = None) -> list[StageOutcome]:
    """One stage of one side of a cell (reused from --base-from, an error, skipped or run); cores: the CPU cores its
    engine computes on when engines run side by side (its output then stays in its log)."""
    if options.base_from is not None and part.side.name != HEAD:
        stage_outcomes = reuse_base_stage(options.base_from, part.cell_dir, cell, stage,
                                          part.ctx.label if part.ctx else cell.id)
    elif part.misrouted:
        return _skip_stage(stage, cell, part.cell_dir, part.misrouted, status="error")
    elif part.ctx is None:
        return _skip_stage(stage, cell, part.cell_dir, part.wrong_machine)
    else:
        ctx = _for_stage(part.ctx, stage, options)
        if cores is not None:
            ctx = replace(ctx, env={**ctx.env, CPU_BIND_VARIABLE: cores}, echo=False, heartbeat_alone=True)
        if stage == "accuracy":
            ctx = replace(ctx, looks_plan=looks_plan(cell, part.side, cells, sides, ctx.design, answered)
                          if options.stop_early else None)
        stage_outcomes = _guarded([part], stage, _run_stage, stage, ctx, part.setup_error, cell, part.cell_dir)
    if stage == "accuracy" and stage_outcomes and stage_outcomes[0].status == "ok":
        answered[(cell.id, part.side.name)] = part.cell_dir / "accuracy"
    return stage_outcomes


def _side_by_side_reason(cells: Sequence[Cell], options: RunOptions, environ: Mapping[str, str]) -> str | None:
    """Why --jobs cannot run this run's engines side by side (None: it can)."""
    return why_one_at_a_time(jobs=options.jobs, archs={c.arch for c in cells}, stages=options.stages,
                             environ=environ, allowed=_allowed_cores(), parallel=any(_cpu_ranks(c) > 1 for c in cells))


def _cpu_ranks(cell: Cell) -> int:
    """The tensor-parallel ranks of a CPU cell's engine (1 on a GPU: CUDA_VISIBLE_DEVICES places those)."""
    ranks = cell.engine_args.get("tensor_parallel_size", 1)
    return ranks if cell.arch == "cpu" and isinstance(ranks, int) and not isinstance(ranks, bool) else 1


def _allowed_cores() -> set[int]:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def _accuracy_side_by_side(cells: Sequence[Cell], sides: Sequence[Side], parts_of: Mapping[str, list[_CellSide]],
                           options: RunOptions, answered: dict[tuple[str, str], Path],
                           total: int) -> list[StageOutcome]:
    """The accuracy stage of every cell-side, options.jobs engines at a time on cores of their own
    (kvgate.runners.side_by_side); the outcomes in the order one at a time would give them."""
    units = [(cell, part) for cell in cells for part in parts_of[cell.id]]
    order = {(cell.id, part.side.name): n for n, (cell, part) in enumerate(units)}
    numbers: dict[tuple[str, str], int] = {}
    results: dict[tuple[str, str], list[StageOutcome]] = {}

    def key(unit) -> tuple[str, str]:
        return unit[0].id, unit[1].side.name

    def label(unit) -> str:
        return unit[1].ctx.label if unit[1].ctx else unit[0].id

    def started(unit) -> None:
        numbers[key(unit)] = len(numbers) + 1
        options.say(progress.start_line(numbers[key(unit)], total, label(unit), "accuracy")
                    + f" (its engine's output: {unit[1].cell_dir / 'logs'})")

    def finished(unit, stage_outcomes) -> None:
        results[key(unit)] = stage_outcomes
        for outcome in stage_outcomes:
            options.say(progress.end_line(numbers[key(unit)], total, outcome))

    def interrupted(running) -> None:
        stop_every_run()
        for _, part in running:
            cell_folder.write_status(part.cell_dir, "accuracy", "error",
                                     "interrupted (Ctrl-C or SIGTERM) before it finished")

    run_side_by_side(units, key=key, after=_compared_with(cells, sides, options), cores=core_groups(
        _allowed_cores(), options.jobs), run=lambda unit, cores: _one_side(
        unit[0], unit[1], "accuracy", options, cells, sides, answered, cores=cores),
        started=started, finished=finished, interrupted=interrupted)
    return [outcome for k in sorted(results, key=order.__getitem__) for outcome in results[k]]


def _compared_with(cells: Sequence[Cell], sides: Sequence[Side],
                   options: RunOptions) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """The cell-sides each one's accuracy stage is compared with, so it starts after them (looks_plan's references:
    the base side of its cell, the auto cell of its group for an FP8 cell)."""
    after: dict[tuple[str, str], set[tuple[str, str]]] = {}
    base = next((s.name for s in sides if s.name != HEAD), None) if len(sides) > 1 else None
    for cell in cells:
        for side in sides:
            wants = after.setdefault((cell.id, side.name), set())
            if base is not None and side.name != base and options.base_from is None:
                wants.add((cell.id, base))
            if cell.is_fp8:
                wants |= {(c.id, side.name) for c in cells
                          if c.kv_cache_dtype == "auto" and comparison_group(c) == comparison_group(cell)}
    return after


def stage_timeout(cell: Cell, stage: str, override: float | None) -> float:
    """Seconds a stage of a cell may run: `--timeout` when given, else its workload's (matrix/workloads.toml
    `timeouts`, sized from the engine start-up budgets of vLLM's CI), else DEFAULT_TIMEOUT_SECONDS."""
    if override is not None:
        return override
    return float(cell.workload.timeouts.get(stage, DEFAULT_TIMEOUT_SECONDS))


def _for_stage(ctx: CellContext, stage: str, options: RunOptions) -> CellContext:
    return replace(ctx, timeout=stage_timeout(ctx.cell, stage, options.timeout))


def _guarded(parts: list[_CellSide], stage: str, run: Callable[..., list[StageOutcome]], *args) -> list[StageOutcome]:
    """run(*args) for a stage; on Ctrl-C or SIGTERM mark it failed in every side it was running for, then stop."""
    try:
        outcome = run(*args)
    except KeyboardInterrupt:
        for part in parts:
            cell_folder.write_status(part.cell_dir, stage, "error", "interrupted (Ctrl-C or SIGTERM) before it finished")
        raise
    return outcome if isinstance(outcome, list) else [outcome]


def long_context_plan(cell: Cell) -> str | None:
    """What the cell's accuracy stage asks of the passkey task, said before anything runs (None: no such task)."""
    from kvgate.runners.stages.accuracy import long_context_lengths, long_context_skip_reason

    lengths, unfit = long_context_lengths(cell)
    if not lengths and not unfit:
        return None
    if not lengths:
        return f"long context {long_context_skip_reason(cell, unfit)}"
    per_length = cell.workload.long_context.per_length
    text = f"long context: {per_length * len(lengths)} passkey documents at {', '.join(map(str, lengths))} tokens"
    return text + (f"; {long_context_skip_reason(cell, unfit)}" if unfit else "")


def _terminate_like_ctrl_c():
    """SIGTERM (a cancelled CI job) raises KeyboardInterrupt, so the running stage's engine process group is
    killed too (it runs in its own session, out of reach of a signal sent to ours). Returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, handler)


def cell_record(cell: Cell) -> dict:
    """cell.json: the matrix's identity, with `task` the lm-eval task name its results file holds."""
    return cell.as_record()


def _context(cell: Cell, cell_dir: Path, run_dir: Path, env: dict[str, str],
             options: RunOptions, side: Side) -> tuple[CellContext, str | None]:
    """The cell's context, and why its engine stages cannot run (model not buildable, task not writable, model or
    dataset not in the cache an offline engine reads, an engine option the cell's vLLM does not have)."""
    needs_engine = any(stage in ("accuracy", "throughput") for stage in options.stages)
    model_path, include_path, setup_error = cell.model, None, None
    throughput_model_path = long_context_model_path = None
    try:
        if needs_engine and cell.workload.is_local_model:
            from kvgate.workloads.tiny_models import resolve_model

            began = time.monotonic()
            model_path = resolve_model(cell.model, kv_scales=cell.loads_checkpoint_kv_scales)
            options.say(f"kvgate: {cell.id}: model {cell.model}"
                        f"{' with the k/v scales of its FP8 checkpoint' if cell.loads_checkpoint_kv_scales else ''} "
                        f"is {model_path} "
                        f"({time.monotonic() - began:.1f} s to find or build)")
        long_context = cell.workload.long_context
        if "accuracy" in options.stages and long_context is not None and long_context.model is not None:
            from kvgate.workloads.tiny_models import resolve_model

            long_context_model_path = resolve_model(long_context.model)
            options.say(f"kvgate: {cell.id}: the passkey task's model {long_context.model} is "
                        f"{long_context_model_path}")
        if "throughput" in options.stages and cell.workload.throughput.get("weights") == "dummy":
            from kvgate.workloads.dummy_weights import ensure_model

            began = time.monotonic()
            throughput_model_path = str(ensure_model(cell.model))
            options.say(f"kvgate: {cell.id}: throughput runs {cell.model}'s architecture with dummy weights from "
                        f"{throughput_model_path} ({time.monotonic() - began:.1f} s to find or build)")
        if "accuracy" in options.stages and cell.workload.gsm8k["task"] == LOCAL_GSM8K_TASK:
            include_path = _local_task_folder(run_dir, max((d.questions for d in options.designs.values()),
                                                            default=0))
    except Exception as error:  # reported as the cell's stage error; the other cells still run
        setup_error = f"setup failed: {type(error).__name__}: {error}"
    if needs_engine and setup_error is None:  # a model or dataset the offline engine cannot find: say so now
        setup_error = missing_from_cache(cell, [s for s in options.stages if s != "throughput"]
                                         if throughput_model_path else options.stages, env)
    if setup_error is None and "accuracy" in options.stages and cell.workload.gsm8k["task"] == HUB_POOL_GSM8K_TASK:
        include_path, setup_error = _pool_task_folder(run_dir, env)
    if needs_engine and setup_error is None and cell.host_requirements:  # a head size the cell's kernels refuse
        problem = head_size_problems(cell, str(model_path))
        setup_error = f"setup failed: {problem}" if problem else None
    package_dir = vllm_package_dir(env) if cell.is_fp8 and needs_engine else None
    kv_scales, kv_scales_error = kv_scales_argument(cell, has_calculate_kv_scales(package_dir), package_dir)
    setup_error = setup_error or kv_scales_error
    ctx = CellContext(cell=cell, cell_dir=cell_dir, run_dir=run_dir, model_path=str(model_path),
                      throughput_model_path=throughput_model_path, allow_shared_gpu=options.allow_shared_gpu,
                      long_context_model_path=long_context_model_path,
                      python=sys.executable, env=env, timeout=options.timeout,
                      passthrough=tuple(options.passthrough), include_path=include_path,
                      matrix_dir=options.matrix_dir, echo=options.echo,
                      side=side.name if side.ab else None, vllm=side.vllm, calculate_kv_scales=kv_scales,
                      design=options.designs.get(cell.id))
    return ctx, setup_error


def _local_task_folder(run_dir: Path, questions: int) -> Path:
    """The run's copy of kvgate's local gsm8k task, its test split the first `questions` of the held-out pool (at
    least its 240 test questions; a folder an earlier invocation wrote with enough questions is kept, since every
    size is a prefix of the same order)."""
    import fcntl

    from kvgate.workloads.gsm8k_local import test_questions, write_task

    folder = run_dir / ".kvgate-tasks"
    with open(run_dir / ".kvgate-tasks.lock", "a+") as lock:  # invocations into one folder at once: one writes
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not folder.is_dir() or not any(folder.glob("*.yaml")) or test_questions(folder) < questions:
            folder.mkdir(parents=True, exist_ok=True)
            name = write_task(folder, questions=questions)
            if name != LOCAL_GSM8K_TASK:
                raise RuntimeError(f"kvgate.workloads.gsm8k_local wrote task {name!r}, expected {LOCAL_GSM8K_TASK!r}")
    return folder


def _pool_task_folder(run_dir: Path, env: Mapping[str, str]) -> tuple[Path | None, str | None]:
    """The run's copy of the hub models' pool task (kvgate.workloads.gsm8k_pool), written once per results folder by
    a process with the engines' environment (the hub offline, their Hugging Face cache); or why it could not be."""
    import fcntl
    import subprocess

    from kvgate.workloads.gsm8k_pool import YAML_NAME, test_questions

    folder = run_dir / ".kvgate-pool-task"
    with open(run_dir / ".kvgate-tasks.lock", "a+") as lock:  # invocations into one folder at once: one writes
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / YAML_NAME).is_file() and test_questions(folder) > 0:  # the YAML is written last
            return folder, None
        done = subprocess.run([sys.executable, "-m", "kvgate.workloads.gsm8k_pool", str(folder)], env=dict(env),
                              capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        errors = [line.removeprefix("ERROR ") for line in done.stderr.splitlines() if line.startswith("ERROR ")]
        last = (errors or done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"setup failed: the gsm8k test+train pool could not be written (exit {done.returncode}): {last}"
    return folder, None


def comparison_group(cell: Cell) -> tuple:
    """What an FP8 cell shares with the auto cell it is compared with."""
    return cell.backend, cell.arch, cell.model, str(cell.workload.gsm8k["task"])


def looks_plan(cell: Cell, side: Side, cells: Sequence[Cell], sides: Sequence[Side], design: Design | None,
               answered: Mapping[tuple[str, str], Path]) -> Plan | None:
    """The looks a candidate cell may stop at, against every reference it is compared with. None (answer every
    question of the design) for a fixed design; for a cell other comparisons use as their reference (a base side; an
    auto cell whose FP8 cells run in this invocation); and whenever one of its comparisons has no answered reference
    in this invocation (an auto cell another invocation runs into the same folder, a base side that failed): a cell
    may stop only where the gate's replay of every comparison it is in can decide there too."""
    if design is None or len(design.looks) < 2 or (len(sides) > 1 and side.name != HEAD):
        return None
    group = comparison_group
    if not cell.is_fp8 and any(c.is_fp8 and group(c) == group(cell) for c in cells):
        return None
    references = []
    if len(sides) > 1:
        base = next(s for s in sides if s.name != HEAD)
        if (cell.id, base.name) not in answered:
            return None
        references.append(Reference(label="base side", kind="baseline_accuracy",
                                    margin_points=design.margins["baseline_accuracy"],
                                    samples=str(answered[(cell.id, base.name)])))
    if cell.is_fp8:
        auto = next((c for c in cells if c.kv_cache_dtype == "auto" and group(c) == group(cell)), None)
        if auto is None or (auto.id, side.name) not in answered:
            return None
        references.append(Reference(label="auto cell", kind="fp8_accuracy",
                                    margin_points=design.margins["fp8_accuracy"],
                                    samples=str(answered[(auto.id, side.name)])))
    return Plan.for_candidate(design, tuple(references)) if references else None


def reported_stages(stage: str, cell: Cell) -> list[str]:
    """The stages one stage of the cell reports: the accuracy stage's engine also runs the probe and, where the
    workload declares it, the long-context task."""
    if stage != "accuracy":
        return [stage]
    return ["accuracy", "probe", *(["long_context"] if cell.workload.long_context is not None else [])]


def _wrong_machine(cell: Cell, local_arch: str | None) -> str | None:
    if local_arch is None or cell.arch == local_arch:
        return None
    return f"cell {cell.id} needs {cell.arch}; this machine is {local_arch} (set {gpu.ARCH_ENV} to override)"


def _skip_stage(stage: str, cell: Cell, cell_dir: Path, reason: str, status: str = "skipped") -> list[StageOutcome]:
    reported = reported_stages(stage, cell)
    for name in reported:
        cell_folder.write_status(cell_dir, name, status, reason)
    return [StageOutcome(cell_id=cell.id, stage=name, status=status, reason=reason) for name in reported]


def _run_stage(stage: str, ctx: CellContext, setup_error: str | None, cell: Cell,
               cell_dir: Path) -> list[StageOutcome]:
    if stage == "kernels":
        return [run_kernels(ctx)]
    if setup_error is not None:
        reported = reported_stages(stage, cell)
        for name in reported:
            cell_folder.write_status(cell_dir, name, "error", setup_error)
        return [StageOutcome(cell_id=cell.id, stage=name, status="error", reason=setup_error) for name in reported]
    if stage == "accuracy":
        return run_accuracy(ctx)
    if stage == "throughput":
        return [run_throughput(ctx)]
    raise ValueError(f"unknown stage {stage!r}")


def point_latest(run_dir: Path) -> Path | None:
    """<repo>/reports/runs/latest -> this run, when the run folder sits in reports/runs/."""
    parent = run_dir.parent
    if parent.name != "runs" or parent.parent.name != "reports":
        return None
    link = parent / "latest"
    tmp = parent / f".latest.{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, link)
    except OSError:
        return None
    return link
