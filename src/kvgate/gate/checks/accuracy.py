"""Accuracy comparisons: FP8 vs the auto cell, a cell vs its baseline (or the A/B run's base side), and an auto
cell against its workload's expected accuracy (the floor). One decision per comparison, on the policy's primary
filter; the other filters reported. Sample logs that cannot be paired question by question are an error of the
comparison, never a fallback."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kvgate.gate.checks.pairing import PairingError, pair, samples
from kvgate.gate.checks.pending import Pending
from kvgate.gate.policy import Policy
from kvgate.gate.verdict import Check
from kvgate.results.records import AccuracyResult, CellResults
from kvgate.statistics import margins, power, sequential


def fp8_accuracy_checks(cell: CellResults, partner: CellResults | None, policy: Policy) -> list[Any]:
    margin = policy.fp8_tax_points(cell.identity.model)
    return accuracy_comparisons(cell, partner, kind="fp8_accuracy", reference="auto cell", margin=margin,
                                 policy=policy, partner_absent="no auto cell of the same backend, arch, model "
                                                                       "and task in this run", judged_if_absent=True)


def baseline_accuracy_checks(cell: CellResults, old: CellResults | None, policy: Policy, *,
                              ab: bool = False) -> list[Any]:
    return accuracy_comparisons(cell, old, kind="baseline_accuracy", reference="base side" if ab else "baseline",
                                 margin=policy.accuracy.baseline_margin_points, policy=policy,
                                 partner_absent="the base side of this A/B run has no such cell" if ab else
                                 "new cell, not in the baseline", judged_if_absent=ab)


def accuracy_comparisons(cell: CellResults, partner: CellResults | None, *, kind: str, reference: str, margin: float,
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
    design, design_problem = sequential_design(cell, partner, margin, policy)
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
        out.append(accuracy_comparison(base, name, candidate, ref, margin, policy, judged=judged, design=design))
    return out


def sequential_design(cell: CellResults, partner: CellResults, margin: float,
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


def accuracy_comparison(base: Mapping[str, Any], filter_name: str, candidate: AccuracyResult, ref: AccuracyResult,
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
        ref_outcomes, cand_outcomes, notes = pair(samples(ref, filter_name, f"the {reference}"),
                                                   samples(candidate, filter_name, "this cell"),
                                                   reference=reference, ordered=design is not None)
    except PairingError as problem:
        return Check(**base, status=unjudged, figures=figures, detail=str(problem), headline=str(problem))
    counts = margins.PairedCounts.from_outcomes(ref_outcomes, cand_outcomes)
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
        test = margins.margin_test(counts, margin_points=margin, alpha=alpha)
        drop, lower, upper = test.drop_points, test.lower_points, test.upper_points
        method = test.method
        interval_text = (f"one-sided {1 - alpha:.0%} bounds of the drop (fails when the lower one is above the "
                         "margin), points")
        if counts.n < acc.questions:
            notes.append(power_note(counts.n, margin, policy))
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
        return Pending(check=check, test=test, passed_text=text, family="sequential",
                        failed_headline=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}",
                        failed_text=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}; "
                                    f"{ref_score.mean:.4f} -> {cand_score.mean:.4f}",
                        decide=lambda t, adj: t.decision == "fail")
    return Pending(check=check, test=test, passed_text=text,
                    failed_headline=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}",
                    failed_text=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}; "
                                f"{ref_score.mean:.4f} -> {cand_score.mean:.4f}",
                    decide=lambda t, adj: margins.accuracy_regressed(t, alpha=alpha, adjusted_p=adj))


@functools.lru_cache(maxsize=256)
def power_band(n: int, margin: float, gap: float, alpha: float, flips: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(power.power_at(n, flips=f, margin_points=margin, target_points=margin + gap, alpha=alpha)
                 for f in flips)


def power_note(n: int, margin: float, policy: Policy) -> str:
    acc = policy.accuracy
    flips = (0.05, acc.design_flips)
    low, high = sorted(power_band(n, margin, acc.gap_points, acc.alpha, flips))
    return (f"{n} questions, fewer than the policy's {acc.questions}: a drop {acc.gap_points:g} pts beyond the "
            f"margin is caught with power {100 * low:.0f}-{100 * high:.0f} % at {100 * flips[1]:g}-{100 * flips[0]:g} "
            f"% noise flips (the policy wants {100 * acc.power:g} %)")


def accuracy_floor_check(cell: CellResults, policy: Policy) -> Any:
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
    test = margins.floor_test(correct, n, floor=floor, alpha=acc.alpha)
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
    return Pending(check=check, test=test, passed_text=text, failed_text=f"{text}: below the floor",
                    failed_headline=f"accuracy {score.mean:.4f}, upper bound {test.upper:.4f} < floor {floor:.4f}",
                    decide=lambda t, adj: margins.accuracy_regressed(t, alpha=acc.alpha, adjusted_p=adj))
