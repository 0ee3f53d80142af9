"""The throughput stage of one cell: `vllm bench throughput`, `warmups` unmeasured runs then `repeats`
measured ones, each a fresh engine; per repeat one --output-json file and its captured output
(throughput/repeat-N.json, repeat-N.log). The stage's timeout covers all the runs of one side together.
In an A/B run the two sides of a cell take turns, run by run (run_throughput_interleaved).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kvgate.results import cell_folder
from kvgate.runners.context import CellContext
from kvgate.runners.engine.backend_check import backend_mismatch
from kvgate.runners.engine.bench_output import BenchFigures, read_bench_figures
from kvgate.runners.engine.infrastructure import (
    infrastructure_failure,
    is_free_memory,
    retry_header,
    twice_failed_reason,
)
from kvgate.runners.engine.log import failure_cause, read_backend_evidence
from kvgate.runners.environment.memory_holders import other_gpu_processes
from kvgate.runners.outcome import StageOutcome
from kvgate.runners.stages.commands import bench_throughput_argv
from kvgate.runners.stages.output_files import commit_stage, fresh_log
from kvgate.runners.stages.tool_process import describe_exit, heartbeat_for, read_tail, run_logged

DEFAULT_REPEATS = 3
DEFAULT_WARMUPS = 1


class _StageFailed(Exception):
    def __init__(self, status: str, reason: str, log_tail: str = ""):
        super().__init__(reason)
        self.status, self.reason, self.log_tail = status, reason, log_tail


class ThroughputSession:
    """One cell side's throughput stage, run by steps so that two sides can take turns (interleave)."""

    def __init__(self, ctx: CellContext):
        settings = ctx.cell.workload.throughput
        self.ctx = ctx
        self.repeats = int(settings.get("repeats", DEFAULT_REPEATS))
        self.warmups = int(settings.get("warmups", DEFAULT_WARMUPS))
        self.log = fresh_log(ctx.cell_dir, "throughput")
        self.start = time.monotonic()
        self.deadline = None if ctx.timeout is None else self.start + ctx.timeout
        self.scratch = Path(tempfile.mkdtemp(prefix=".throughput-work-", dir=ctx.cell_dir))
        self.figures: list[BenchFigures] = []
        self.failed: _StageFailed | None = None
        self.infra_retries: list[dict[str, str]] = []  # engine starts that failed on the machine, retried

    def warmup(self, index: int) -> None:
        self._step(f"warm-up {index}/{self.warmups}", None)

    def repeat(self, number: int) -> None:
        self._step(f"repeat {number}/{self.repeats}", number)

    def _step(self, label: str, repeat: int | None) -> None:
        if self.failed is not None:
            return  # a failed stage runs no more engines
        try:
            figures = _one_run(self.ctx, label, repeat, self.scratch, self.log, self.deadline,
                               self.infra_retries)
        except _StageFailed as failed:
            self.failed = failed
            return
        if figures is not None:
            self.figures.append(figures)

    def finish(self, **facts) -> StageOutcome:
        """Commit the repeats (or record the failure) in the cell folder; the session is over."""
        ctx, cell = self.ctx, self.ctx.cell
        if self.infra_retries:
            facts = {**facts, "infra_retries": self.infra_retries}
        try:
            elapsed = time.monotonic() - self.start
            if self.failed is not None:
                cell_folder.write_status(ctx.cell_dir, "throughput", self.failed.status, self.failed.reason,
                                         self.failed.log_tail or read_tail(self.log), elapsed_s=round(elapsed, 1),
                                         backend=cell.backend, **facts)
                return StageOutcome(cell_id=ctx.label, stage="throughput", status=self.failed.status,
                                    elapsed=elapsed, reason=self.failed.reason)
            commit_stage(ctx.cell_dir, "throughput", self.scratch)
            figures = self.figures
            cell_folder.write_status(
                ctx.cell_dir, "throughput", "ok", elapsed_s=round(elapsed, 1), backend=cell.backend,
                requests_per_second=[f.requests_per_second for f in figures],
                output_tokens_per_second=[f.output_tokens_per_second for f in figures],
                total_tokens_per_second=[f.total_tokens_per_second for f in figures], **facts)
            return StageOutcome(cell_id=ctx.label, stage="throughput", status="ok", elapsed=elapsed,
                                headline=throughput_headline(figures))
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)


def run_throughput(ctx: CellContext) -> StageOutcome:
    session = ThroughputSession(ctx)
    for index in range(1, session.warmups + 1):
        session.warmup(index)
    for number in range(1, session.repeats + 1):
        session.repeat(number)
    return session.finish()


def run_throughput_interleaved(contexts: list[CellContext]) -> list[StageOutcome]:
    """The sides of one cell by turns: every side's warm-ups, then repeat 1 of each side, repeat 2 of each
    side, ... so that slow drift of the machine falls on both sides alike. Repeat N of every side is one
    round (status.json says `interleaved`), which the gate may pair."""
    sessions = [ThroughputSession(ctx) for ctx in contexts]
    rounds = min(s.repeats for s in sessions)
    for index in range(1, max(s.warmups for s in sessions) + 1):
        for session in sessions:
            if index <= session.warmups:
                session.warmup(index)
    for number in range(1, rounds + 1):
        for session in sessions:
            session.repeat(number)
    order = [ctx.side or "head" for ctx in contexts]
    return [s.finish(interleaved={"order": order, "rounds": rounds}) for s in sessions]


def _one_run(ctx: CellContext, label: str, repeat: int | None, scratch: Path, log: Path,
             deadline: float | None, infra_retries: list[dict[str, str]]) -> BenchFigures | None:
    """One `vllm bench throughput`; the figures of a measured repeat, None for a warm-up. An engine start that
    failed on the machine starts once more, and is added to infra_retries."""
    cell = ctx.cell
    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining <= 0:
        raise _StageFailed("timeout", f"no time left for {label} (stage timeout {ctx.timeout:.0f} s)")
    output_json = scratch / f"repeat-{repeat}.json" if repeat is not None else None
    run_log = scratch / f"repeat-{repeat}.log" if repeat is not None else scratch / "warmup.log"
    argv = bench_throughput_argv(ctx.python, cell, ctx.model_path, output_json, ctx.passthrough,
                                 calculate_kv_scales=ctx.calculate_kv_scales)
    header = f"kvgate: {ctx.label} throughput {label}: vllm {' '.join(argv[3:])}\n"
    with open(log, "ab") as handle:
        handle.write(header.encode())
    if ctx.echo:
        print(header, end="", flush=True)
    result = run_logged(argv, env=ctx.env, logs=[log, run_log], timeout=remaining, echo=ctx.echo,
                        heartbeat=heartbeat_for(f"{ctx.label} throughput {label}", echo=ctx.echo))
    text = run_log.read_text(encoding="utf-8", errors="replace")
    infrastructure = None if result.ok or result.timed_out else infrastructure_failure(text)
    if infrastructure:
        # the engine never came up, and what stopped it is the machine, not the cell: this run starts once more
        # (its repeat-N.log keeps the second start alone; the stage log keeps both)
        infra_retries.append({"run": label, "reason": infrastructure})
        run_log.unlink(missing_ok=True)
        remaining = None if deadline is None else deadline - time.monotonic()
        result = run_logged(argv, env=ctx.env, logs=[log, run_log], timeout=remaining, echo=ctx.echo,
                            header=retry_header(infrastructure),
                            heartbeat=heartbeat_for(f"{ctx.label} throughput {label}", echo=ctx.echo))
        text = run_log.read_text(encoding="utf-8", errors="replace")
        again = None if result.ok or result.timed_out else infrastructure_failure(text)
        if again:
            processes = other_gpu_processes(ctx.env) if is_free_memory(again) else None
            raise _StageFailed("error", f"{label}: {twice_failed_reason(again, processes)}", result.log_tail)
    if repeat is None:
        run_log.unlink(missing_ok=True)  # a warm-up's output lives on in the stage log only
    if result.timed_out:
        raise _StageFailed("timeout", f"{label} killed at the stage timeout of {ctx.timeout:.0f} s",
                           result.log_tail)
    if not result.ok:
        cause = failure_cause(text)
        raise _StageFailed("error", f"{label}: vllm bench throughput {describe_exit(result.returncode)}"
                           + (f": {cause}" if cause else ""), result.log_tail)
    mismatch = backend_mismatch(cell.backend, cell.arch, read_backend_evidence(text))
    if mismatch:
        raise _StageFailed("error", f"wrong attention backend in {label}: {mismatch}", result.log_tail)
    figures = read_bench_figures(text)
    if figures is None:
        raise _StageFailed("error", f"{label}: no 'Throughput: ...' line in the output of vllm bench throughput",
                           result.log_tail)
    if output_json is not None and not output_json.is_file():
        raise _StageFailed("error", f"{label}: vllm bench throughput wrote no {output_json.name}",
                           result.log_tail)
    return figures if repeat is not None else None


def throughput_headline(figures: list[BenchFigures]) -> str:
    if not figures:
        return "no repeats"
    rates = [f.output_tokens_per_second for f in figures]
    per_repeat = ", ".join(f"{r:.1f}" for r in rates)
    return f"{statistics.median(rates):.1f} output tok/s median (repeats {per_repeat})"
