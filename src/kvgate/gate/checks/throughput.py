"""Throughput: the stage's health and, with a baseline, the margin test "current/baseline >= 1 - tolerance"; the
FP8/auto ratio, judged only where the policy declares an expectation."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kvgate.gate.checks.formatting import UNITS, median
from kvgate.gate.checks.health import health_check
from kvgate.gate.checks.pending import Pending
from kvgate.gate.policy import Policy
from kvgate.gate.verdict import Check
from kvgate.results.records import CellResults, RunResults, ThroughputResult
from kvgate.statistics import margins, power


def throughput_check(cell: CellResults, baseline: RunResults | None, policy: Policy,
                      require: Mapping[str, str], *, ab: bool = False, interleaved: bool = False,
                      unplanned: Mapping[str, str] | None = None) -> tuple[Check, Pending | None]:
    """The throughput stage's health and, with a baseline, the margin test "current/baseline >= 1 - tolerance".

    interleaved: the baseline is the base side of an A/B run whose repeats ran by turns (base repeat N, head
    repeat N, ...): the test pairs repeats by round N. Otherwise (a stored baseline, or sides not interleaved)
    the two runs' means also differ by the policy's run-to-run SD, which the test adds."""
    unhealthy = health_check(cell, "throughput", "throughput", require, unplanned)
    if unhealthy:
        return unhealthy, None
    current: ThroughputResult = cell.stage("throughput").data
    measure = policy.throughput.metric
    values = current.values(measure)
    figures = throughput_figures(current)
    base = dict(cell=cell.identity.id, kind="throughput", subject=measure, model=cell.identity.model)
    if not values:
        return Check(**base, status="missing", figures=figures,
                     detail=f"no {measure} figure in any repeat (output tokens/s comes from the *.log files)"), None
    summary = f"{median(values):.4g} {UNITS.get(measure, measure)} (median of {len(values)})"
    old_cell = baseline.find(cell.identity) if baseline is not None else None
    if baseline is None:
        return Check(**base, status="pass", figures=figures, detail=f"{summary}; no baseline given"), None
    if old_cell is None:
        if ab:
            return Check(**base, status="missing", figures=figures, reference="base side",
                         detail=f"{summary}; the base side of this A/B run has no such cell"), None
        return Check(**base, status="pass", figures=figures, detail=f"{summary}; new cell, not in the baseline"), None
    old_stage = old_cell.stage("throughput")
    if old_stage.health != "ok":
        if ab and old_stage.health != "not_run":
            return Check(**base, status="error" if old_stage.health in ("error", "timeout") else "missing",
                         figures=figures, reference="base side",
                         detail=f"{summary}; the base side's throughput stage is {old_stage.health}"), None
        return Check(**base, status="pass", figures=figures,
                     detail=f"{summary}; the baseline has no usable throughput for this cell ({old_stage.health})"), None
    old_values = old_stage.data.values(measure)
    if not old_values:
        return Check(**base, status="pass", figures=figures,
                     detail=f"{summary}; the baseline has no {measure} figure for this cell"), None
    tput = policy.throughput
    tolerance, alpha = tput.tolerance, tput.alpha if interleaved else tput.alpha_unpaired
    reference = "base side" if ab else "baseline"
    try:
        if interleaved:
            test = margins.paired_ratio_test(rounds(old_stage.data, measure), rounds(current, measure),
                                           min_ratio=1 - tolerance, alpha=alpha)
        else:
            test = margins.unpaired_ratio_test(old_values, values, min_ratio=1 - tolerance, alpha=alpha,
                                             run_to_run_sd=tput.run_to_run_sd)
    except ValueError as error:
        return Check(**base, status="error", figures=figures, reference=reference,
                     detail=f"cannot test: {error}", headline=f"cannot test: {error}"), None
    figures.update({"baseline_median": median(old_values), "median": median(values), "ratio": test.ratio,
                    "estimate": test.estimate, "n_baseline": test.n_baseline, "n_current": test.n_current,
                    "df": test.df if math.isfinite(test.df) else None, "se_log": test.se_log})
    notes = [f"interleaved A/B: paired by round ({test.n_current} rounds)" if interleaved else
             f"runs not interleaved: the policy's run-to-run SD ({100 * tput.run_to_run_sd:g} %) is part of the test "
             f"({tput.run_to_run_sd_source})"]
    repeat_sd, caught = repeat_noise_power(test, tput, interleaved=interleaved)
    figures.update({"repeat_sd_log": repeat_sd, "power_at_10_percent": caught})
    notes.append(f"this run's repeats vary {100 * repeat_sd:.3g} % (SD of log {measure}); at that noise the test "
                 f"catches a 10 % slowdown {100 * caught:.3g} % of the time"
                 + ("" if caught >= 0.8 else ": a pass is weak evidence (matrix/policy.toml throughput.measured_noise)"))
    if interleaved and test.n_current < tput.rounds:
        notes.append(f"{test.n_current} interleaved rounds, fewer than the policy's {tput.rounds}: a 10 % slowdown "
                     "may pass")
    check = Check(**base, status="pending", figures=figures, reference=reference,
                  threshold={"min_ratio": 1 - tolerance, "alpha": alpha},
                  threshold_text=f"ratio ≥ {1 - tolerance:.2f}", p_value=test.p_value,
                  interval=(test.lower, test.upper),
                  interval_text=f"one-sided {1 - alpha:.0%} bounds of the current/{reference} ratio (fails when the "
                                f"upper one is below {1 - tolerance:.2f})",
                  method=test.method, notes=tuple(notes))
    text = (f"{median(old_values):.4g} -> {median(values):.4g} {UNITS.get(measure, measure)}, "
            f"ratio {test.ratio:.3f} (tested {test.estimate:.3f}, bounds [{test.lower:.3f}, {test.upper:.3f}])")
    return check, Pending(check=check, test=test, passed_text=text,
                           failed_text=f"{text}: upper bound {test.upper:.3f} < {1 - tolerance:.2f}",
                           failed_headline=f"ratio {test.estimate:.3f}, upper bound {test.upper:.3f} < "
                                           f"{1 - tolerance:.2f} vs {reference}",
                           family="throughput",
                           decide=lambda t, adj: margins.throughput_regressed(t, alpha=alpha, adjusted_p=adj))


POWER_SLOWDOWN = 0.10  # the slowdown each throughput check states its power for


def repeat_noise_power(test: margins.RatioTest, tput: Any, *, interleaved: bool) -> tuple[float, float]:
    """The per-repeat SD of log throughput the test's own standard error implies, and the power the check had at it
    to catch a POWER_SLOWDOWN slowdown (kvgate.statistics.power: the paired test over its rounds, or a stored
    baseline with the policy's run-to-run SD)."""
    if interleaved:  # SE of the mean paired difference = sqrt(2) x repeat SD / sqrt(rounds)
        repeat_sd = test.se_log * math.sqrt(test.n_current) / math.sqrt(2)
        return repeat_sd, power.paired_rounds_power(test.n_current, repeat_sd=repeat_sd, tolerance=tput.tolerance,
                                                    slowdown=POWER_SLOWDOWN, alpha=test.alpha)
    # SE^2 = repeat SD^2 (1/R_b + 1/R_c) + 2 run-to-run SD^2 (margins.unpaired_ratio_test); R = their harmonic mean
    repeats = 2 / (1 / test.n_baseline + 1 / test.n_current)
    repeat_sd = math.sqrt(max(0.0, test.se_log**2 - 2 * tput.run_to_run_sd**2) * repeats / 2)
    return repeat_sd, power.stored_power(repeats, repeat_sd=repeat_sd, run_to_run_sd=tput.run_to_run_sd,
                                         tolerance=tput.tolerance, slowdown=POWER_SLOWDOWN, alpha=test.alpha)


ROUND_FILE = re.compile(r"(?:^|[/\\])repeat-(\d+)\.json$")


def rounds(result: ThroughputResult, measure: str) -> dict[int, float]:
    """Repeats by round N (throughput/repeat-N.json), for interleaved A/B pairing."""
    rounds: dict[int, float] = {}
    for repeat in result.repeats:
        found = ROUND_FILE.search(repeat.source)
        if not found:
            raise ValueError(f"cannot pair by round: {repeat.source} is not named repeat-N.json")
        value = getattr(repeat, measure)
        if value is not None:
            rounds[int(found[1])] = value
    return rounds


def throughput_figures(result: ThroughputResult) -> dict[str, Any]:
    rps = result.values("requests_per_second")
    figures: dict[str, Any] = {
        "repeats": len(result.repeats), "median_requests_per_second": median(rps),
        "requests_per_second": rps, "median_tokens_per_second": median(result.values("tokens_per_second"))}
    output = result.values("output_tokens_per_second")
    if output:
        figures["median_output_tokens_per_second"] = median(output)
    return figures


def fp8_throughput_check(cell: CellResults, partner: CellResults | None, policy: Policy) -> Any:
    """FP8/auto throughput ratio: reported; judged where the policy declares an expectation (min_ratio), with
    the margin test H0 "ratio >= min_ratio" (two cells of one run are not interleaved: run-to-run SD added)."""
    tput = policy.throughput
    expectation = tput.fp8_over_auto_expectation(cell.identity)
    expected = expectation.min_ratio if expectation is not None else None
    measure, alpha = tput.metric, tput.alpha_unpaired
    base = dict(cell=cell.identity.id, kind="fp8_throughput", subject=measure, model=cell.identity.model,
                reference="auto cell")
    own = cell.stage("throughput")
    if own.health != "ok":
        return None
    if partner is None or partner.stage("throughput").health != "ok":
        why = "no auto cell in this run" if partner is None else \
            f"the auto cell's throughput stage is {partner.stage('throughput').health.replace('_', ' ')}"
        return Check(**base, status="missing" if expected is not None else "info", detail=f"cannot compare: {why}")
    auto_values = partner.stage("throughput").data.values(measure)
    fp8_values = own.data.values(measure)
    unit = UNITS.get(measure, measure)
    try:
        test = margins.unpaired_ratio_test(auto_values, fp8_values, min_ratio=expected or 1.0, alpha=alpha,
                                         run_to_run_sd=tput.run_to_run_sd)
    except ValueError as error:
        if expected is None and auto_values and fp8_values:  # reported anyway, without bounds
            ratio = median(fp8_values) / median(auto_values)
            return Check(**base, status="info", figures={"ratio": ratio}, detail=f"ratio {ratio:.3f} ({error})")
        return Check(**base, status="error" if expected is not None else "info", detail=f"cannot compare: {error}")
    figures = {"auto_median": median(auto_values), "fp8_median": median(fp8_values), "ratio": test.ratio,
               "estimate": test.estimate, "n_auto": test.n_baseline, "n_fp8": test.n_current}
    text = (f"auto {median(auto_values):.4g} -> {cell.identity.kv_cache_dtype} {median(fp8_values):.4g} {unit}, "
            f"ratio {test.ratio:.3f} (tested {test.estimate:.3f}, bounds [{test.lower:.3f}, {test.upper:.3f}])")
    check = Check(**base, status="info", figures=figures, p_value=test.p_value, interval=(test.lower, test.upper),
                  interval_text=f"one-sided {1 - alpha:.0%} bounds of the fp8/auto ratio", method=test.method,
                  detail=f"{text} (reported; the policy expects no ratio here)")
    if expected is None:
        return check
    check = replace(check, status="pending", threshold={"min_ratio": expected, "alpha": alpha},
                    threshold_text=f"ratio ≥ {expected:.2f}",
                    notes=(f"expectation {expectation.where}: {expectation.reason}",))
    return Pending(check=check, test=test, passed_text=text, family="throughput",
                    failed_text=f"{text}: upper bound {test.upper:.3f} < {expected:.2f}",
                    failed_headline=f"fp8/auto ratio {test.estimate:.3f}, upper bound {test.upper:.3f} < "
                                    f"{expected:.2f}",
                    decide=lambda t, adj: margins.throughput_regressed(t, alpha=alpha, adjusted_p=adj))
