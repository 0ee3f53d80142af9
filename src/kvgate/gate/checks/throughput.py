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
from kvgate.results.records import CellResults, RunResults, StageStatus, ThroughputResult
from kvgate.statistics import margins, power


def interleaved(cell: CellResults, base: RunResults | None) -> bool:
    """Both sides' throughput ran by turns (status.json says `interleaved`), so their rounds pair."""
    partner = base.find(cell.identity) if base is not None else None
    statuses = [c.stage("throughput").status for c in (cell, partner) if c is not None]
    return len(statuses) == 2 and all(s is not None and s.interleaved for s in statuses)


def throughput_check(cell: CellResults, baseline: RunResults | None, policy: Policy,
                      require: Mapping[str, str], *, ab: bool = False, interleaved: bool = False,
                      unplanned: Mapping[str, str] | None = None) -> tuple[Check, Pending | None]:
    """The throughput stage's health and, with a baseline, the margin test "current/baseline >= 1 - tolerance".

    Each side's repeats are grouped by the engine that measured them (status.json `engines`; before contract 1.9 each
    repeat had an engine of its own). interleaved (an A/B whose sides took turns) with two engines a side or more:
    the test pairs the engines by round. Otherwise the engine-level test: the repeats' spread within an engine from
    the run, the engine-to-engine SD from the policy's measurement for this cell and model (its run-to-run SD where
    none was measured, and at least that against a stored baseline, which ran at another time)."""
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
    tolerance = tput.tolerance
    reference = "base side" if ab else "baseline"
    engine_sd, engine_sd_source = tput.engine_sd_for(cell.identity.id, cell.identity.model)
    if not ab and engine_sd < tput.run_to_run_sd:
        engine_sd, engine_sd_source = tput.run_to_run_sd, (f"a stored baseline ran at another time: the policy's "
                                                           f"run-to-run {100 * tput.run_to_run_sd:g} %")
    try:
        same_workload(old_stage.data, current)
        old_engines = engine_groups(old_stage.data, old_stage.status, measure)
        cur_engines = engine_groups(current, cell.stage("throughput").status, measure)
        test, notes = _ratio_test(old_engines, cur_engines, interleaved=interleaved, min_ratio=1 - tolerance,
                                  one_run=ab, engine_sd=engine_sd, engine_sd_source=engine_sd_source, tput=tput)
    except ValueError as error:
        return Check(**base, status="error", figures=figures, reference=reference,
                     detail=f"cannot test: {error}", headline=f"cannot test: {error}"), None
    figures.update({"baseline_median": median(old_values), "median": median(values), "ratio": test.ratio,
                    "estimate": test.estimate, "n_baseline": test.n_baseline, "n_current": test.n_current,
                    "engines_baseline": len(old_engines), "engines_current": len(cur_engines),
                    "df": test.df if math.isfinite(test.df) else None, "se_log": test.se_log})
    alpha = test.alpha
    caught = power.ratio_test_power(test.se_log, test.df, tolerance=tolerance, slowdown=POWER_SLOWDOWN, alpha=alpha)
    repeat_sd = _repeat_sd(old_engines, cur_engines, test, tput)
    figures.update({"repeat_sd_log": repeat_sd, "power_at_10_percent": caught})
    notes.append(f"this run's repeats vary {100 * repeat_sd:.3g} % (SD of log {measure}); at that noise the test "
                 f"catches a 10 % slowdown {100 * caught:.3g} % of the time"
                 + ("" if caught >= 0.8 else ": a pass is weak evidence (matrix/policy.toml throughput.measured_noise)"))
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


def _ratio_test(old: list[list[float]], cur: list[list[float]], *, interleaved: bool, min_ratio: float,
                one_run: bool, engine_sd: float | tuple[float, float], engine_sd_source: str,
                tput: Any) -> tuple[margins.RatioTest, list[str]]:
    """The test a comparison of two sides' engines calls for, and the notes that say which and why. one_run: both
    sides ran in one run on one machine (an A/B run, FP8 vs auto): the policy's alpha; else its alpha_unpaired."""
    pair_sd = engine_sd if isinstance(engine_sd, tuple) else (engine_sd, engine_sd)
    if interleaved and min(len(old), len(cur)) >= 2:
        if len(old) != len(cur):  # round K is engine K of each side (before 1.9: repeat K)
            only_base = list(range(len(cur) + 1, len(old) + 1))
            only_cur = list(range(len(old) + 1, len(cur) + 1))
            raise ValueError(f"the interleaved rounds differ: {margins.rounds_text(only_base)} only on the baseline "
                             f"side, {margins.rounds_text(only_cur)} only on the current side")
        rounds = len(old)
        test = margins.paired_ratio_test({k: _mean_level(v) for k, v in enumerate(old[:rounds], 1)},
                                         {k: _mean_level(v) for k, v in enumerate(cur[:rounds], 1)},
                                         min_ratio=min_ratio, alpha=tput.alpha)
        notes = [f"interleaved A/B: paired by round ({rounds} rounds)"]
        if rounds < tput.rounds and all(len(e) == 1 for e in (*old, *cur)):
            notes.append(f"{rounds} interleaved rounds, fewer than the policy's {tput.rounds}: a 10 % slowdown may "
                         "pass")
        return test, notes
    if any(len(e) >= 2 for e in (*old, *cur)):
        test = margins.engine_ratio_test(old, cur, min_ratio=min_ratio,
                                         alpha=tput.alpha if one_run else tput.alpha_unpaired, engine_sd=pair_sd)
        return test, [f"{len(old)} and {len(cur)} engine(s) of {max(map(len, old))}-{max(map(len, cur))} repeats; "
                      f"the engine-to-engine SD: {engine_sd_source}"]
    # one repeat an engine and not paired (results before contract 1.9, a stored baseline): the repeats' spread is
    # the engines' own, and the run-to-run SD is added as before
    test = margins.unpaired_ratio_test([v for e in old for v in e], [v for e in cur for v in e], min_ratio=min_ratio,
                                       alpha=tput.alpha_unpaired, run_to_run_sd=tput.run_to_run_sd)
    return test, [f"one repeat an engine, not paired: the policy's run-to-run SD ({100 * tput.run_to_run_sd:g} %) is "
                  f"part of the test ({tput.run_to_run_sd_source})"]


def _repeat_sd(old: list[list[float]], cur: list[list[float]], test: margins.RatioTest, tput: Any) -> float:
    """The SD of log throughput between repeats this run shows: within the engines where they hold several repeats;
    else what the test's standard error implies (paired rounds: SE = sqrt(2) SD / sqrt(rounds); one repeat an engine
    not paired: SE^2 = SD^2 (1/R_b + 1/R_c) + 2 run-to-run SD^2)."""
    groups = [[math.log(v) for v in e] for e in (*old, *cur) if len(e) >= 2]
    if groups:
        df = sum(len(g) - 1 for g in groups)
        return math.sqrt(sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in groups) / df)
    if test.method == margins.PAIRED_RATIO_METHOD:
        return test.se_log * math.sqrt(test.n_current) / math.sqrt(2)
    repeats = 2 / (1 / test.n_baseline + 1 / test.n_current)
    return math.sqrt(max(0.0, test.se_log**2 - 2 * tput.run_to_run_sd**2) * repeats / 2)


def _mean_level(values: list[float]) -> float:
    """An engine's level: the geometric mean of its repeats (the test works on log throughput)."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


ROUND_FILE = re.compile(r"(?:^|[/\\])repeat-(\d+)\.json$")


def engine_groups(result: ThroughputResult, status: StageStatus | None, measure: str) -> list[list[float]]:
    """A side's figures grouped by the engine that measured them, in engine order (status.json `engines`, contract
    1.9); without that record each repeat is an engine of its own, in repeat order. A repeat file that no engine
    lists, an engine whose repeats are missing, or two files of one repeat number (repeat-01.json, repeat-1.json) is a
    ValueError (the folder does not hold what it says)."""
    numbered: dict[int, float] = {}
    named: dict[int, str] = {}
    for repeat in result.repeats:
        found = ROUND_FILE.search(repeat.source)
        value = getattr(repeat, measure)
        if not found:
            if status is not None and status.engines is not None:
                raise ValueError(f"cannot group by engine: {repeat.source} is not named repeat-N.json")
            numbered[len(numbered) + 1 + 10**9] = value  # an unnamed repeat of an old folder: order only
            continue
        number = int(found[1])
        if number in named:  # repeat-01.json beside repeat-1.json: one would stand for the other unseen
            raise ValueError(f"{named[number]} and {repeat.source} are both repeat {number}")
        named[number] = repeat.source
        if value is not None:
            numbered[number] = value
    if status is None or status.engines is None:
        return [[numbered[n]] for n in sorted(numbered)]
    listed = {n for engine in status.engines for n in engine}
    stray = sorted(set(numbered) - listed)
    if stray:
        raise ValueError(f"repeat-{stray[0]}.json is in no engine of status.json throughput.engines")
    groups = []
    for index, engine in enumerate(status.engines, 1):
        missing = [n for n in engine if n not in numbered]
        if missing:
            raise ValueError(f"engine {index} lists repeat {missing[0]}, whose repeat-{missing[0]}.json is missing")
        groups.append([numbered[n] for n in engine])
    return groups


def same_workload(*results: ThroughputResult) -> None:
    """Every repeat of the sides compared ran one workload: the same prompts (num_requests) of the same input and
    output lengths (total_num_tokens; with ignore_eos each request generates exactly its output length). A side that
    ran fewer tokens a request is faster by that alone, so a difference is a ValueError (nothing to compare)."""
    repeats = [repeat for result in results for repeat in result.repeats]
    for repeat in repeats[1:]:
        first = repeats[0]
        if (repeat.num_requests, repeat.total_num_tokens) != (first.num_requests, first.total_num_tokens):
            raise ValueError(f"the repeats ran different workloads: {first.source} holds {first.num_requests} "
                             f"requests of {first.total_num_tokens} tokens in all, {repeat.source} "
                             f"{repeat.num_requests} of {repeat.total_num_tokens} (the same prompts and input/output "
                             "lengths were expected)")


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
    """FP8/auto throughput ratio: reported; judged where the policy declares an expectation (min_ratio), with the
    margin test H0 "ratio >= min_ratio" over the two cells' engines (each cell's engine-to-engine SD its measured one,
    else the policy's run-to-run SD)."""
    tput = policy.throughput
    expectation = tput.fp8_over_auto_expectation(cell.identity)
    expected = expectation.min_ratio if expectation is not None else None
    measure = tput.metric
    base = dict(cell=cell.identity.id, kind="fp8_throughput", subject=measure, model=cell.identity.model,
                reference="auto cell")
    own = cell.stage("throughput")
    if own.health != "ok":
        return None
    if partner is None or partner.stage("throughput").health != "ok":
        why = "no auto cell in this run" if partner is None else \
            f"the auto cell's throughput stage is {partner.stage('throughput').health.replace('_', ' ')}"
        return Check(**base, status="missing" if expected is not None else "info", detail=f"cannot compare: {why}")
    auto_stage = partner.stage("throughput")
    auto_values = auto_stage.data.values(measure)
    fp8_values = own.data.values(measure)
    unit = UNITS.get(measure, measure)
    sd_auto, source_auto = tput.engine_sd_for(partner.identity.id, partner.identity.model)
    sd_fp8, source_fp8 = tput.engine_sd_for(cell.identity.id, cell.identity.model)
    try:
        same_workload(auto_stage.data, own.data)
        test, notes = _ratio_test(engine_groups(auto_stage.data, auto_stage.status, measure),
                                  engine_groups(own.data, own.status, measure), interleaved=False,
                                  min_ratio=expected or 1.0, one_run=True, engine_sd=(sd_auto, sd_fp8),
                                  engine_sd_source=f"auto {source_auto}; {cell.identity.kv_cache_dtype} {source_fp8}",
                                  tput=tput)
        alpha = test.alpha
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
                    notes=(f"expectation {expectation.where}: {expectation.reason}", *notes))
    return Pending(check=check, test=test, passed_text=text, family="throughput",
                    failed_text=f"{text}: upper bound {test.upper:.3f} < {expected:.2f}",
                    failed_headline=f"fp8/auto ratio {test.estimate:.3f}, upper bound {test.upper:.3f} < "
                                    f"{expected:.2f}",
                    decide=lambda t, adj: margins.throughput_regressed(t, alpha=alpha, adjusted_p=adj))
