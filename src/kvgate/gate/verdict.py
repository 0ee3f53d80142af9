"""The gate's output: one Check per (cell, kind, subject) and the Verdict over them (verdict.json, versioned).

Statuses (docs/results-folder.md): pass | fail | waived | missing | error, plus
    not_run  a stage neither planned nor required (one planned or --require'd that did not run is missing)
    info     a figure reported, never judged (e.g. FP8/auto throughput where the policy expects nothing)

The totals, defined here once (`Totals`), in the words every output uses (`word_of`; kvgate.report.words gives each
its label, icon and colour):
    checks       judged against a threshold: PASS, FAIL, ERROR, MISSING, WAIVED; `failed` = FAIL + ERROR + MISSING
    stages ran   RAN: a stage ran and wrote its outputs, and nothing judged them (no threshold, nothing to compare)
    not judged   SKIPPED (the host could not run the cell), NOT RUN, INFO
The headline ("2 of 6 checks failed"), the badges of report.md and report.html, the grid, verdict.json's `summary`
and junit.xml all count these. junit.xml writes each check as one test case in its word's outcome (JUNIT_OUTCOME),
except that a kernels check whose pytest run left test outcomes is written as those tests, one case each.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate import InputError
from kvgate.results.records import KernelCase, LogPointer

VERDICT_VERSION = "1.6"  # major.minor; readers refuse a newer major
STATUSES = ("fail", "error", "missing", "waived", "pass", "not_run", "info")
FAILING = frozenset({"fail", "error", "missing"})
JUDGED = frozenset({"fail", "error", "missing", "waived", "pass"})
STATUS_LABEL = {"pass": "PASS", "fail": "FAIL", "waived": "WAIVED", "missing": "MISSING", "error": "ERROR",
                "not_run": "NOT RUN", "info": "INFO"}

# The words a check reads as: its status, except RAN (a pass that judged nothing) and SKIPPED (a host that could not)
PASS, FAIL, ERROR, MISSING, WAIVED, RAN, SKIPPED, NOT_RUN, INFO = (
    "pass", "fail", "error", "missing", "waived", "ran", "skipped", "not_run", "info")
WORDS = (FAIL, ERROR, MISSING, WAIVED, PASS, RAN, SKIPPED, NOT_RUN, INFO)  # worst first
CHECK_WORDS = frozenset({FAIL, ERROR, MISSING, WAIVED, PASS})  # judged against a threshold: the run's "checks"
FAILED_WORDS = frozenset({FAIL, ERROR, MISSING})
NOT_JUDGED_WORDS = frozenset({SKIPPED, NOT_RUN, INFO})
# junit.xml: each word's test outcome (passed, failure, error, skipped)
JUNIT_OUTCOME = {PASS: "passed", FAIL: "failure", ERROR: "error", MISSING: "error", WAIVED: "skipped",
                 RAN: "skipped", SKIPPED: "skipped", NOT_RUN: "skipped", INFO: "skipped"}
# a kernel test's outcome in its check's junit.xml cases (a waived kernels check's failed tests are skipped, waived)
KERNEL_TEST_OUTCOME = {"passed": "passed", "failed": "failure", "error": "error", "skipped": "skipped"}


@dataclass(frozen=True, kw_only=True, slots=True)
class WaiverNote:
    reason: str
    issue: str
    expires: str  # YYYY-MM-DD
    expired: bool
    where: str  # e.g. "matrix/waivers.toml waiver[0]"


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    cell: str  # the cell id (e.g. flashinfer_mla-fp8-sm100)
    kind: str  # kernels | accuracy | accuracy_floor | throughput | probe | fp8_accuracy | baseline_accuracy | fp8_throughput | cell
    #            | fp8_kv_cache (the FP8 cell's KV cache really was FP8)
    #            | baseline (the run had none to compare with) | host (the host could not run the cell)
    status: str
    detail: str = ""  # one line a reviewer reads
    headline: str = ""  # the few words the report's first line quotes when this check fails (default: detail)
    subject: str | None = None  # e.g. the lm-eval filter, or the throughput measure
    reference: str | None = None  # what the cell was compared with ("auto cell", "baseline")
    figures: Mapping[str, Any] = field(default_factory=dict)
    threshold: Mapping[str, Any] = field(default_factory=dict)
    threshold_text: str = ""
    p_value: float | None = None
    adjusted_p_value: float | None = None
    interval: tuple[float, float] | None = None
    interval_text: str = ""  # e.g. "95% CI of the drop, points"
    method: str = ""
    notes: tuple[str, ...] = ()
    waiver: WaiverNote | None = None
    model: str = ""
    seconds: float | None = None  # how long the stage this check judges ran (status.json elapsed_s); junit.xml's time
    log: LogPointer | None = None  # where the stage's first real error is (a broken or failed stage's log)
    tests: tuple[KernelCase, ...] = ()  # kernels: pytest's tests with their outcomes and messages

    @property
    def name(self) -> str:
        return f"{self.cell} {self.kind}" + (f" [{self.subject}]" if self.subject else "")

    @property
    def failing(self) -> bool:
        return self.status in FAILING

    @property
    def word(self) -> str:
        """The word every report shows (see the module's docstring)."""
        if self.status == "pass" and not self.threshold:
            return RAN
        if self.status == "not_run" and self.kind == "host":
            return SKIPPED
        return self.status

    def test_outcomes(self) -> list[tuple[KernelCase, str]]:
        """The kernel tests junit.xml writes for this check, each with its outcome there; empty when the check is one
        test case of its own (no tests recorded)."""
        outcomes = [(case, "skipped" if self.word == WAIVED and case.outcome in ("failed", "error")
                     else KERNEL_TEST_OUTCOME.get(case.outcome, "error")) for case in self.tests]
        failing = any(outcome in ("failure", "error") for _, outcome in outcomes)
        if self.word in FAILED_WORDS and not failing:
            return []  # a broken stage whose tests did not fail: the check is its own case, never a pass
        return outcomes


@dataclass(frozen=True, kw_only=True, slots=True)
class Totals:
    """How many checks read each word, and what they add up to (see the module's docstring): the one source of every
    count a report, verdict.json or junit.xml states."""

    words: Mapping[str, int]  # every word of WORDS, worst first
    junit: Mapping[str, int]  # junit.xml's tests, failures, errors, skipped

    @property
    def checks(self) -> int:
        return sum(self.words[w] for w in CHECK_WORDS)

    @property
    def failed(self) -> int:
        return sum(self.words[w] for w in FAILED_WORDS)

    @property
    def stages_ran(self) -> int:
        return self.words[RAN]

    @property
    def not_judged(self) -> int:
        return sum(self.words[w] for w in NOT_JUDGED_WORDS)

    @property
    def entries(self) -> int:
        return sum(self.words.values())

    def summary(self) -> dict[str, int]:
        """verdict.json's `summary`."""
        return {"checks": self.checks, "failed": self.failed, "stages_ran": self.stages_ran,
                "not_judged": self.not_judged, "entries": self.entries, **self.words,
                **{f"junit_{name}": value for name, value in self.junit.items()}}


def totals_of(checks: Sequence[Check]) -> Totals:
    counts = Counter(c.word for c in checks)
    junit = Counter({"tests": 0, "failures": 0, "errors": 0, "skipped": 0})
    for check in checks:
        outcomes = [outcome for _, outcome in check.test_outcomes()] or [JUNIT_OUTCOME[check.word]]
        for outcome in outcomes:
            junit["tests"] += 1
            if outcome != "passed":
                junit[{"failure": "failures", "error": "errors", "skipped": "skipped"}[outcome]] += 1
    return Totals(words={word: counts.get(word, 0) for word in WORDS}, junit=dict(junit))


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    checks: tuple[Check, ...]
    run: str
    baseline: str | None
    today: str
    multiplicity: Mapping[str, Mapping[str, Any]]  # family -> {method, alpha, family_size}
    policy: Mapping[str, Any] = field(default_factory=dict)
    run_info: Mapping[str, Any] = field(default_factory=dict)
    required_stages: tuple[str, ...] = ()

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.failing]

    @property
    def judged(self) -> list[Check]:
        return [c for c in self.checks if c.status in JUDGED]

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def neutral(self) -> bool:
        """Nothing failed, but not everything was tested: nothing was compared with the vLLM before the change (no
        baseline), or the host could not run some cells (planned out)."""
        return self.passed and bool(self.untested)

    @property
    def untested(self) -> list[Check]:
        """The checks that make a passing verdict NEUTRAL."""
        return [c for c in self.checks if c.kind in ("baseline", "host") and c.status == "not_run"]

    def counts(self) -> dict[str, int]:
        counts = Counter(c.status for c in self.checks)
        return {status: counts.get(status, 0) for status in STATUSES}

    def totals(self) -> Totals:
        return totals_of(self.checks)

    @property
    def exit_status(self) -> int:
        return 0 if self.passed else 1


# ---------------------------------------------------------------------------------------------- JSON

def p_value_json(p: float | None) -> float | None:
    """A p-value for verdict.json: 6 significant digits, never 0 (a positive p below the smallest normal double,
    2.2e-308, is written as that; kvgate.statistics.margins computes p-values in log space and clamps them there too)."""
    if p is None or not math.isfinite(p):
        return None
    if p <= 0:  # a degenerate test (no spread at all): written as "below 2.2e-308", never as 0
        return sys.float_info.min
    return max(float(f"{p:.6g}"), sys.float_info.min)


def _clean(value: Any) -> Any:
    """JSON-safe: no NaN/inf (null instead), tuples as lists, floats rounded to 6 decimals for people (p-values
    are not: see p_value_json)."""
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def check_to_dict(check: Check) -> dict[str, Any]:
    record = _clean({
        "cell": check.cell, "kind": check.kind, "subject": check.subject, "status": check.status,
        "model": check.model, "reference": check.reference, "figures": dict(check.figures),
        "threshold": dict(check.threshold), "threshold_text": check.threshold_text,
        "p_value": check.p_value, "adjusted_p_value": check.adjusted_p_value,
        "interval": list(check.interval) if check.interval else None, "interval_text": check.interval_text,
        "method": check.method, "detail": check.detail, "headline": check.headline or check.detail, "notes": list(check.notes),
        "waiver": None if check.waiver is None else {
            "reason": check.waiver.reason, "issue": check.waiver.issue, "expires": check.waiver.expires,
            "expired": check.waiver.expired, "where": check.waiver.where},
        "word": check.word,
        "log": None if check.log is None else {
            "path": check.log.path, "line": check.log.line, "error": check.log.error, "found_by": check.log.found_by,
            "frame": check.log.frame, "url": check.log.url or None},
    })
    if check.tests:
        record["tests"] = [{"name": case.name, "outcome": case.outcome, "message": case.message,
                            "seconds": _clean(case.seconds)} for case in check.tests]
    record["p_value"] = p_value_json(check.p_value)
    record["adjusted_p_value"] = p_value_json(check.adjusted_p_value)
    return record


def to_dict(verdict: Verdict) -> dict[str, Any]:
    from kvgate import __version__ as kvgate_version

    record = _clean({
        "verdict_version": VERDICT_VERSION,
        "kvgate_version": kvgate_version,
        "passed": verdict.passed,
        "neutral": verdict.neutral,
        "exit_status": verdict.exit_status,
        "run": verdict.run,
        "baseline": verdict.baseline,
        "today": verdict.today,
        "required_stages": list(verdict.required_stages),
        "summary": verdict.totals().summary(),
        "multiplicity": {k: dict(v) for k, v in verdict.multiplicity.items()},
        "policy": dict(verdict.policy),
        "run_info": dict(verdict.run_info),
    })
    record["checks"] = [check_to_dict(c) for c in verdict.checks]  # cleaned there, p-values kept
    return record


def check_version(data: Mapping[str, Any], source: str) -> None:
    """Refuse a verdict.json of a newer major version than this kvgate writes."""
    version = data.get("verdict_version")
    if not isinstance(version, str) or not version.split(".", 1)[0].isdigit():
        raise InputError(source, f"missing or malformed verdict_version ({version!r})", "the top level")
    if int(version.split(".", 1)[0]) > int(VERDICT_VERSION.split(".", 1)[0]):
        raise InputError(source, f"verdict version {version} is newer than this kvgate reads ({VERDICT_VERSION})",
                         "verdict_version", "Upgrade kvgate")


def sort_key(check: Check, order: Sequence[str] = STATUSES) -> tuple[int, str, str, str]:
    return (order.index(check.status) if check.status in order else len(order), check.cell, check.kind,
            check.subject or "")
