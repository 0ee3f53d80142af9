"""A verdict -> one history run and its figures per cell: what the history of main keeps of each gate run.

Pure: the gate's CLI hands the verdict over, with each cell's kernel timings (kernels/timings.json, read by
kvgate.kernels.timings: the verdict does not carry them), and kvgate.history.store writes the rows.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kvgate.gate.verdict import Verdict

HISTORY_BRANCH = "main"  # the branch whose gate runs the history keeps (run.json `branch`)
Z_95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval
# throughput check figure -> the measure the history keeps
THROUGHPUT_MEASURES = {
    "median_requests_per_second": "throughput:requests_per_second",
    "median_tokens_per_second": "throughput:tokens_per_second",
    "median_output_tokens_per_second": "throughput:output_tokens_per_second",
}
ENVIRONMENT_KEYS = ("python", "gpu", "driver", "cpu", "cpu_count", "host", "arch", "versions", "repository", "source",
                    "build_url", "workflow_run_id")  # run.json's; `repository` makes the commits links
KERNEL_MEASURE = "kernels:{family}/{kv_cache_dtype}/{spec}:median_us"  # one per timed kernel case of a cell


class TimedKernelCase(Protocol):
    """What the history keeps of one entry of kernels/timings.json (kvgate.kernels.timings.TimingEntry, frozen)."""

    @property
    def family(self) -> str: ...
    @property
    def kv_cache_dtype(self) -> str: ...
    @property
    def spec(self) -> str: ...
    @property
    def median_us(self) -> float: ...
    @property
    def repeats(self) -> int: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Figure:
    """One measure of one cell in one run; `low`/`high` bound its 95 % interval when it has one."""

    cell: str
    measure: str  # e.g. "accuracy:strict-match", "throughput:requests_per_second", KERNEL_MEASURE
    value: float
    low: float | None = None
    high: float | None = None
    n: int | None = None  # questions (accuracy) or repeats (throughput, kernel timings)


@dataclass(frozen=True, kw_only=True, slots=True)
class HistoryRun:
    """One gate run on main: who it ran, on what, what the gate said, and its figures."""

    recorded_at: str  # ISO 8601, UTC: the history's order
    branch: str
    commit: str | None  # the commit the run was made from (run.json `commit`)
    vllm_version: str | None
    vllm_commit: str | None  # the head side's source commit, when it ran a checkout
    passed: bool
    neutral: bool
    exit_status: int
    run_folder: str
    environment: Mapping[str, Any]
    figures: tuple[Figure, ...]


def branch_of(run_info: Mapping[str, Any]) -> str | None:
    """The branch run.json says the run was made for (`branch`, contract 1.8); None when it names none."""
    branch = run_info.get("branch")
    return branch if isinstance(branch, str) and branch else None


def is_main(run_info: Mapping[str, Any]) -> bool:
    return branch_of(run_info) == HISTORY_BRANCH


def history_run(verdict: Verdict, *, recorded_at: str,
                kernel_timings: Mapping[str, Iterable[TimedKernelCase]] | None = None) -> HistoryRun:
    """The row a gate run on main leaves in the history: the verdict's head figures per cell, and the kernel
    timings of each cell that has them (cell id -> its timings.json entries)."""
    info = verdict.run_info
    head = info.get("vllm_under_test", {}).get("head", {}) if isinstance(info.get("vllm_under_test"), Mapping) else {}
    head = head if isinstance(head, Mapping) else {}
    versions = info.get("versions") if isinstance(info.get("versions"), Mapping) else {}
    return HistoryRun(
        recorded_at=recorded_at, branch=branch_of(info) or "", commit=_text(info.get("commit")),
        vllm_version=_text(head.get("version")) or _text(versions.get("vllm")),
        vllm_commit=_text(head.get("source_commit")), passed=verdict.passed, neutral=verdict.neutral,
        exit_status=verdict.exit_status, run_folder=verdict.run,
        environment={key: info[key] for key in ENVIRONMENT_KEYS if key in info},
        figures=(*figures_of(verdict), *kernel_figures(kernel_timings or {})))


def run_time(run_info: Mapping[str, Any]) -> str | None:
    """When the run itself was made (run.json `finished_at`, else `started_at`), as ISO 8601 UTC; None when it says
    neither in a form that can be read (then the gate's own time stands, and says so)."""
    for key in ("finished_at", "started_at"):
        value = run_info.get(key)
        if not isinstance(value, str) or len(value) > 40:
            continue
        try:
            when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            when = (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
        except (ValueError, OverflowError):  # OverflowError: year 1 east of UTC, year 9999 west, moved to UTC
            continue
        return when.isoformat(timespec="seconds").replace("+00:00", "Z")
    return None


_SHA = re.compile(r"[0-9a-f]{7,40}")
_GITHUB = re.compile(r"^(?:https://github\.com/|git@github\.com:|ssh://git@github\.com/)?"
                     r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?:\.git)?/?$")


def commit_url(repository: Any, commit: str | None) -> str | None:
    """A commit's page on GitHub, from run.json's `repository` ("owner/name", as GitHub Actions writes it, or a GitHub
    clone URL, as Buildkite does); None for another host or a value that is not one."""
    if not isinstance(repository, str) or not commit or not _SHA.fullmatch(commit):
        return None
    match = _GITHUB.match(repository.strip())
    if match is None or (repository.strip().count("/") > 1 and "github.com" not in repository):
        return None
    return f"https://github.com/{match['repo']}/commit/{commit}"


VLLM_REPOSITORY = "vllm-project/vllm"  # where a head side's source commit is looked up (forks' commits resolve there)


def figures_of(verdict: Verdict) -> list[Figure]:
    """Accuracy per filter (with the 95 % interval of its standard error) and the throughput medians, per cell;
    from the `accuracy` and `throughput` checks, whichever status they have (a failed run's figures are history)."""
    found: list[Figure] = []
    for check in verdict.checks:
        figures = check.figures
        if check.kind == "accuracy":
            n = figures.get("n") if isinstance(figures.get("n"), int) else None
            for name, value in figures.items():
                if name == "n" or name.endswith("_stderr") or not _finite(value):
                    continue
                stderr = figures.get(f"{name}_stderr")
                low, high = ((max(0.0, value - Z_95 * stderr), min(1.0, value + Z_95 * stderr)) if _finite(stderr)
                             else (None, None))  # an accuracy is a share: its interval stays within 0..1
                found.append(Figure(cell=check.cell, measure=f"accuracy:{name}", value=float(value), low=low,
                                    high=high, n=n))
        elif check.kind == "throughput":
            repeats = figures.get("repeats") if isinstance(figures.get("repeats"), int) else None
            for name, measure in THROUGHPUT_MEASURES.items():
                if _finite(figures.get(name)):
                    found.append(Figure(cell=check.cell, measure=measure, value=float(figures[name]), n=repeats))
    return found


def kernel_figures(kernel_timings: Mapping[str, Iterable[TimedKernelCase]]) -> list[Figure]:
    """Per cell, the median time of each timed kernel case (family, kv cache dtype, shape), in µs, over its repeats;
    a case timed twice in one file keeps its last entry (the history holds one figure per cell and measure)."""
    found: dict[tuple[str, str], Figure] = {}
    for cell, cases in sorted(kernel_timings.items()):
        for case in cases:
            measure = KERNEL_MEASURE.format(family=case.family, kv_cache_dtype=case.kv_cache_dtype, spec=case.spec)
            if _finite(case.median_us):
                found[cell, measure] = Figure(cell=cell, measure=measure, value=float(case.median_us), n=case.repeats)
    return list(found.values())


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
