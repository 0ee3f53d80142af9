"""The throughput stage of one cell: `vllm bench throughput`, `warmups` unmeasured runs then `repeats`
measured ones, each a fresh engine; per repeat one --output-json file and its captured output
(throughput/repeat-N.json, repeat-N.log). The stage's timeout covers all the runs together.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kvgate.results import cell_folder
from kvgate.runners.backend_check import backend_mismatch
from kvgate.runners.bench_log import BenchFigures, read_bench_figures
from kvgate.runners.commands import bench_throughput_argv
from kvgate.runners.context import CellContext
from kvgate.runners.engine_log import read_backend_evidence
from kvgate.runners.outcome import StageOutcome
from kvgate.runners.stage_files import commit_stage, fresh_log
from kvgate.runners.stage_process import describe_exit, read_tail, run_logged

DEFAULT_REPEATS = 3
DEFAULT_WARMUPS = 1


class _StageFailed(Exception):
    def __init__(self, status: str, reason: str, log_tail: str = ""):
        super().__init__(reason)
        self.status, self.reason, self.log_tail = status, reason, log_tail


def run_throughput(ctx: CellContext) -> StageOutcome:
    cell, cell_dir = ctx.cell, ctx.cell_dir
    settings = cell.workload.throughput
    repeats = int(settings.get("repeats", DEFAULT_REPEATS))
    warmups = int(settings.get("warmups", DEFAULT_WARMUPS))
    log = fresh_log(cell_dir, "throughput")
    start = time.monotonic()
    deadline = None if ctx.timeout is None else start + ctx.timeout
    scratch = Path(tempfile.mkdtemp(prefix=".throughput-work-", dir=cell_dir))
    try:
        figures: list[BenchFigures] = []
        runs = [(f"warm-up {i + 1}/{warmups}", None) for i in range(warmups)]
        runs += [(f"repeat {r}/{repeats}", r) for r in range(1, repeats + 1)]
        try:
            for label, repeat in runs:
                figures_of_run = _one_run(ctx, label, repeat, scratch, log, deadline)
                if figures_of_run is not None:
                    figures.append(figures_of_run)
        except _StageFailed as failed:
            elapsed = time.monotonic() - start
            cell_folder.write_status(cell_dir, "throughput", failed.status, failed.reason,
                                     failed.log_tail or read_tail(log), elapsed_s=round(elapsed, 1),
                                     backend=cell.backend)
            return StageOutcome(cell_id=cell.id, stage="throughput", status=failed.status, elapsed=elapsed,
                                reason=failed.reason)
        commit_stage(cell_dir, "throughput", scratch)
        elapsed = time.monotonic() - start
        output_rates = [f.output_tokens_per_second for f in figures]
        cell_folder.write_status(
            cell_dir, "throughput", "ok", elapsed_s=round(elapsed, 1), backend=cell.backend,
            requests_per_second=[f.requests_per_second for f in figures],
            output_tokens_per_second=output_rates,
            total_tokens_per_second=[f.total_tokens_per_second for f in figures])
        return StageOutcome(cell_id=cell.id, stage="throughput", status="ok", elapsed=elapsed,
                            headline=throughput_headline(figures))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _one_run(ctx: CellContext, label: str, repeat: int | None, scratch: Path, log: Path,
             deadline: float | None) -> BenchFigures | None:
    """One `vllm bench throughput`; the figures of a measured repeat, None for a warm-up."""
    cell = ctx.cell
    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining <= 0:
        raise _StageFailed("timeout", f"no time left for {label} (stage timeout {ctx.timeout:.0f} s)")
    output_json = scratch / f"repeat-{repeat}.json" if repeat is not None else None
    run_log = scratch / f"repeat-{repeat}.log" if repeat is not None else scratch / "warmup.log"
    argv = bench_throughput_argv(ctx.python, cell, ctx.model_path, output_json, ctx.passthrough)
    header = f"kvgate: {cell.id} throughput {label}: vllm {' '.join(argv[3:])}\n"
    with open(log, "ab") as handle:
        handle.write(header.encode())
    if ctx.echo:
        print(header, end="", flush=True)
    result = run_logged(argv, env=ctx.env, logs=[log, run_log], timeout=remaining, echo=ctx.echo)
    text = run_log.read_text(encoding="utf-8", errors="replace")
    if repeat is None:
        run_log.unlink(missing_ok=True)  # a warm-up's output lives on in the stage log only
    if result.timed_out:
        raise _StageFailed("timeout", f"{label} killed at the stage timeout of {ctx.timeout:.0f} s",
                           result.log_tail)
    if not result.ok:
        raise _StageFailed("error", f"{label}: vllm bench throughput {describe_exit(result.returncode)}",
                           result.log_tail)
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
