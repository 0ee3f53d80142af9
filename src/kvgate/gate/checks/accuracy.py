"""Accuracy comparisons: FP8 vs the auto cell, a cell vs its baseline (or the A/B run's base side), and an auto
cell against its workload's expected accuracy (the floor). One decision per comparison, on the policy's primary
filter; the other filters reported. Sample logs that cannot be paired question by question are an error of the
comparison, never a fallback."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kvgate.gate import question_plan
from kvgate.gate.checks.pairing import PairingError, pair, samples
from kvgate.gate.checks.pending import Pending
from kvgate.gate.policy import Policy
from kvgate.gate.verdict import Check
from kvgate.results.records import AccuracyResult, CellResults
from kvgate.statistics import margins, sequential


def cell_plans(cell: CellResults, policy: Policy, *, compared: bool) -> tuple[question_plan.QuestionPlan, ...]:
    """The policy's plans a cell's questions may follow, the default first: what the runner had to draw, and the
    design every comparison of the cell is judged by. compared (an A/B run, a gate that requires a baseline): only
    the powered plan; otherwise the plan of a run compared with nothing, or the powered one (`kvgate run
    --powered`), whichever the runner recorded."""
    identity = cell.identity
    powered = question_plan.plan(policy, arch=identity.arch, task=identity.task, model=identity.model, ab=True)
    if compared:
        return (powered,)
    alone = question_plan.plan(policy, arch=identity.arch, task=identity.task, model=identity.model, ab=False)
    return (alone, powered) if alone != powered else (alone,)


def fp8_accuracy_checks(cell: CellResults, partner: CellResults | None, policy: Policy, *,
                        plans: tuple[question_plan.QuestionPlan, ...] = (), strict: bool = False) -> list[Any]:
    margin = policy.fp8_tax_points(cell.identity.model)
    return accuracy_comparisons(cell, partner, kind="fp8_accuracy", reference="auto cell", margin=margin,
                                 policy=policy, partner_absent="no auto cell of the same backend, arch, model "
                                                                       "and task in this run", judged_if_absent=True,
                                 plans=plans, strict=strict)


def baseline_accuracy_checks(cell: CellResults, old: CellResults | None, policy: Policy, *,
                              ab: bool = False, plans: tuple[question_plan.QuestionPlan, ...] = (),
                              strict: bool = False) -> list[Any]:
    return accuracy_comparisons(cell, old, kind="baseline_accuracy", reference="base side" if ab else "baseline",
                                 margin=policy.accuracy.baseline_margin_points, policy=policy,
                                 partner_absent="the base side of this A/B run has no such cell" if ab else
                                 "new cell, not in the baseline", judged_if_absent=ab, plans=plans, strict=strict)


def accuracy_comparisons(cell: CellResults, partner: CellResults | None, *, kind: str, reference: str, margin: float,
                          policy: Policy, partner_absent: str, judged_if_absent: bool,
                          plans: tuple[question_plan.QuestionPlan, ...] = (), strict: bool = False) -> list[Any]:
    """One decision per comparison, on the policy's primary filter; the other filters are reported (info).

    plans: the policy's plans for the cell (cell_plans; default: those of a run compared with nothing), the one
    the runner recorded (else the first) decides by its design
    (group-sequential: every look replayed from the answers; fixed: one margin test), never a design the results
    folder names; a runner's record of another design is an error. strict (--require-baseline): a comparison with
    fewer questions than the plan, not decided at a look, errors instead of being judged underpowered."""
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
    plan, design, design_problem = plan_design(plans or cell_plans(cell, policy, compared=False), cell, partner,
                                               reference, margin, policy)
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
        out.append(accuracy_comparison(base, name, candidate, ref, margin, policy, judged=judged, design=design,
                                       plan=plan, strict=strict, stopped=_stopped(cell, partner)))
    return out


def plan_design(plans: tuple[question_plan.QuestionPlan, ...], cell: CellResults, partner: CellResults,
                reference: str, margin: float, policy: Policy
                ) -> tuple[question_plan.QuestionPlan, sequential.Design | None, str]:
    """The plan and design a comparison is judged by: the policy's plan the runners recorded (status.json
    accuracy.question_plan; else the default, plans[0]), its group-sequential design when it has looks (None: the
    fixed margin test); and why it cannot be judged: a side that recorded a design none of the plans is (another
    policy, an edited record), two sides on different plans, or an unreadable record. Where neither side recorded a
    plan (no runner looked at its answers early) the fixed margin test decides, at the questions the fixed design
    needs for the policy's power (fewer: underpowered)."""
    chosen = None
    for who, side in (("this cell", cell), (f"the {reference}", partner)):
        status = side.stage("accuracy").status
        record = status.questions if status is not None else None
        if record is None:
            continue
        if record.problem:
            return plans[0], None, f"cannot compare: {who}'s status.json {record.problem}"
        ran = {"design": record.design, "questions": record.questions, "looks": list(record.looks)}
        match = next((p for p in plans if p.as_record() == ran), None)
        if match is None:
            wanted = " or ".join(f"{p.design} with {p.questions} (looks {list(p.looks)})" for p in plans)
            return plans[0], None, (f"cannot compare: {who} ran {record.design} with {record.questions} questions "
                                    f"(looks {list(record.looks)}), the policy plans {wanted}: rerun it with this "
                                    f"policy ({policy.source})")
        if chosen is not None and match != chosen:
            return plans[0], None, (f"cannot compare: the two sides ran different plans ({chosen.questions} and "
                                    f"{match.questions} questions)")
        chosen = match
    plan = chosen or plans[0]
    if not plan.sequential or chosen is None:  # no runner looked: the fixed test, at the plan's questions or more
        return plan, None, ""
    acc = policy.accuracy
    return plan, sequential.design(plan.looks, alpha=acc.alpha, beta=1 - acc.power,
                                   rho=acc.sequential.beta_spending_rho, margin_points=margin,
                                   gap_points=acc.gap_points), ""


def _stopped(cell: CellResults, partner: CellResults) -> str | None:
    """Which side's runner says it stopped at a look (then the gate's replay must decide there too)."""
    for who, side in (("this cell", cell), ("the reference", partner)):
        status = side.stage("accuracy").status
        record = status.questions if status is not None else None
        if record is not None and record.stopped_early:
            return f"{who} stopped after {record.answered} of {record.questions} questions"
    return None


def accuracy_comparison(base: Mapping[str, Any], filter_name: str, candidate: AccuracyResult, ref: AccuracyResult,
                         margin: float, policy: Policy, *, judged: bool = True,
                         design: sequential.Design | None = None, plan: question_plan.QuestionPlan | None = None,
                         strict: bool = False, stopped: str | None = None) -> Any:
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
    result = None
    if design is not None:
        try:
            result = sequential.replay(design, ref_outcomes, cand_outcomes)
        except ValueError as error:
            if stopped or counts.n >= design.looks[-1]:
                detail = f"cannot decide: {error}" + (f"; yet {stopped}" if stopped else "")
                return Check(**base, status=unjudged, figures=figures, notes=tuple(notes), detail=detail,
                             headline=f"sequential comparison incomplete: {error}")
    kind = str(base.get("kind"))
    required = required_questions(plan, design) if plan is not None else 0
    if result is None and plan is not None and counts.n < required:
        shortfall = underpowered_text(counts.n, required, plan, policy, str(base.get("model")), kind)
        if strict:
            return Check(**base, status=unjudged, figures=figures, notes=tuple(notes),
                         threshold={"questions": required},
                         detail=f"{shortfall}; --require-baseline needs the plan's questions (rerun the cell)",
                         headline=f"underpowered: {counts.n} of the plan's {required} questions")
        notes.append(shortfall)
        design = None
    if result is not None:
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
        if plan is not None and counts.n >= plan.questions and plan.questions < plan.fixed_questions:
            notes.append(power_statement(counts.n, plan, policy, str(base.get("model")), kind))
    figures.update({"drop_points": drop, "lower_bound_points": lower, "upper_bound_points": upper})
    paired = counts.n
    ref_mean = sum(ref_outcomes[:paired]) / paired if paired else ref_score.mean  # over the questions judged
    cand_mean = sum(cand_outcomes[:paired]) / paired if paired else cand_score.mean
    figures.update({"reference": ref_mean, "candidate": cand_mean})
    check = Check(**base, status="pending" if judged else "info", figures=figures,
                  threshold={"margin_points": margin, "alpha": alpha},
                  threshold_text=f"drop ≤ {margin:.1f} pts", p_value=test.p_value, interval=(lower, upper),
                  interval_text=interval_text, method=method, notes=tuple(notes))
    text = (f"{ref_mean:.4f} -> {cand_mean:.4f}, drop {drop:.2f} pts [{lower:.2f}, {upper:.2f}]; "
            f"margin {margin:.1f}")
    if not judged:
        return replace(check, detail=f"{text}; reported, not judged (the decision uses {acc.primary_filter})",
                       notes=(*check.notes, f"only the primary filter ({acc.primary_filter}) is judged"))
    if result is not None:
        return Pending(check=check, test=test, passed_text=text, family="sequential",
                        failed_headline=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}",
                        failed_text=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}; "
                                    f"{ref_mean:.4f} -> {cand_mean:.4f}",
                        decide=lambda t, adj: t.decision == "fail")
    return Pending(check=check, test=test, passed_text=text,
                    failed_headline=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}",
                    failed_text=f"drop {drop:.1f} pts, lower bound {lower:.1f} > margin {margin:.1f}; "
                                f"{ref_mean:.4f} -> {cand_mean:.4f}",
                    decide=lambda t, adj: margins.accuracy_regressed(t, alpha=alpha, adjusted_p=adj))


def required_questions(plan: question_plan.QuestionPlan, design: sequential.Design | None) -> int:
    """The questions a comparison that did not decide at a look needs: the plan's (a sequential design that ran to
    its last look; a single-side or pool-capped plan), or the fixed design's for the policy's power (no runner
    looked, so no inflation is owed)."""
    if design is not None or not plan.sequential:
        return plan.questions
    return min(plan.fixed_questions, plan.questions)


def underpowered_text(n: int, required: int, plan: question_plan.QuestionPlan, policy: Policy, model: str,
                      kind: str) -> str:
    margin = policy.fp8_tax_points(model) if kind == "fp8_accuracy" else policy.accuracy.baseline_margin_points
    power_n = question_plan.power_at(policy, plan, n, model, kind)
    return (f"{n} paired questions, fewer than the plan's {required} ({plan.reason}), not decided at a look: a "
            f"drop of {margin + policy.accuracy.gap_points:g} pts is caught with power {100 * power_n:.0f} % here "
            f"(the policy wants {100 * policy.accuracy.power:g} %)")


def power_statement(n: int, plan: question_plan.QuestionPlan, policy: Policy, model: str, kind: str) -> str:
    margin = policy.fp8_tax_points(model) if kind == "fp8_accuracy" else policy.accuracy.baseline_margin_points
    power_n = question_plan.power_at(policy, plan, n, model, kind)
    return (f"{n} questions ({plan.reason}): a drop of {margin + policy.accuracy.gap_points:g} pts is caught with "
            f"power {100 * power_n:.0f} % at {100 * plan.flips.get(kind, policy.accuracy.design_flips):g} % noise "
            f"flips (the policy's {100 * policy.accuracy.power:g} % needs {plan.fixed_questions})")


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
    if not margins.floor_test(0, n, floor=floor, alpha=acc.alpha).log_p_value <= math.log(acc.alpha):
        # even none right would pass: a test that cannot fail is no evidence, never a PASS (fail closed, as a paired
        # comparison with too few questions)
        needed = math.ceil(math.log(acc.alpha) / math.log1p(-floor))
        return Check(**base, status="error", figures={"accuracy": score.mean, "n": n, "floor": floor},
                     threshold={"floor": floor, "alpha": acc.alpha},
                     detail=f"only {n} question(s): the floor {floor:.4f} cannot be tested, even none right would "
                            f"pass at alpha {acc.alpha:g} (it takes at least {needed})",
                     headline=f"only {n} question(s): the floor cannot be tested")
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
