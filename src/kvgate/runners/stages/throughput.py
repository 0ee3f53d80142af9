"""The throughput stage of one cell: `vllm bench throughput`'s workload, timed in `engines` engines per side, each
warmed up and then measuring `repeats` repeats (kvgate.runners.engine.throughput_repeats, one process an engine);
per repeat one --output-json file and its `Throughput:` line (throughput/repeat-N.json, repeat-N.log, N counting on
across the engines), and each engine's own output (throughput/engine-K.log). The stage's timeout covers all the
engines of one side together. In an A/B run the two sides take turns engine by engine (run_throughput_interleaved).
"""

from __future__ import annotations

import json
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
from kvgate.runners.engine.throughput_repeats import EXIT_INFRASTRUCTURE, INFRASTRUCTURE_PREFIX
from kvgate.runners.environment.memory_holders import other_gpu_processes
from kvgate.runners.outcome import StageOutcome
from kvgate.runners.stages.commands import ThroughputDesign, throughput_repeats_argv
from kvgate.runners.stages.output_files import commit_stage, fresh_log
from kvgate.runners.stages.tool_process import describe_exit, heartbeat_for, read_tail, run_logged


class _StageFailed(Exception):
    def __init__(self, status: str, reason: str, log_tail: str = ""):
        super().__init__(reason)
        self.status, self.reason, self.log_tail = status, reason, log_tail


class ThroughputSession:
    """One cell side's throughput stage, run engine by engine so that two sides can take turns (interleave)."""

    def __init__(self, ctx: CellContext):
        self.ctx = ctx
        self.design = ThroughputDesign.of(ctx.cell.workload.throughput)
        self.log = fresh_log(ctx.cell_dir, "throughput")
        self.start = time.monotonic()
        self.deadline = None if ctx.timeout is None else self.start + ctx.timeout
        self.scratch = Path(tempfile.mkdtemp(prefix=".throughput-work-", dir=ctx.cell_dir))
        self.figures: list[BenchFigures] = []
        self.engines: list[dict] = []  # per engine: its repeats, start and warm-up seconds, the machine per repeat
        self.failed: _StageFailed | None = None
        self.infra_retries: list[dict[str, str]] = []  # engine starts that failed on the machine, retried
        self.busy = 0.0  # seconds this side's own engines ran (in an A/B run the other side's run in between)

    def engine(self, number: int) -> None:
        """Engine `number` (1-based): its warm-up, then repeats (number - 1) x R + 1 .. number x R."""
        if self.failed is not None:
            return  # a failed stage runs no more engines
        began = time.monotonic()
        try:
            self._engine(number)
        except _StageFailed as failed:
            self.failed = failed
        finally:
            self.busy += time.monotonic() - began
            if self.engines and self.engines[-1]["engine"] == number:
                self.engines[-1]["wall_s"] = round(time.monotonic() - began, 1)

    def _engine(self, number: int) -> None:
        ctx, design = self.ctx, self.design
        label = f"engine {number}/{design.engines}"
        remaining = None if self.deadline is None else self.deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise _StageFailed("timeout", f"no time left for {label} (stage timeout {ctx.timeout:.0f} s)")
        first = (number - 1) * design.repeats + 1
        summary_path = self.scratch.parent / f".{self.scratch.name}-engine-{number}.json"
        argv = throughput_repeats_argv(ctx.python, ctx.cell, ctx.throughput_model_path or ctx.model_path,
                                       out=self.scratch, summary=summary_path, first_repeat=first, design=design,
                                       passthrough=ctx.passthrough, calculate_kv_scales=ctx.calculate_kv_scales,
                                       allow_shared_gpu=ctx.allow_shared_gpu)
        engine_log = self.scratch / f"engine-{number}.log"
        header = f"kvgate: {ctx.label} throughput {label}: {' '.join(argv[1:])}\n"
        with open(self.log, "ab") as handle:
            handle.write(header.encode())
        if ctx.echo:
            print(header, end="", flush=True)
        heartbeat = heartbeat_for(f"{ctx.label} throughput {label}", echo=ctx.echo)
        result = run_logged(argv, env=ctx.env, logs=[self.log, engine_log], timeout=remaining, echo=ctx.echo,
                            heartbeat=heartbeat)
        text = engine_log.read_text(encoding="utf-8", errors="replace")
        infrastructure = None if result.ok or result.timed_out else infrastructure_failure(text)
        if infrastructure:
            # the engine never came up, and what stopped it is the machine, not the cell: it starts once more (its
            # engine-K.log keeps the second start alone; the stage log keeps both)
            self.infra_retries.append({"run": label, "reason": infrastructure})
            engine_log.unlink(missing_ok=True)
            for stale in self.scratch.glob("repeat-*"):
                if int(stale.name.split("-")[1].split(".")[0]) >= first:
                    stale.unlink()
            remaining = None if self.deadline is None else self.deadline - time.monotonic()
            result = run_logged(argv, env=ctx.env, logs=[self.log, engine_log], timeout=remaining, echo=ctx.echo,
                                header=retry_header(infrastructure), heartbeat=heartbeat)
            text = engine_log.read_text(encoding="utf-8", errors="replace")
            again = None if result.ok or result.timed_out else infrastructure_failure(text)
            if again:
                processes = other_gpu_processes(ctx.env) if is_free_memory(again) else None
                raise _StageFailed("error", f"{label}: {twice_failed_reason(again, processes)}", result.log_tail)
        summary = _read_summary(summary_path)
        self.engines.append({"engine": number, "repeats": list(range(first, first + design.repeats)),
                             **{key: summary[key] for key in ("engine_start_s", "warmup_s") if key in summary},
                             "machine": summary.get("repeats", [])})
        if result.timed_out:
            raise _StageFailed("timeout", f"{label} killed at the stage timeout of {ctx.timeout:.0f} s",
                               result.log_tail)
        if result.returncode == EXIT_INFRASTRUCTURE:
            said = next((line.split(INFRASTRUCTURE_PREFIX, 1)[1].strip() for line in text.splitlines()
                         if INFRASTRUCTURE_PREFIX in line), summary.get("infrastructure", "the machine"))
            raise _StageFailed("error", f"infrastructure: {label}: {said}", result.log_tail)
        if not result.ok:
            cause = failure_cause(text)
            raise _StageFailed("error", f"{label}: the throughput engine {describe_exit(result.returncode)}"
                               + (f": {cause}" if cause else ""), result.log_tail)
        mismatch = backend_mismatch(ctx.cell.backend, ctx.cell.arch, read_backend_evidence(text))
        if mismatch:
            raise _StageFailed("error", f"wrong attention backend in {label}: {mismatch}", result.log_tail)
        for repeat in range(first, first + design.repeats):
            log = self.scratch / f"repeat-{repeat}.log"
            figures = read_bench_figures(log.read_text(encoding="utf-8")) if log.is_file() else None
            if figures is None or not (self.scratch / f"repeat-{repeat}.json").is_file():
                raise _StageFailed("error", f"{label}: repeat {repeat} wrote no repeat-{repeat}.json and "
                                            "`Throughput:` line", result.log_tail)
            self.figures.append(figures)

    def finish(self, **facts) -> StageOutcome:
        """Commit the repeats (or record the failure) in the cell folder; the session is over."""
        ctx, cell = self.ctx, self.ctx.cell
        facts = {"design": self.design.as_record(), "engines": self.engines, **facts}
        if self.infra_retries:
            facts = {**facts, "infra_retries": self.infra_retries}
        try:
            elapsed = self.busy  # this side's own engines: in an A/B run the sides take turns
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
            for summary in self.scratch.parent.glob(f".{self.scratch.name}-engine-*.json"):
                summary.unlink(missing_ok=True)


def run_throughput(ctx: CellContext) -> StageOutcome:
    session = ThroughputSession(ctx)
    for number in range(1, session.design.engines + 1):
        session.engine(number)
    return session.finish()


def run_throughput_interleaved(contexts: list[CellContext]) -> list[StageOutcome]:
    """The sides of one cell by turns, engine by engine: base engine 1, head engine 1, base engine 2, ... so that
    slow drift of the machine falls on both sides alike. Engine K of every side is one round (status.json says
    `interleaved`), which the gate pairs when there are at least two."""
    sessions = [ThroughputSession(ctx) for ctx in contexts]
    rounds = min(s.design.engines for s in sessions)
    for number in range(1, max(s.design.engines for s in sessions) + 1):
        for session in sessions:
            if number <= session.design.engines:
                session.engine(number)
    order = [ctx.side or "head" for ctx in contexts]
    return [s.finish(interleaved={"order": order, "rounds": rounds, "by": "engine"}) for s in sessions]


def _read_summary(path: Path) -> dict:
    """The engine's own account (kvgate.runners.engine.throughput_repeats); {} when it died before writing it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    finally:
        path.unlink(missing_ok=True)
    return data if isinstance(data, dict) else {}


def throughput_headline(figures: list[BenchFigures]) -> str:
    if not figures:
        return "no repeats"
    rates = [f.output_tokens_per_second for f in figures]
    per_repeat = ", ".join(f"{r:.1f}" for r in rates)
    return f"{statistics.median(rates):.1f} output tok/s median (repeats {per_repeat})"
