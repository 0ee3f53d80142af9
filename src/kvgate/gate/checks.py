"""The gate, pure: run results (+ baseline) + policy + waivers + today -> Verdict. No I/O.

Checks, one per (cell, kind[, subject]):
    kernels            the cell's kernel tests: any failed or errored test fails it; none run fails it
    accuracy           the accuracy stage ran and parsed (figures per lm-eval filter)
    throughput         the throughput stage ran; with a baseline, median req/s vs the baseline cell's
    probe              the probe stage ran; for FP8 cells, logprob agreement with the auto cell's probe
    fp8_accuracy       FP8 cell vs the auto cell of the same backend, arch, model, task; one per filter
    baseline_accuracy  cell vs the same cell in the baseline run; one per filter
    fp8_throughput     FP8/auto throughput ratio: judged only where the policy declares an expectation
    cell               a cell of the baseline is absent from this run

Stage health fails closed: a requested stage that is missing, marked error or timeout fails; a stage
never requested is "not run" (missing, so failing, when the caller requires it). All accuracy and
throughput p-values of the run are adjusted together (policy's multiplicity method) before deciding.
A check covered by a live waiver reads WAIVED whatever it measured; an expired waiver does not apply.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvgate.gate import probe_agreement, stats
from kvgate.gate.policy import Policy
from kvgate.gate.verdict import Check, Verdict, WaiverNote
from kvgate.results.records import (
    BASE,
    HEAD,
    STAGES,
    AccuracyResult,
    CellIdentity,
    CellResults,
    RunResults,
    SampleOutcomes,
    ThroughputResult,
)

KIND_ORDER = ("baseline", "cell", "kernels", "accuracy", "fp8_accuracy", "baseline_accuracy", "throughput", "fp8_throughput",
              "probe")
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
             require_baseline: bool = False, planned: Sequence[tuple[str, str]] = ()) -> Verdict:
    """The verdict on `run` (its head cells).

    ab: `baseline` is the base side of the same A/B run (same machine, same job): every head cell must have its
    base counterpart, and a missing or failed one fails the comparison. require_baseline: with no baseline at
    all the run fails (a change compared with nothing is not a pass); without it the run is neutral.
    planned: (cell id, side) pairs the run was asked for (run.json, --expect-cells); an absent one fails.
    """
    checks: list[Check] = _planned_checks(run, baseline if ab else None, planned)
    pending: list[_Pending] = []
    if baseline is None:
        checks.append(_no_baseline_check(require_baseline))
    for cell in run.cells:
        checks.append(_kernels_check(cell, policy, require))
        checks.append(_accuracy_check(cell, require))
        throughput_check, throughput_pending = _throughput_check(cell, baseline, policy, require, ab=ab)
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
        if baseline is not None:
            for item in _baseline_accuracy_checks(cell, baseline.find(cell.identity), policy, ab=ab):
                (pending.append(item) if isinstance(item, _Pending) else checks.append(item))
    if baseline is not None:
        for old in baseline.cells:
            if run.find(old.identity) is None:
                checks.append(Check(cell=old.identity.id, kind="cell", status="missing", model=old.identity.model,
                                    reference="baseline",
                                    detail=f"in the baseline ({old.folder}) but not in this run"))
    adjusted_by_id: dict[int, float] = {}
    family_sizes = {}
    for family, method in (("accuracy", policy.accuracy.multiplicity), ("throughput", policy.throughput.multiplicity)):
        members = [p for p in pending if p.family == family and p.test.p_value is not None]
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
            "accuracy_multiplicity": acc.multiplicity, "filters": list(acc.filters), "min_n": acc.min_n,
            "throughput_tolerance": tput.tolerance, "throughput_alpha": tput.alpha,
            "throughput_multiplicity": tput.multiplicity, "throughput_metric": tput.metric,
            "fp8_over_auto": [{"where": e.where, "min_ratio": e.min_ratio, "reason": e.reason}
                              for e in tput.fp8_over_auto],
            "kernels_min_executed_tests": policy.kernels.min_executed_tests}


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
                                       "cell fall back to an unpaired test, which is weaker",)
    return Check(cell=cell.identity.id, kind="accuracy", status="pass", model=cell.identity.model, figures=figures,
                 detail=f"{result.task} {', '.join(parts)} (n={result.n if result.n is not None else '?'})",
                 notes=notes)


def _throughput_check(cell: CellResults, baseline: RunResults | None, policy: Policy,
                      require: Sequence[str], *, ab: bool = False) -> tuple[Check, _Pending | None]:
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
    try:
        test = stats.ratio_test(old_values, values)
    except ValueError as error:
        return Check(**base, status="error", figures=figures, detail=f"cannot test: {error}"), None
    figures.update({"baseline_median": _median(old_values), "median": _median(values), "ratio": test.ratio,
                    "n_baseline": test.n_baseline, "n_current": test.n_current})
    tolerance, alpha = policy.throughput.tolerance, policy.throughput.alpha
    check = Check(**base, status="pending", figures=figures, reference="baseline",
                  threshold={"min_ratio": 1 - tolerance, "alpha": alpha},
                  threshold_text=f"ratio ≥ {1 - tolerance:.2f}", p_value=test.p_value,
                  interval=_interval(test.ci_low, test.ci_high), interval_text="CI of the current/baseline ratio",
                  method=test.method,
                  notes=() if test.p_value is not None else ("a single repeat on a side: no p-value, the ratio alone decides",))
    text = (f"{_median(old_values):.4g} -> {_median(values):.4g} {UNITS.get(measure, measure)}, "
            f"ratio {test.ratio:.3f}{_ci_text(test.ci_low, test.ci_high, '.3f')}")
    return check, _Pending(check=check, test=test, passed_text=text, failed_text=f"{text} < {1 - tolerance:.2f}",
                           failed_headline=f"throughput ratio {test.ratio:.3f} < {1 - tolerance:.2f} vs baseline",
                           family="throughput",
                           decide=lambda t, adj: stats.throughput_regressed(t, tolerance=tolerance, alpha=alpha,
                                                                           adjusted_p=adj))


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
    filters = list(policy.accuracy.filters) or sorted(set(candidate.scores) | set(ref.scores))
    out: list[Any] = []
    for name in filters:
        if name not in candidate.scores or name not in ref.scores:
            lacking = "this cell" if name not in candidate.scores else f"the {reference}"
            out.append(Check(**base, subject=name, status="missing", detail=f"{lacking} has no {name!r} figure"))
            continue
        out.append(_accuracy_comparison(base, name, candidate, ref, margin, policy))
    return out


def _accuracy_comparison(base: Mapping[str, Any], filter_name: str, candidate: AccuracyResult, ref: AccuracyResult,
                         margin: float, policy: Policy) -> Any:
    acc = policy.accuracy
    notes: list[str] = []
    ref_score, cand_score = ref.scores[filter_name], candidate.scores[filter_name]
    figures: dict[str, Any] = {"reference": ref_score.mean, "candidate": cand_score.mean}
    pairs = None
    if ref.samples and candidate.samples and filter_name in ref.samples and filter_name in candidate.samples:
        pairs, pairing_notes = _pair(ref.samples[filter_name], candidate.samples[filter_name])
        notes.extend(pairing_notes)
    else:
        notes.append("no per-question sample logs on both sides: unpaired test on the reported means, "
                     "which is weaker (cannot resolve drops under about 4-5 points at n=1319)")
    if pairs is not None:
        counts = stats.PairedCounts.from_outcomes(pairs[0], pairs[1])
        if counts.n < acc.min_n:
            return Check(**base, subject=filter_name, status="error", figures={**figures, "n": counts.n},
                         threshold={"min_n": acc.min_n}, notes=tuple(notes),
                         detail=f"only {counts.n} paired questions; the policy needs at least {acc.min_n} "
                                f"to resolve a {margin:.1f}-point margin")
        test = stats.paired_drop_test(counts, confidence=acc.confidence, n_boot=acc.bootstrap_samples, seed=0)
        figures.update({"n": counts.n, "discordant": counts.discordant, "only_reference": counts.only_reference,
                        "only_candidate": counts.only_candidate})
    else:
        if ref_score.stderr is None or cand_score.stderr is None or ref.n is None or candidate.n is None:
            return Check(**base, subject=filter_name, status="error", figures=figures, notes=tuple(notes),
                         detail="cannot test: no sample logs and no stderr / n-samples in the results files")
        if min(ref.n, candidate.n) < acc.min_n:
            return Check(**base, subject=filter_name, status="error", figures=figures, threshold={"min_n": acc.min_n},
                         notes=tuple(notes), detail=f"only {min(ref.n, candidate.n)} questions; the policy needs at "
                                                    f"least {acc.min_n} to resolve a {margin:.1f}-point margin")
        test = stats.unpaired_drop_test(ref_score.mean, ref_score.stderr, cand_score.mean, cand_score.stderr,
                                        n_reference=ref.n, n_candidate=candidate.n)
        figures.update({"n_reference": ref.n, "n_candidate": candidate.n})
    figures["drop_points"] = test.drop_points
    check = Check(**base, subject=filter_name, status="pending", figures=figures,
                  threshold={"margin_points": margin, "alpha": acc.alpha},
                  threshold_text=f"drop ≤ {margin:.1f} pts", p_value=test.p_value,
                  interval=_interval(test.ci_low_points, test.ci_high_points),
                  interval_text=f"{test.confidence:.0%} CI of the drop, points", method=test.method, notes=tuple(notes))
    text = (f"{ref_score.mean:.4f} -> {cand_score.mean:.4f}, drop {test.drop_points:.2f} pts"
            f"{_ci_text(test.ci_low_points, test.ci_high_points, '.2f')}")
    return _Pending(check=check, test=test, passed_text=f"{text}; margin {margin:.1f}",
                    failed_headline=f"drop {test.drop_points:.1f} pts > {margin:.1f}",
                    failed_text=f"drop {test.drop_points:.1f} pts > {margin:.1f}"
                                f"{_ci_text(test.ci_low_points, test.ci_high_points, '.1f')}; "
                                f"{ref_score.mean:.4f} -> {cand_score.mean:.4f}",
                    decide=lambda t, adj: stats.accuracy_regressed(t, margin_points=margin, alpha=acc.alpha,
                                                                   adjusted_p=t.p_value if adj is None else adj))


def _pair(ref: SampleOutcomes, cand: SampleOutcomes) -> tuple[tuple[list[bool], list[bool]] | None, list[str]]:
    """Join two sample logs on doc_hash (else doc_id); None (unpaired fallback) when prompts differ."""
    common = ref.outcomes.keys() & cand.outcomes.keys()
    notes = []
    if not common:
        return None, ["the two sample logs share no document: unpaired test on the reported means (weaker)"]
    keys = list(common)
    ref_rows = [ref.outcomes[k] for k in keys]
    cand_rows = [cand.outcomes[k] for k in keys]
    ref_prompts = [row[1] for row in ref_rows]
    cand_prompts = [row[1] for row in cand_rows]
    if ref_prompts != cand_prompts:  # the common case (identical prompts) costs one C-level comparison
        mismatched = sum(1 for a, b in zip(ref_prompts, cand_prompts, strict=True) if a and b and a != b)
        if mismatched:
            return None, [f"prompt_hash differs on {mismatched} of {len(common)} questions (different prompts or "
                          f"few-shot examples): unpaired test on the reported means (weaker)"]
    if len(common) < max(ref.n, cand.n):
        notes.append(f"paired on the {len(common)} questions both logs hold ({ref.n} and {cand.n} logged)")
    return ([row[0] for row in ref_rows], [row[0] for row in cand_rows]), notes


def _fp8_throughput_check(cell: CellResults, partner: CellResults | None, policy: Policy) -> Any:
    expectation = policy.throughput.fp8_over_auto_expectation(cell.identity)
    expected = expectation.min_ratio if expectation is not None else None
    measure, alpha = policy.throughput.metric, policy.throughput.alpha
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
    try:
        test = stats.ratio_test(auto_values, fp8_values)
    except ValueError as error:
        return Check(**base, status="error" if expected is not None else "info", detail=f"cannot compare: {error}")
    figures = {"auto_median": _median(auto_values), "fp8_median": _median(fp8_values), "ratio": test.ratio,
               "n_auto": test.n_baseline, "n_fp8": test.n_current}
    unit = UNITS.get(measure, measure)
    text = (f"auto {_median(auto_values):.4g} -> {cell.identity.kv_cache_dtype} {_median(fp8_values):.4g} {unit}, "
            f"ratio {test.ratio:.3f}{_ci_text(test.ci_low, test.ci_high, '.3f')}")
    check = Check(**base, status="info", figures=figures, p_value=test.p_value,
                  interval=_interval(test.ci_low, test.ci_high), interval_text="CI of the fp8/auto ratio",
                  method=test.method, detail=f"{text} (reported; the policy expects no ratio here)")
    if expected is None:
        return check
    check = replace(check, status="pending", threshold={"min_ratio": expected, "alpha": alpha},
                    threshold_text=f"ratio ≥ {expected:.2f}",
                    notes=(f"expectation {expectation.where}: {expectation.reason}",))
    pending = dict(check=check, test=test, passed_text=text, failed_text=f"{text} < {expected:.2f}",
                   failed_headline=f"fp8/auto throughput ratio {test.ratio:.3f} < {expected:.2f}")
    if expected < 1:  # "at most this much slower": the policy's throughput rule, in the run's throughput family
        tolerance = 1 - expected
        return _Pending(**pending, family="throughput",
                        decide=lambda t, adj: stats.throughput_regressed(t, tolerance=tolerance, alpha=alpha,
                                                                         adjusted_p=adj))
    # "at least this much faster": the p-value tests "slower than auto", so the interval decides instead: fail
    # when the ratio is below the expectation and (with 2+ repeats a side) its whole interval is too
    check = replace(check, notes=(*check.notes, "ratio ≥ 1 expected: judged by the ratio's interval, not the p-value"))
    return _Pending(**{**pending, "check": check}, family="interval",
                    decide=lambda t, adj: t.ratio < expected and (t.ci_high is None or t.ci_high < expected))


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
