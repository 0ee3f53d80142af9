"""Stage health: a requested stage that is missing, marked error or timeout fails; a stage planned for the cell (or
required by the caller) that ended skipped or never ran fails too (a planned stage is a required stage); one
neither planned nor required is "not run", with the plan's reason where it gave one. The kernels and accuracy checks
of a cell.

`require` maps each stage the cell must have run to why (planned, or the gate's --require); `unplanned` maps a
stage the plan left out to its reason."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kvgate.gate.policy import Policy
from kvgate.gate.verdict import Check
from kvgate.results.records import AccuracyResult, CellResults, KernelResult, StageResult


def health_check(cell: CellResults, stage: str, kind: str, require: Mapping[str, str],
                 unplanned: Mapping[str, str] | None = None) -> Check | None:
    """The check for an unhealthy stage (None when the stage is ok)."""
    result = cell.stage(stage)
    health = result.health
    base = dict(cell=cell.identity.id, kind=kind, model=cell.identity.model)
    if health == "ok":
        return None
    if health in ("not_run", "skipped"):
        why = "never ran" if health == "not_run" else f"skipped ({result.status.reason or 'no reason given'})"
        if stage in require:
            return Check(**base, status="missing", detail=f"{stage} stage {why}, but {require[stage]}",
                         headline=f"stage {why}, but {require[stage]}")
        planned = (unplanned or {}).get(stage)
        return Check(**base, status="not_run", detail=planned or f"{stage} stage {why}")
    if result.unreadable:
        return Check(**base, status="error", detail=f"{stage} stage unreadable: {'; '.join(result.unreadable)}",
                     headline=f"unreadable output: {result.unreadable[0]}")
    if health in ("error", "timeout"):
        reason = result.status.reason if result.status and result.status.reason else "no reason given"
        return Check(**base, status="error", detail=f"{stage} stage {health}: {reason}" + first_error_text(result),
                     headline=f"stage {health}: {reason}", log=result.first_error)
    return Check(**base, status="missing", detail=result.missing or f"{stage} outputs are missing")


def first_error_text(result: StageResult) -> str:
    """" | first error: <the log's first real error> (<log>:<line>)", or "" when the log names none or the reason
    already says it (the runners name a failed engine's root cause in their reason)."""
    found = result.first_error
    reason = result.status.reason if result.status and result.status.reason else ""
    if found is None or found.error in reason:
        return ""
    return f" | first error: {found.error} ({found.where})"


def tests_failed(result: StageResult) -> bool:
    """A kernels stage whose pytest run recorded failed tests and no test that broke (a runner of contract 1.8 or
    older marked such a stage error): its tests are judged, FAIL, never an ERROR of the stage."""
    junit = result.data
    return (isinstance(junit, KernelResult) and result.status is not None and result.status.status == "error"
            and not result.unreadable and junit.count("failed") > 0 and junit.count("error") == 0)


def problem_of(message: str) -> str:
    """A kernel test's failure in a few words: pytest's message without its exception name and the test's own case
    id ("AssertionError: vllm_flashmla ragged_short-h16-p64-fp8_e4m3: 21 of 57344 elements outside ..." -> "21 of
    57344 elements outside ...")."""
    text = re.sub(r"^[\w.]*(?:Error|Exception): ", "", message.strip())
    return re.sub(r"^\S+ \S+: (?=\S)", "", text) or message


def kernels_check(cell: CellResults, policy: Policy, require: Mapping[str, str],
                  unplanned: Mapping[str, str] | None = None) -> Check:
    result = cell.stage("kernels")
    unhealthy = None if tests_failed(result) else health_check(cell, "kernels", "kernels", require, unplanned)
    if unhealthy:
        broke = unhealthy.status == "error" and isinstance(result.data, KernelResult)
        return replace(unhealthy, tests=result.data.cases) if broke else unhealthy
    junit = result.data
    total = len(junit.cases)
    passed, skipped = junit.count("passed"), junit.count("skipped")
    failed, errors = junit.count("failed"), junit.count("error")
    figures = {"tests": total, "passed": passed, "failed": failed, "errors": errors, "skipped": skipped}
    base = dict(cell=cell.identity.id, kind="kernels", model=cell.identity.model, figures=figures,
                threshold={"failed": 0, "errors": 0}, threshold_text="0 failed, 0 errors", tests=junit.cases)
    if junit.problems:
        first = junit.problems[0]
        more = f" (+{len(junit.problems) - 1} more)" if len(junit.problems) > 1 else ""
        return Check(**base, status="fail", log=result.first_error,
                     detail=f"{failed} failed, {errors} errors of {total}: {first.name}: {first.message}{more}",
                     headline=f"{failed + errors} of {total} tests failed, first {problem_of(first.message)}")
    minimum = policy.kernels.min_executed_tests
    if passed < minimum:
        return Check(**base, status="fail", detail=f"{passed} kernel tests ran ({skipped} skipped of {total}); "
                                                    f"the policy needs at least {minimum}")
    return Check(**base, status="pass", detail=f"{passed} passed, {skipped} skipped")


def accuracy_check(cell: CellResults, require: Mapping[str, str], unplanned: Mapping[str, str] | None = None) -> Check:
    unhealthy = health_check(cell, "accuracy", "accuracy", require, unplanned)
    if unhealthy:
        return unhealthy
    result: AccuracyResult = cell.stage("accuracy").data
    figures: dict[str, Any] = {"n": result.n}
    parts = []
    for name, score in result.scores.items():
        figures[f"{name}"] = score.mean
        figures[f"{name}_stderr"] = score.stderr
        parts.append(f"{name} {score.mean:.4f}" + (f" ± {score.stderr:.4f}" if score.stderr is not None else ""))
    notes = () if result.samples else ("no per-question sample log (lm-eval --log_samples): comparisons of this "
                                       "cell cannot be paired and fail closed",)
    return Check(cell=cell.identity.id, kind="accuracy", status="pass", model=cell.identity.model, figures=figures,
                 detail=f"{result.task} {', '.join(parts)} (n={result.n if result.n is not None else '?'})",
                 notes=notes)
