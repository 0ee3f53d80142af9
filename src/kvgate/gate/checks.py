"""The gate, pure: run results (+ baseline) + policy + waivers + today -> Verdict. No I/O.

Checks, one per (cell, kind[, subject]):
    kernels            the cell's kernel tests: any failed or errored test fails it; none run fails it
    accuracy           the accuracy stage ran and parsed (figures per lm-eval filter)
    accuracy_floor     an auto cell against its workload's expected accuracy (workloads.toml), where declared
    throughput         the throughput stage ran; with a baseline, the margin test of current/baseline req/s
    probe              the probe stage ran; for FP8 cells, logprob agreement with the auto cell's probe
    fp8_accuracy       FP8 cell vs the auto cell of the same backend, arch, model, task: the margin test on the
                       policy's primary filter; the other filters reported (info)
    baseline_accuracy  cell vs the same cell in the baseline run (or the A/B run's base side); the same
    fp8_throughput     FP8/auto throughput ratio: judged only where the policy declares an expectation
    fp8_kv_cache       FP8 cell: the KV cache its accuracy stage's engine really held (status.json accuracy.kv_cache)
                       was FP8: 1-byte cache elements, layers built for an FP8 dtype, and about twice the auto
                       cell's tokens (policy kv_cache.fp8_min_token_ratio); results of contract 1.4 on without
                       that evidence error, older ones are not judged
    cell               a cell of the baseline is absent from this run
    host               a cell the host that wrote the run could not run (run.json planned_out): not_run, so the verdict
                       is NEUTRAL; missing (failing) under require_baseline, which CI passes

Stage health fails closed: a requested stage that is missing, marked error or timeout fails; a stage
never requested is "not run" (missing, so failing, when the caller requires it). Comparisons are one-sided
tests of "within the margin" (kvgate.gate.stats), each at the policy's alpha; the policy's multiplicity method
(none by default, see matrix/policy.toml) adjusts the p-values of each family before deciding. Sample logs that
cannot be paired question by question are an error of the comparison, never a fallback.
A check covered by a live waiver reads WAIVED whatever it measured; an expired waiver does not apply.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvgate.gate import power, probe_agreement, sequential, stats
from kvgate.gate.policy import Policy
from kvgate.gate.verdict import Check, Verdict, WaiverNote
from kvgate.results.records import (
    BASE,
    HEAD,
    KV_CACHE_EVIDENCE_SINCE,
    STAGES,
    AccuracyResult,
    CellIdentity,
    CellResults,
    KvCacheEvidence,
    RunResults,
    SampleOutcomes,
    ThroughputResult,
    contract_version_tuple,
)

KIND_ORDER = ("baseline", "host", "cell", "kernels", "accuracy", "fp8_kv_cache", "accuracy_floor", "fp8_accuracy",
              "baseline_accuracy", "throughput", "fp8_throughput", "probe")
UNITS = {"requests_per_second": "req/s", "tokens_per_second": "tok/s", "output_tokens_per_second": "output tok/s"}
WaiverLookup = Callable[[CellIdentity, str], Any]  # -> matrix.Waiver | None


@dataclass(slots=True)
class _Pending:
    """A check whose decision waits for the adjusted p-value."""

    check: Check
    test: Any
    decide: Callable[[Any, float | None], bool]
    passed_text: str
    failed_text: str
    failed_headline: str = ""
    family: str = "accuracy"  # accuracy | throughput: p-values are adjusted per family


def evaluate(run: RunResults, *, policy: Policy, baseline: RunResults | None = None,
             waiver_for: WaiverLookup | None = None, today: dt.date, require: Sequence[str] = (),
             probe_compare: Callable[[Any, Any], Any] | None = probe_agreement.compare, ab: bool = False,
             require_baseline: bool = False, planned: Sequence[tuple[str, str]] = (),
             planned_out: Sequence[tuple[str, str]] = ()) -> Verdict:
    """The verdict on `run` (its head cells).

    ab: `baseline` is the base side of the same A/B run (same machine, same job): every head cell must have its
    base counterpart, and a missing or failed one fails the comparison. require_baseline: with no baseline at
    all the run fails (a change compared with nothing is not a pass); without it the run is neutral.
    planned: (cell id, side) pairs the run was asked for (run.json, --expect-cells); an absent one fails.
    planned_out: (cell id, reason) of cells the writing host could not run (run.json planned_out).
    """
    checks: list[Check] = _planned_checks(run, baseline if ab else None, planned)
    checks += _planned_out_checks(run, planned_out, require_baseline)
    pending: list[_Pending] = []
    if baseline is None:
        checks.append(_no_baseline_check(require_baseline))
    for cell in run.cells:
        checks.append(_kernels_check(cell, policy, require))
        checks.append(_accuracy_check(cell, require))
        floor = _accuracy_floor_check(cell, policy)
        if floor is not None:
            (pending.append(floor) if isinstance(floor, _Pending) else checks.append(floor))
        throughput_check, throughput_pending = _throughput_check(cell, baseline, policy, require, ab=ab,
                                                                 interleaved=ab and _interleaved(cell, baseline))
        if throughput_pending:
            pending.append(throughput_pending)
        else:
            checks.append(throughput_check)
        checks.append(_probe_check(cell, run, policy, require, probe_compare))
        if cell.identity.is_fp8:
            partner = run.find(cell.identity.with_dtype("auto"))
            for item in _fp8_accuracy_checks(cell, partner, policy):
                (pending.append(item) if isinstance(item, _Pending) else checks.append(item))
            item = _fp8_throughput_check(cell, partner, policy)
            if isinstance(item, _Pending):
                pending.append(item)
            elif item is not None:
                checks.append(item)
            checks.append(_fp8_kv_cache_check(cell, partner, run, policy))
        if baseline is not None:
            for item in _baseline_accuracy_checks(cell, baseline.find(cell.identity), policy, ab=ab):
                (pending.append(item) if isinstance(item, _Pending) else checks.append(item))
    if baseline is not None:
        for old in baseline.cells:
            if run.find(old.identity) is None:
                checks.append(Check(cell=old.identity.id, kind="cell", status="missing", model=old.identity.model,
                                    reference="baseline",
                                    detail=f"in the baseline ({old.folder}) but not in this run"))
    # Multiplicity: the decisions are margin tests, each at alpha (policy.toml says why no adjustment is needed);
    # a method other than none adjusts the p-values of each family. Sequential comparisons decide by their
    # boundaries (family "sequential") and are never adjusted.
    adjusted_by_id: dict[int, float] = {}
    family_sizes = {}
    for family, method in (("accuracy", policy.accuracy.multiplicity), ("throughput", policy.throughput.multiplicity)):
        members = [p for p in pending if p.family == family and getattr(p.test, "p_value", None) is not None]
        family_sizes[family] = len(members)
        if members:
            adjusted = stats.adjust_p_values([p.test.p_value for p in members], method)
            adjusted_by_id.update({id(p): a for p, a in zip(members, adjusted, strict=True)})
    for item in pending:
        checks.append(_decide(item, adjusted_by_id.get(id(item))))
    if waiver_for is not None:
        identities = {(c.identity.id, c.identity.model): c.identity
                      for results in (baseline, run) if results is not None for c in results.cells}
        checks = [_apply_waiver(c, identities.get((c.cell, c.model)), waiver_for, today) for c in checks]
    checks = _name_models_where_ids_repeat(checks)
    checks.sort(key=lambda c: (c.cell, KIND_ORDER.index(c.kind), c.subject or ""))
    return Verdict(checks=tuple(checks), run=run.folder, baseline=baseline.folder if baseline else None,
                   today=today.isoformat(), multiplicity={
                       "accuracy": {"method": policy.accuracy.multiplicity, "alpha": policy.accuracy.alpha,
                                    "family_size": family_sizes["accuracy"]},
                       "throughput": {"method": policy.throughput.multiplicity, "alpha": policy.throughput.alpha,
                                      "family_size": family_sizes["throughput"]}},
                   policy=policy_summary(policy), run_info=dict(run.run_info), required_stages=tuple(require))


RUN = "(run)"  # the `cell` of checks about the run as a whole


def _interleaved(cell: CellResults, base: RunResults | None) -> bool:
    """Both sides' throughput repeats ran by turns (status.json says `interleaved`), so rounds pair."""
    partner = base.find(cell.identity) if base is not None else None
    statuses = [c.stage("throughput").status for c in (cell, partner) if c is not None]
    return len(statuses) == 2 and all(s is not None and s.interleaved for s in statuses)


def _planned_checks(run: RunResults, base: RunResults | None, planned: Sequence[tuple[str, str]]) -> list[Check]:
    """A planned cell that left no folder (a run killed between cells, an artifact lost) fails, named."""
    present = {(c.identity.id, HEAD) for c in run.cells}
    if base is not None:
        present |= {(c.identity.id, BASE) for c in base.cells}
    missing = [(cell, side) for cell, side in dict.fromkeys(planned) if (cell, side) not in present]
    return [Check(cell=cell, kind="cell", status="missing", reference=side if side != HEAD else None,
                  detail=f"planned{' (' + side + ' side)' if side != HEAD else ''} but no folder of this run holds "
                         f"it: the cell never started, or its results were lost on the way to the gate",
                  headline="planned, but absent from the run") for cell, side in missing]


def _planned_out_checks(run: RunResults, planned_out: Sequence[tuple[str, str]], required: bool) -> list[Check]:
    """Cells the host could not run: NEUTRAL (nothing failed, but they were not tested), or failing when the caller
    requires a complete comparison (CI). A cell that another invocation did run into the same folder is judged as
    usual instead."""
    present = {c.identity.id for c in run.cells}
    out = []
    for cell, reason in planned_out:
        if cell in present:
            continue
        detail = f"not run: the host that made this run could not run it ({reason})"
        if required:
            out.append(Check(cell=cell, kind="host", status="missing", detail=f"{detail}; --require-baseline needs "
                             "every cell run", headline=f"not run on this host: {reason}"))
        else:
            out.append(Check(cell=cell, kind="host", status="not_run", headline=f"not run on this host: {reason}",
                             detail=f"{detail}; the verdict is NEUTRAL (CI passes --require-baseline, which fails it)"))
    return out


def _no_baseline_check(required: bool) -> Check:
    what = ("compared with nothing: the run has no base side (kvgate run --base-vllm) and no --baseline was "
            "given, so no check could see a regression that the change itself caused")
    if required:
        return Check(cell=RUN, kind="baseline", status="missing", detail=f"{what}; --require-baseline makes it fail",
                     headline="no baseline: the change was compared with nothing")
    return Check(cell=RUN, kind="baseline", status="not_run",
                 detail=f"{what}; the verdict is NEUTRAL (CI passes --require-baseline, which fails it)")


def _name_models_where_ids_repeat(checks: list[Check]) -> list[Check]:
    """A cell id names backend, dtype and arch; where one id holds several models, add the model to the name."""
    models: dict[str, set[str]] = {}
    for check in checks:
        models.setdefault(check.cell, set()).add(check.model)
    shared = {cell for cell, names in models.items() if len(names) > 1}
    if not shared:
        return checks
    every_model = {m for cell in shared for m in models[cell]}
    short = {m: m.rstrip("/").rsplit("/", 1)[-1] for m in every_model}
    if len(set(short.values())) < len(short):
        short = {m: m for m in every_model}
    return [replace(c, cell=f"{c.cell} [{short[c.model]}]") if c.cell in shared else c for c in checks]


def policy_summary(policy: Policy) -> dict[str, Any]:
    """The thresholds a verdict was judged with (verdict.json)."""
    acc, tput = policy.accuracy, policy.throughput
    return {"source": policy.source, "fp8_tax_points": acc.fp8_tax_points,
            "fp8_tax_points_by_model": dict(acc.fp8_tax_points_by_model),
            "baseline_margin_points": acc.baseline_margin_points, "accuracy_alpha": acc.alpha,
            "accuracy_multiplicity": acc.multiplicity, "primary_filter": acc.primary_filter,
            "filters": list(acc.filters), "min_n": acc.min_n, "questions": acc.questions,
            "sequential_looks": list(acc.sequential.looks), "throughput_tolerance": tput.tolerance,
            "throughput_alpha": tput.alpha, "throughput_alpha_unpaired": tput.alpha_unpaired,
            "throughput_multiplicity": tput.multiplicity,
            "throughput_metric": tput.metric, "run_to_run_sd": tput.run_to_run_sd, "rounds": tput.rounds,
            "fp8_over_auto": [{"where": e.where, "min_ratio": e.min_ratio, "reason": e.reason}
                              for e in tput.fp8_over_auto],
            "accuracy_floors": [{"workload": f.workload, "model": f.model, "expected": dict(f.expected),
                                 "rtol": f.rtol} for f in policy.floors],
            "kernels_min_executed_tests": policy.kernels.min_executed_tests,
            "fp8_kv_cache_min_token_ratio": policy.kv_cache.fp8_min_token_ratio}


# ---------------------------------------------------------------------------------------------- stage health

def _health_check(cell: CellResults, stage: str, kind: str, require: Sequence[str]) -> Check | None:
    """The check for an unhealthy stage (None when the stage is ok)."""
    result = cell.stage(stage)
    health = result.health
    base = dict(cell=cell.identity.id, kind=kind, model=cell.identity.model)
    if health == "ok":
        return None
    if health in ("not_run", "skipped"):
        why = "never requested" if health == "not_run" else f"skipped ({result.status.reason or 'no reason given'})"
        if stage in require:
            return Check(**base, status="missing", detail=f"{stage} stage {why}, but the gate requires it",
                         headline=f"stage {why}, but the gate requires it")
        return Check(**base, status="not_run", detail=f"{stage} stage {why}")
    if health in ("error", "timeout"):
        reason = result.status.reason if result.status and result.status.reason else "no reason given"
        tail = _last_line(result.status.log_tail if result.status else None)
        return Check(**base, status="error", detail=f"{stage} stage {health}: {reason}" + (f" | {tail}" if tail else ""),
                     headline=f"stage {health}: {reason}")
    return Check(**base, status="missing", detail=result.missing or f"{stage} outputs are missing")


def _last_line(text: str | None) -> str:
    """The log tail's last line (the runner's reason already names a failed engine's root cause)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def _kernels_check(cell: CellResults, policy: Policy, require: Sequence[str]) -> Check:
    unhealthy = _health_check(cell, "kernels", "kernels", require)
    if unhealthy:
        return unhealthy
    junit = cell.stage("kernels").data
    total = len(junit.cases)
    passed, skipped = junit.count("passed"), junit.count("skipped")
    failed, errors = junit.count("failed"), junit.count("error")
    figures = {"tests": total, "passed": passed, "failed": failed, "errors": errors, "skipped": skipped}
    base = dict(cell=cell.identity.id, kind="kernels", model=cell.identity.model, figures=figures,
                threshold={"failed": 0, "errors": 0}, threshold_text="0 failed, 0 errors")
    if junit.problems:
        first = junit.problems[0]
        more = f" (+{len(junit.problems) - 1} more)" if len(junit.problems) > 1 else ""
        return Check(**base, status="fail",
                     detail=f"{failed} failed, {errors} errors of {total}: {first.name}: {first.message}{more}",
                     headline=f"{failed + errors} of {total} kernel tests failed or errored, first {first.name}")
    minimum = policy.kernels.min_executed_tests
    if passed < minimum:
        return Check(**base, status="fail", detail=f"{passed} kernel tests ran ({skipped} skipped of {total}); "
                                                    f"the policy needs at least {minimum}")
    return Check(**base, status="pass", detail=f"{passed} passed, {skipped} skipped")


def _accuracy_check(cell: CellResults, require: Sequence[str]) -> Check:
    unhealthy = _health_check(cell, "accuracy", "accuracy", require)
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


def _throughput_check(cell: CellResults, baseline: RunResults | None, policy: Policy,
                      require: Sequence[str], *, ab: bool = False,
                      interleaved: bool = False) -> tuple[Check, _Pending | None]:
    """The throughput stage's health and, with a baseline, the margin test "current/baseline >= 1 - tolerance".

    interleaved: the baseline is the base side of an A/B run whose repeats ran by turns (base repeat N, head
    repeat N, ...): the test pairs repeats by round N. Otherwise (a stored baseline, or sides not interleaved)
    the two runs' means also differ by the policy's run-to-run SD, which the test adds."""
    unhealthy = _health_check(cell, "throughput", "throughput", require)
    if unhealthy:
        return unhealthy, None
    current: ThroughputResult = cell.stage("throughput").data
    measure = policy.throughput.metric
    values = current.values(measure)
    figures = _throughput_figures(current)
    base = dict(cell=cell.identity.id, kind="throughput", subject=measure, model=cell.identity.model)
    if not values:
        return Check(**base, status="missing", figures=figures,
                     detail=f"no {measure} figure in any repeat (output tokens/s comes from the *.log files)"), None
    summary = f"{_median(values):.4g} {UNITS.get(measure, measure)} (median of {len(values)})"
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
            test = stats.paired_ratio_test(_rounds(old_stage.data, measure), _rounds(current, measure),
                                           min_ratio=1 - tolerance, alpha=alpha)
        else:
            test = stats.unpaired_ratio_test(old_values, values, min_ratio=1 - tolerance, alpha=alpha,
                                             run_to_run_sd=tput.run_to_run_sd)
    except ValueError as error:
        return Check(**base, status="error", figures=figures, reference=reference,
                     detail=f"cannot test: {error}", headline=f"cannot test: {error}"), None
    figures.update({"baseline_median": _median(old_values), "median": _median(values), "ratio": test.ratio,
                    "estimate": test.estimate, "n_baseline": test.n_baseline, "n_current": test.n_current,
                    "df": test.df if math.isfinite(test.df) else None, "se_log": test.se_log})
    notes = [f"interleaved A/B: paired by round ({test.n_current} rounds)" if interleaved else
             f"runs not interleaved: the policy's run-to-run SD ({100 * tput.run_to_run_sd:g} %) is part of the test "
             f"({tput.run_to_run_sd_source})"]
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
    text = (f"{_median(old_values):.4g} -> {_median(values):.4g} {UNITS.get(measure, measure)}, "
            f"ratio {test.ratio:.3f} (tested {test.estimate:.3f}, bounds [{test.lower:.3f}, {test.upper:.3f}])")
    return check, _Pending(check=check, test=test, passed_text=text,
                           failed_text=f"{text}: upper bound {test.upper:.3f} < {1 - tolerance:.2f}",
                           failed_headline=f"throughput ratio {test.estimate:.3f}, upper bound {test.upper:.3f} < "
                                           f"{1 - tolerance:.2f} vs {reference}",
                           family="throughput",
                           decide=lambda t, adj: stats.throughput_regressed(t, alpha=alpha, adjusted_p=adj))


_ROUND = re.compile(r"(?:^|[/\\])repeat-(\d+)\.json$")


def _rounds(result: ThroughputResult, measure: str) -> dict[int, float]:
    """Repeats by round N (throughput/repeat-N.json), for interleaved A/B pairing."""
    rounds: dict[int, float] = {}
    for repeat in result.repeats:
        found = _ROUND.search(repeat.source)
        if not found:
            raise ValueError(f"cannot pair by round: {repeat.source} is not named repeat-N.json")
        value = getattr(repeat, measure)
        if value is not None:
            rounds[int(found[1])] = value
    return rounds


def _throughput_figures(result: ThroughputResult) -> dict[str, Any]:
    rps = result.values("requests_per_second")
    figures: dict[str, Any] = {
        "repeats": len(result.repeats), "median_requests_per_second": _median(rps),
        "requests_per_second": rps, "median_tokens_per_second": _median(result.values("tokens_per_second"))}
    output = result.values("output_tokens_per_second")
    if output:
        figures["median_output_tokens_per_second"] = _median(output)
    return figures


def _probe_check(cell: CellResults, run: RunResults, policy: Policy, require: Sequence[str],
                 probe_compare: Callable[[Any, Any], Any] | None) -> Check:
    unhealthy = _health_check(cell, "probe", "probe", require)
    if unhealthy:
        return unhealthy
    base = dict(cell=cell.identity.id, kind="probe", model=cell.identity.model)
    if not cell.identity.is_fp8:
        return Check(**base, status="pass", detail="probe outputs present (the reference for this backend's FP8 cells)")
    partner = run.find(cell.identity.with_dtype("auto"))
    if partner is None or partner.stage("probe").health != "ok":
        why = "no auto cell in this run" if partner is None else f"the auto cell's probe stage: {partner.stage('probe').health}"
        return Check(**base, status="missing", reference="auto cell", detail=f"cannot compare logprobs: {why}")
    if probe_compare is None:
        return Check(**base, status="error", detail="this kvgate cannot compare probe outputs (kvgate.results.probe_file missing)")
    agreement = probe_compare(partner.stage("probe").data, cell.stage("probe").data)
    limits = _probe_limits(policy, cell.identity)
    figures = {k: v for k, v in _as_mapping(agreement).items() if isinstance(v, (int, float, str))}
    broken = []
    thresholds = policy.probe.thresholds(cell.identity.kv_cache_dtype, cell.identity.arch)
    if thresholds.require_effect and figures.get("identical") is True:
        broken.append(f"no measurable {cell.identity.kv_cache_dtype} effect: every logprob and token equals the auto "
                      "cell's, so the FP8 cache was most likely never used")
    for name, limit in limits.items():
        if name.startswith("max_"):
            key = name[4:]
            value = figures.get(key)
            if value is None or value != value or value > limit:  # NaN: nothing to measure: fails
                broken.append(f"{key} {_fmt(value)} > {limit:g}")
        elif name.startswith("min_"):
            key = name[4:]
            value = figures.get(key)
            if value is None or value != value or value < limit:
                broken.append(f"{key} {_fmt(value)} < {limit:g}")
    shown = ", ".join(f"{k[4:]} {_fmt(figures.get(k[4:]))}" for k in limits) or "no thresholds for this dtype"
    threshold_text = ", ".join(f"{k[4:]} {'≤' if k.startswith('max_') else '≥'} {v:g}" for k, v in limits.items())
    return Check(**base, status="fail" if broken else "pass", reference="auto cell", figures=figures,
                 threshold=dict(limits), threshold_text=threshold_text,
                 detail=("; ".join(broken) if broken else shown) + " vs the auto cell")


def _probe_limits(policy: Policy, identity: CellIdentity) -> dict[str, float]:
    limits = policy.probe.thresholds(identity.kv_cache_dtype, identity.arch)
    found = {"max_mean_abs_logprob_diff": limits.mean_abs_logprob_diff_max,
             "max_max_abs_logprob_diff": limits.max_abs_logprob_diff_max,
             "min_top1_agreement": limits.top1_agreement_min,
             "max_decode_mean_abs_logprob_diff": limits.decode_mean_abs_logprob_diff_max,
             "min_greedy_prefix_match": limits.greedy_prefix_match_min}
    return {name: value for name, value in found.items() if value == value}  # NaN: not judged


def _as_mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    if hasattr(value, "__dataclass_fields__"):
        return {name: getattr(value, name) for name in value.__dataclass_fields__}
    return dict(vars(value)) if hasattr(value, "__dict__") else {}


# ---------------------------------------------------------------------------------------------- comparisons

def _fp8_accuracy_checks(cell: CellResults, partner: CellResults | None, policy: Policy) -> list[Any]:
    margin = policy.fp8_tax_points(cell.identity.model)
    return _accuracy_comparisons(cell, partner, kind="fp8_accuracy", reference="auto cell", margin=margin,
                                 policy=policy, partner_absent="no auto cell of the same backend, arch, model "
                                                                       "and task in this run", judged_if_absent=True)


def _baseline_accuracy_checks(cell: CellResults, old: CellResults | None, policy: Policy, *,
                              ab: bool = False) -> list[Any]:
    return _accuracy_comparisons(cell, old, kind="baseline_accuracy", reference="base side" if ab else "baseline",
                                 margin=policy.accuracy.baseline_margin_points, policy=policy,
                                 partner_absent="the base side of this A/B run has no such cell" if ab else
                                 "new cell, not in the baseline", judged_if_absent=ab)


def _accuracy_comparisons(cell: CellResults, partner: CellResults | None, *, kind: str, reference: str, margin: float,
                          policy: Policy, partner_absent: str, judged_if_absent: bool) -> list[Any]:
    """One decision per comparison, on the policy's primary filter; the other filters are reported (info)."""
    base = dict(cell=cell.identity.id, kind=kind, model=cell.identity.model, reference=reference)
    own = cell.stage("accuracy")
    if own.health in ("not_run", "skipped"):
        return []  # the accuracy check already says so
    if own.health != "ok":
        return [Check(**base, status="error" if own.health in ("error", "timeout") else "missing",
                      detail=f"cannot compare: this cell's accuracy stage is {own.health}")]
    if partner is None:
        return [Check(**base, status="missing" if judged_if_absent else "not_run", detail=partner_absent)]
    theirs = partner.stage("accuracy")
    if theirs.health != "ok":
        detail = f"cannot compare: the {reference}'s accuracy stage is {theirs.health.replace('_', ' ')}"
        if reference == "baseline":  # a stored baseline without this stage; an A/B run's base side must have it
            return [Check(**base, status="not_run", detail=detail)]
        status = {"error": "error", "timeout": "error"}.get(theirs.health, "missing")
        return [Check(**base, status=status, detail=detail)]
    candidate: AccuracyResult = own.data
    ref: AccuracyResult = theirs.data
    acc = policy.accuracy
    primary = acc.primary_filter
    design, design_problem = _sequential_design(cell, partner, margin, policy)
    out: list[Any] = []
    for name in [primary, *(f for f in acc.filters if f != primary)]:
        judged = name == primary
        if name not in candidate.scores or name not in ref.scores:
            lacking = "this cell" if name not in candidate.scores else f"the {reference}"
            out.append(Check(**base, subject=name, status="missing" if judged else "info",
                             detail=f"{lacking} has no {name!r} figure"))
            continue
        if design_problem:
            out.append(Check(**base, subject=name, status="error" if judged else "info", detail=design_problem,
                             headline=design_problem))
            continue
        out.append(_accuracy_comparison(base, name, candidate, ref, margin, policy, judged=judged, design=design))
    return out


def _sequential_design(cell: CellResults, partner: CellResults, margin: float,
                       policy: Policy) -> tuple[sequential.Design | None, str]:
    """The group-sequential design a comparison was run under (cell.json "sequential" of either side), or None.

    Proposed record (the runner writes it before the first look): {"design": "kvgate-gs/1", "looks": [n_1, ...,
    n_K]}; the bounds come from the policy (alpha, power, beta_spending_rho) and the looks' fractions."""
    records = [(side, c.extra.get("sequential")) for side, c in (("this cell", cell), ("the reference", partner))
               if c.extra.get("sequential") is not None]
    if not records:
        return None, ""
    looks = []
    for side, record in records:
        if not (isinstance(record, Mapping) and record.get("design") == sequential.DESIGN_NAME
                and isinstance(record.get("looks"), list) and record["looks"]
                and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in record["looks"])
                and record["looks"] == sorted(set(record["looks"]))):
            return None, (f"cannot compare: {side}'s cell.json \"sequential\" is not a {sequential.DESIGN_NAME} "
                          f"record with increasing \"looks\" (numbers of questions)")
        looks.append(tuple(record["looks"]))
    if len(set(looks)) > 1:
        return None, (f"cannot compare: the two cells were run under different sequential designs (looks "
                      f"{list(looks[0])} and {list(looks[1])})")
    acc = policy.accuracy
    return sequential.design(looks[0], alpha=acc.alpha, beta=1 - acc.power, rho=acc.sequential.beta_spending_rho,
                             margin_points=margin, gap_points=acc.gap_points), ""


def _accuracy_comparison(base: Mapping[str, Any], filter_name: str, candidate: AccuracyResult, ref: AccuracyResult,
                         margin: float, policy: Policy, *, judged: bool = True,
                         design: sequential.Design | None = None) -> Any:
    """The margin test of one filter (H0: drop <= margin). judged: the primary filter (pending a decision);
    otherwise the same figures with status info. A pairing problem is an error of the judged check."""
    acc = policy.accuracy
    base = {**base, "subject": filter_name}
    ref_score, cand_score = ref.scores[filter_name], candidate.scores[filter_name]
    figures: dict[str, Any] = {"reference": ref_score.mean, "candidate": cand_score.mean}
    reference = base.get("reference") or "reference"
    unjudged = "error" if judged else "info"
    try:
        ref_outcomes, cand_outcomes, notes = _pair(_samples(ref, filter_name, f"the {reference}"),
                                                   _samples(candidate, filter_name, "this cell"),
                                                   reference=reference, ordered=design is not None)
    except _PairingError as problem:
        return Check(**base, status=unjudged, figures=figures, detail=str(problem), headline=str(problem))
    counts = stats.PairedCounts.from_outcomes(ref_outcomes, cand_outcomes)
    figures.update({"n": counts.n, "discordant": counts.discordant, "only_reference": counts.only_reference,
                    "only_candidate": counts.only_candidate})
    if counts.n < acc.min_n:
        return Check(**base, status=unjudged, figures=figures, threshold={"min_n": acc.min_n}, notes=tuple(notes),
                     detail=f"only {counts.n} paired questions; the policy needs at least {acc.min_n} "
                            f"to resolve a {margin:.1f}-point margin")
    alpha = acc.alpha
    if design is not None:
        try:
            result = sequential.replay(design, ref_outcomes, cand_outcomes)
        except ValueError as error:
            return Check(**base, status=unjudged, figures=figures, notes=tuple(notes), detail=f"cannot decide: {error}",
                         headline=f"sequential comparison incomplete: {error}")
        counts = result.counts
        test: Any = result
        drop, lower, upper = counts.drop_points, result.lower_points, result.upper_points
        figures.update({"n": counts.n, "discordant": counts.discordant, "only_reference": counts.only_reference,
                        "only_candidate": counts.only_candidate, "look": result.look.look,
                        "looks": list(design.looks), "efficacy_bound": design.bounds.efficacy[result.look.look - 1],
                        "futility_bound": design.bounds.futility[result.look.look - 1],
                        "z": result.look.z, "z_futility": result.look.z_futility,
                        "questions_after_decision": result.unused})
        level = result.level
        method = sequential.SEQUENTIAL_METHOD
        interval_text = (f"bounds of the drop at look {result.look.look}, each at its boundary's level: lower "
                         f"one-sided {1 - level:.5%} (fails when above the margin), upper one-sided "
                         f"{1 - result.futility_level:.3%} (passes early when below margin + "
                         f"{acc.gap_points:g}), points")
        notes.append(f"sequential: decided at look {result.look.look} of {len(design.looks)} "
                     f"({result.look.n} of up to {design.looks[-1]} questions)")
    else:
        test = stats.margin_test(counts, margin_points=margin, alpha=alpha)
        drop, lower, upper = test.drop_points, test.lower_points, test.upper_points
        method = test.method
        interval_text = (f"one-sided {1 - alpha:.0%} bounds of the drop (fails when the lower one is above the "
                         "margin), points")
        if counts.n < acc.questions:
            notes.append(_power_note(counts.n, margin, policy))
    figures.update({"drop_points": drop, "lower_bound_points": lower, "upper_bound_points": upper})
    check = Check(**base, status="pending" if judged else "info", figures=figures,
                  threshold={"margin_points": margin, "alpha": alpha},
                  threshold_text=f"drop ≤ {margin:.1f} pts", p_value=test.p_value, interval=(lower, upper),
                  interval_text=interval_text, method=method, notes=tuple(notes))
    text = (f"{ref_score.mean:.4f} -> {cand_score.mean:.4f}, drop {drop:.2f} pts [{lower:.2f}, {upper:.2f}]; "
            f"margin {margin:.1f}")
    if not judged:
        return replace(check, detail=f"{text}; reported, not judged (the decision uses {acc.primary_filter})",
                       notes=(*check.notes, f"only the primary filter ({acc.primary_filter}) is judged"))
    if design is not None:
        return _Pending(check=check, test=test, passed_text=text, family="sequential",
                        failed_headline=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}",
                        failed_text=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}; "
                                    f"{ref_score.mean:.4f} -> {cand_score.mean:.4f}",
                        decide=lambda t, adj: t.decision == "fail")
    return _Pending(check=check, test=test, passed_text=text,
                    failed_headline=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}",
                    failed_text=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}; "
                                f"{ref_score.mean:.4f} -> {cand_score.mean:.4f}",
                    decide=lambda t, adj: stats.accuracy_regressed(t, alpha=alpha, adjusted_p=adj))


@functools.lru_cache(maxsize=256)
def _power_band(n: int, margin: float, gap: float, alpha: float, flips: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(power.power_at(n, flips=f, margin_points=margin, target_points=margin + gap, alpha=alpha)
                 for f in flips)


def _power_note(n: int, margin: float, policy: Policy) -> str:
    acc = policy.accuracy
    flips = (0.05, acc.design_flips)
    low, high = sorted(_power_band(n, margin, acc.gap_points, acc.alpha, flips))
    return (f"{n} questions, fewer than the policy's {acc.questions}: a drop {acc.gap_points:g} pts beyond the "
            f"margin is caught with power {100 * low:.0f}-{100 * high:.0f} % at {100 * flips[1]:g}-{100 * flips[0]:g} "
            f"% noise flips (the policy wants {100 * acc.power:g} %)")


class _PairingError(ValueError):
    """The two sample logs cannot be paired question by question (a failing error of the check, named)."""


def _samples(result: AccuracyResult, filter_name: str, who: str) -> SampleOutcomes:
    if not result.samples:
        raise _PairingError(f"no per-question sample log in {who} (lm-eval --log_samples): the paired test cannot "
                            "run, and a test on the two means cannot resolve the margin")
    if filter_name not in result.samples:
        raise _PairingError(f"{who}'s sample log has no records for filter {filter_name!r}")
    return result.samples[filter_name]


DOC_ID_KEY = "doc_id:"  # kvgate.results.parsers.lm_eval keys a record by doc_hash, else "doc_id:<n>"


def _pair(ref: SampleOutcomes, cand: SampleOutcomes, *, reference: str = "reference",
          ordered: bool = False) -> tuple[list[bool], list[bool], list[str]]:
    """Per-question outcomes of both logs on the same questions, in the candidate's order.

    Raises _PairingError (the check errors, named) when the logs identify questions differently (mixed join
    keys), hold different questions, or saw different prompts. ordered (a sequential comparison): both logs
    follow one question order and the shorter is a prefix of the longer; the pairs are that prefix."""
    sides = ((f"the {reference}'s", ref), ("this cell's", cand))
    kinds = []
    for who, log in sides:
        by_id = sum(1 for key in log.outcomes if key.startswith(DOC_ID_KEY))
        if 0 < by_id < log.n:
            raise _PairingError(f"mixed join keys in {who} sample log: {by_id} records keyed by doc_id, "
                                f"{log.n - by_id} by doc_hash; one log must use one key")
        kinds.append("doc_id" if by_id else "doc_hash")
    if kinds[0] != kinds[1]:
        raise _PairingError(f"the {reference}'s sample log identifies questions by {kinds[0]}, this cell's by "
                            f"{kinds[1]}: they cannot be joined")
    if ordered:
        ref_keys, cand_keys = list(ref.outcomes), list(cand.outcomes)
        length = min(len(ref_keys), len(cand_keys))
        if ref_keys[:length] != cand_keys[:length]:
            first = next(i for i, (a, b) in enumerate(zip(ref_keys[:length], cand_keys[:length], strict=True)) if a != b)
            raise _PairingError(f"the two sample logs do not follow one question order (a sequential comparison "
                                f"needs it): they differ first at question {first + 1}")
        keys = cand_keys[:length]
    else:
        only_ref = ref.outcomes.keys() - cand.outcomes.keys()
        only_cand = cand.outcomes.keys() - ref.outcomes.keys()
        if only_ref or only_cand:
            common = ref.n - len(only_ref)
            raise _PairingError(f"the two sample logs hold different questions: {common} in common, {len(only_ref)} "
                                f"only in the {reference}'s, {len(only_cand)} only in this cell's")
        keys = list(cand.outcomes)
    ref_rows = [ref.outcomes[k] for k in keys]
    cand_rows = [cand.outcomes[k] for k in keys]
    notes = []
    ref_prompts = [row[1] for row in ref_rows]
    cand_prompts = [row[1] for row in cand_rows]
    if ref_prompts != cand_prompts:  # the common case (identical prompts) costs one C-level comparison
        missing = [sum(p is None for p in prompts) for prompts in (ref_prompts, cand_prompts)]
        if any(missing):
            who = f"the {reference}'s" if missing[0] else "this cell's"
            raise _PairingError(f"prompt_hash is missing on {max(missing)} of {len(keys)} records of {who} sample "
                                "log while the other has them: the prompts cannot be compared")
        differ = sum(1 for a, b in zip(ref_prompts, cand_prompts, strict=True) if a != b)
        raise _PairingError(f"prompt_hash differs on {differ} of {len(keys)} questions: the two runs saw different "
                            "prompts (few-shot examples, chat template or task version)")
    if keys and all(p is None for p in ref_prompts):
        notes.append("no prompt_hash in either sample log: the prompts could not be compared")
    return [row[0] for row in ref_rows], [row[0] for row in cand_rows], notes


def _accuracy_floor_check(cell: CellResults, policy: Policy) -> Any:
    """An auto cell against its workload's expected accuracy (matrix/workloads.toml expected_accuracy):
    H0 "the true accuracy is at least expected x (1 - rtol)", exact binomial, on the primary filter.
    Catches a break that hits auto and FP8 alike, which FP8-vs-auto cannot see, also without a baseline."""
    if cell.identity.is_fp8 or cell.stage("accuracy").health != "ok":
        return None
    acc = policy.accuracy
    declared = policy.floor_for(cell.identity.model, cell.identity.arch, cell.identity.task)
    if declared is None:
        return None
    result: AccuracyResult = cell.stage("accuracy").data
    name = acc.primary_filter
    base = dict(cell=cell.identity.id, kind="accuracy_floor", subject=name, model=cell.identity.model,
                reference=f"workloads.{declared.workload}.expected_accuracy")
    floor = declared.floor(name)
    score = result.scores.get(name)
    if floor is None or score is None:
        return Check(**base, status="missing", detail=f"no {name!r} figure to hold against the floor")
    n = result.samples[name].n if result.samples and name in result.samples else result.n
    if n is None:
        return Check(**base, status="error", detail="cannot test the floor: neither a sample log nor n-samples "
                                                    "says how many questions were scored")
    correct = round(score.mean * n)
    test = stats.floor_test(correct, n, floor=floor, alpha=acc.alpha)
    expected = declared.expected[name]
    figures = {"accuracy": score.mean, "n": n, "correct": correct, "expected": expected, "rtol": declared.rtol,
               "floor": floor, "upper_bound": test.upper,
               **{f"{k}_accuracy": s.mean for k, s in result.scores.items() if k != name}}
    check = Check(**base, status="pending", figures=figures, threshold={"floor": floor, "alpha": acc.alpha},
                  threshold_text=f"accuracy ≥ {floor:.4f} ({expected:g} - {declared.rtol:.0%})",
                  p_value=test.p_value, interval=(0.0, test.upper),
                  interval_text=f"one-sided {1 - acc.alpha:.0%} upper bound of the accuracy (fails when below the "
                                "floor)",
                  method=test.method, notes=(f"expected accuracy: {declared.source}",))
    text = f"{name} {score.mean:.4f} (n={n}), upper bound {test.upper:.4f}; floor {floor:.4f}"
    return _Pending(check=check, test=test, passed_text=text, failed_text=f"{text}: below the floor",
                    failed_headline=f"accuracy {score.mean:.4f}, upper bound {test.upper:.4f} < floor {floor:.4f}",
                    decide=lambda t, adj: stats.accuracy_regressed(t, alpha=acc.alpha, adjusted_p=adj))


def _fp8_throughput_check(cell: CellResults, partner: CellResults | None, policy: Policy) -> Any:
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
        test = stats.unpaired_ratio_test(auto_values, fp8_values, min_ratio=expected or 1.0, alpha=alpha,
                                         run_to_run_sd=tput.run_to_run_sd)
    except ValueError as error:
        if expected is None and auto_values and fp8_values:  # reported anyway, without bounds
            ratio = _median(fp8_values) / _median(auto_values)
            return Check(**base, status="info", figures={"ratio": ratio}, detail=f"ratio {ratio:.3f} ({error})")
        return Check(**base, status="error" if expected is not None else "info", detail=f"cannot compare: {error}")
    figures = {"auto_median": _median(auto_values), "fp8_median": _median(fp8_values), "ratio": test.ratio,
               "estimate": test.estimate, "n_auto": test.n_baseline, "n_fp8": test.n_current}
    text = (f"auto {_median(auto_values):.4g} -> {cell.identity.kv_cache_dtype} {_median(fp8_values):.4g} {unit}, "
            f"ratio {test.ratio:.3f} (tested {test.estimate:.3f}, bounds [{test.lower:.3f}, {test.upper:.3f}])")
    check = Check(**base, status="info", figures=figures, p_value=test.p_value, interval=(test.lower, test.upper),
                  interval_text=f"one-sided {1 - alpha:.0%} bounds of the fp8/auto ratio", method=test.method,
                  detail=f"{text} (reported; the policy expects no ratio here)")
    if expected is None:
        return check
    check = replace(check, status="pending", threshold={"min_ratio": expected, "alpha": alpha},
                    threshold_text=f"ratio ≥ {expected:.2f}",
                    notes=(f"expectation {expectation.where}: {expectation.reason}",))
    return _Pending(check=check, test=test, passed_text=text, family="throughput",
                    failed_text=f"{text}: upper bound {test.upper:.3f} < {expected:.2f}",
                    failed_headline=f"fp8/auto throughput ratio {test.estimate:.3f}, upper bound {test.upper:.3f} < "
                                    f"{expected:.2f}",
                    decide=lambda t, adj: stats.throughput_regressed(t, alpha=alpha, adjusted_p=adj))


def _fp8_kv_cache_check(cell: CellResults, partner: CellResults | None, run: RunResults, policy: Policy) -> Check:
    """Was the FP8 cell's KV cache FP8? The accuracy stage's evidence (status.json accuracy.kv_cache): the cache
    tensors' element size (1 byte; 2 means the FP8 setting was ignored), the layers' cache dtype (an FP8 one), and
    the KV cache size in tokens against the auto cell's (an FP8 cache holds about twice as many in the same
    memory; below the policy's ratio fails). Without evidence: an error for results of contract 1.4 on (their
    writers must record it), not judged for older ones."""
    base = dict(cell=cell.identity.id, kind="fp8_kv_cache", model=cell.identity.model, reference="auto cell")
    dtype = cell.identity.kv_cache_dtype
    own = cell.stage("accuracy")
    if own.health != "ok":
        return Check(**base, status="not_run", detail=f"the accuracy stage is {own.health.replace('_', ' ')}: no "
                                                      "engine evidence to judge (the accuracy checks judge that stage)")
    source = f"{cell.folder}/status.json accuracy.kv_cache"
    evidence = own.status.kv_cache if own.status is not None else None
    if evidence is not None and evidence.problem:
        what = f"unreadable KV cache evidence: {evidence.problem}"
        return Check(**base, status="error", detail=f"{what} ({cell.folder}/status.json)", headline=what)
    minimum = policy.kv_cache.fp8_min_token_ratio
    threshold = {"element_bytes": 1, "min_token_ratio": minimum}
    threshold_text = f"1-byte elements, an FP8 layer dtype, tokens ≥ {minimum:g}x auto's"
    evidence = evidence or KvCacheEvidence()
    figures: dict[str, Any] = {"layers": evidence.layers, "layer_kv_cache_dtypes": list(evidence.layer_kv_cache_dtypes),
                               "tensor_dtypes": list(evidence.tensor_dtypes),
                               "element_bytes": list(evidence.element_bytes), "tokens": evidence.tokens}
    broken: list[str] = []
    notes: list[str] = []
    tensors = f" ({', '.join(evidence.tensor_dtypes)})" if evidence.tensor_dtypes else ""
    if evidence.element_bytes:
        sizes = "/".join(str(b) for b in evidence.element_bytes)
        if set(evidence.element_bytes) != {1}:
            broken.append(f"{sizes}-byte cache elements{tensors}: the {dtype} KV cache setting was ignored")
    not_fp8 = [name for name in evidence.layer_kv_cache_dtypes if not _is_fp8_name(name)]
    if not_fp8:
        broken.append(f"the attention layers' kv_cache_dtype is {', '.join(not_fp8)}, not an FP8 type")
    # the size against the auto cell's: judged where both engine logs reported one
    ratio_text, compared, problem = "", False, ""
    auto = partner.stage("accuracy") if partner is not None else None
    auto_evidence = auto.status.kv_cache if auto is not None and auto.health == "ok" and auto.status else None
    if auto_evidence is not None and auto_evidence.problem:
        problem = (f"the auto cell's KV cache evidence is unreadable: {auto_evidence.problem} "
                   f"({partner.folder}/status.json)")
    elif evidence.tokens is not None and auto_evidence is not None and auto_evidence.tokens is not None:
        ratio = evidence.tokens / auto_evidence.tokens
        figures.update({"auto_tokens": auto_evidence.tokens, "token_ratio": ratio,
                        "auto_element_bytes": list(auto_evidence.element_bytes)})
        compared = True
        ratio_text = f"{evidence.tokens:,} tokens = {ratio:.2f}x the auto cell's"
        if ratio < minimum:
            broken.append(f"{ratio_text} ({auto_evidence.tokens:,}), below {minimum:g}x (an FP8 cache holds about "
                          "2x in the same memory)")
    else:
        why = ("no auto cell of the same backend, arch and model in this run" if partner is None else
               f"the auto cell's accuracy stage is {auto.health.replace('_', ' ')}" if auto.health != "ok" else
               "the auto cell recorded no KV cache size" if evidence.tokens is not None else
               "this cell recorded no KV cache size")
        notes.append(f"KV cache size not compared with the auto cell's: {why}")
        if evidence.tokens is not None:
            ratio_text = f"{evidence.tokens:,} tokens"
    if broken:
        return Check(**base, status="fail", figures=figures, threshold=threshold, threshold_text=threshold_text,
                     notes=tuple(notes), detail="; ".join(broken) + f" ({source})", headline="; ".join(broken))
    if problem:
        return Check(**base, status="error", figures=figures, threshold=threshold, threshold_text=threshold_text,
                     detail=problem, headline=problem)
    if not evidence.has_layer_facts and not compared:
        declared = cell.extra.get("contract_version", run.run_info.get("contract_version"))
        version = (1, 0) if declared is None else contract_version_tuple(declared)
        lacking = ("accuracy has no kv_cache" if own.status is None or own.status.kv_cache is None else
                   "accuracy.kv_cache has no element_bytes or layer_kv_cache_dtypes, and no KV cache size to "
                   "compare with the auto cell's")
        since = ".".join(map(str, KV_CACHE_EVIDENCE_SINCE))
        if version is not None and version < KV_CACHE_EVIDENCE_SINCE:
            shown = "no contract_version (1)" if declared is None else f"contract {declared}"
            return Check(**base, status="not_run", figures=figures, notes=tuple(notes),
                         detail=f"not judged: the results predate the KV cache evidence ({shown}, before {since}; "
                                f"{cell.folder}/status.json {lacking})")
        what = "no evidence the KV cache was FP8"
        return Check(**base, status="error", figures=figures, threshold=threshold, threshold_text=threshold_text,
                     notes=tuple(notes), headline=f"{what}: status.json {lacking}",
                     detail=f"{what}: {cell.folder}/status.json {lacking}; from contract {since} on the accuracy "
                            "stage must record it")
    parts = []
    if evidence.element_bytes:
        parts.append(f"1-byte cache elements{tensors}")
    elif evidence.layer_kv_cache_dtypes:
        notes.append("the cache tensors' element size was not recorded")
    if ratio_text:
        parts.append(ratio_text)
    if evidence.layer_kv_cache_dtypes:
        layers = f"{evidence.layers} layers" if evidence.layers is not None else "layers"
        parts.append(f"{layers} built for {', '.join(evidence.layer_kv_cache_dtypes)}")
    return Check(**base, status="pass", figures=figures, threshold=threshold, threshold_text=threshold_text,
                 notes=tuple(notes), detail=", ".join(parts))


def _is_fp8_name(name: str) -> bool:
    """vLLM's FP8 cache dtype names (fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla, ...) and torch's float8_*."""
    lowered = name.lower()
    return lowered.startswith("fp8") or lowered.startswith("float8")


def _decide(item: _Pending, adjusted: float | None) -> Check:
    regressed = item.decide(item.test, adjusted)
    p_text = _p_text(item.test.p_value, adjusted)
    detail = (item.failed_text if regressed else item.passed_text) + (f", {p_text}" if p_text else "")
    headline = f"{item.failed_headline} ({p_text})" if regressed and p_text and item.failed_headline else ""
    return replace(item.check, status="fail" if regressed else "pass", adjusted_p_value=adjusted, detail=detail,
                   headline=headline or (item.failed_headline if regressed else ""))


# ---------------------------------------------------------------------------------------------- waivers

def _apply_waiver(check: Check, identity: CellIdentity | None, waiver_for: WaiverLookup, today: dt.date) -> Check:
    if check.status in ("not_run", "info"):
        return check
    if identity is None:
        return check
    waiver = waiver_for(identity, check.kind)
    if waiver is None:
        return check
    note = WaiverNote(reason=waiver.reason, issue=waiver.issue, expires=waiver.expires.isoformat(),
                      expired=waiver.expired(today), where=f"waivers.toml {waiver.where}")
    if note.expired:
        return replace(check, waiver=note, notes=(*check.notes, f"waiver {waiver.where} expired on {note.expires} "
                                                               f"({waiver.issue}); it no longer applies"))
    outcome = {"pass": "passes now, the waiver may be removed"}.get(check.status, f"would be {check.status}")
    return replace(check, status="waived", waiver=note,
                   detail=f"{check.detail} [waived until {note.expires}: {waiver.issue}; {outcome}]")


# ---------------------------------------------------------------------------------------------- helpers

def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _interval(low: float | None, high: float | None) -> tuple[float, float] | None:
    return None if low is None or high is None else (low, high)


def _ci_text(low: float | None, high: float | None, spec: str) -> str:
    return "" if low is None or high is None else f" [{low:{spec}}, {high:{spec}}]"


def _p_text(p: float | None, adjusted: float | None) -> str:
    if p is None:
        return ""
    text = f"p{_p(p)}"
    if adjusted is not None and abs(adjusted - p) > 1e-12:
        text += f", adj. p{_p(adjusted)}"
    return text


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"={p:.3f}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "?" if value is None else str(value)


__all__ = ["STAGES", "evaluate", "policy_summary"]
