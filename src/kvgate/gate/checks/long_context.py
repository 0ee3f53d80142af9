"""Long-context comparisons (contract 1.10): kvgate's passkey task (long_context/), FP8 vs the auto cell and a cell vs
its base side or baseline, each a paired margin test on the policy's primary filter like gsm8k's, with its power
stated. The task has no question plan (every declared document is asked, a fixed test), so its power is what its
documents give: stated on every comparison, at the policy's margin + gap and at a drop of LARGE_DROP_POINTS (the
size of the long-context FP8 breaks users reported: vllm #23813, needle-in-a-haystack 91 % -> 13 %)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvgate.gate.checks.accuracy import accuracy_comparison
from kvgate.gate.checks.pending import Pending
from kvgate.gate.policy import Policy
from kvgate.gate.question_plan import flips_for
from kvgate.gate.trusted import shown
from kvgate.gate.verdict import Check
from kvgate.results.records import CellResults
from kvgate.statistics import power

STAGE = "long_context"
LARGE_DROP_POINTS = 20.0
KINDS = {"fp8_long_context": "fp8_accuracy", "baseline_long_context": "baseline_accuracy"}  # kind -> gsm8k's


def fp8_long_context_checks(cell: CellResults, partner: CellResults | None, policy: Policy, *,
                            declared: tuple[int, ...] = (), declared_model: str = "") -> list[Any]:
    return long_context_comparisons(cell, partner, policy, kind="fp8_long_context", reference="auto cell",
                                    margin=policy.fp8_tax_points(cell.identity.model), declared=declared,
                                    declared_model=declared_model,
                                    partner_absent="no auto cell of the same backend, arch, model and task in this "
                                                   "run")


def baseline_long_context_checks(cell: CellResults, old: CellResults | None, policy: Policy, *,
                                 ab: bool = False, declared: tuple[int, ...] = (), declared_model: str = "") -> list[Any]:
    return long_context_comparisons(cell, old, policy, kind="baseline_long_context", declared=declared,
                                    declared_model=declared_model,
                                    reference="base side" if ab else "baseline",
                                    margin=policy.accuracy.baseline_margin_points,
                                    partner_absent="the base side of this A/B run has no long-context results" if ab
                                    else "no long-context results in the baseline", absent_status="missing" if ab
                                    else "not_run")


def long_context_comparisons(cell: CellResults, partner: CellResults | None, policy: Policy, *, kind: str,
                             reference: str, margin: float, partner_absent: str,
                             absent_status: str = "missing", declared: tuple[int, ...] = (),
                             declared_model: str = "") -> list[Any]:
    """One decision per comparison on the primary filter, the other filters reported; nothing when the cell did not
    run the task and the matrix asks none of it (its workload declares none, or its model's positions hold none of
    the lengths). declared: the lengths the matrix's cell runs (kvgate.gate.trusted): a cell that ran none of them
    is a missing comparison (fail closed), never a silent pass. declared_model: the model the matrix says answers
    it (kvgate.gate.trusted): a side answered by another model (status.json long_context.model, 1.12; else the
    cell's model) is an error, and so are two sides answered by different models."""
    own = cell.stage(STAGE)
    base = dict(cell=cell.identity.id, kind=kind, model=cell.identity.model, reference=reference)
    if own.health in ("not_run", "skipped"):
        if not declared or cell.stage("accuracy").health != "ok":
            return []  # no task asked of it, or its engine did not run (the accuracy check says so)
        return [Check(**base, status="missing", detail=(
            f"the matrix declares the passkey task at {', '.join(map(str, declared))} tokens for this cell, but its "
            f"long-context stage is {own.health.replace('_', ' ')}: rerun the cell's accuracy stage"))]
    if own.health != "ok":
        return [Check(**base, status="error" if own.health in ("error", "timeout") else "missing",
                      detail=f"cannot compare: this cell's long-context stage is {own.health.replace('_', ' ')}")]
    theirs = partner.stage(STAGE) if partner is not None else None
    if theirs is None or theirs.health == "not_run":
        return [Check(**base, status=absent_status, detail=partner_absent)]
    if theirs.health != "ok":
        return [Check(**base, status="error" if theirs.health in ("error", "timeout") else "missing",
                      detail=f"cannot compare: the {reference}'s long-context stage is "
                             f"{theirs.health.replace('_', ' ')}")]
    mine, other = answered_by(cell), answered_by(partner)
    for side, model in (("this cell", mine), (f"the {reference}", other)):
        if declared_model and model != declared_model:
            return [Check(**base, status="error", detail=(
                f"{side}'s passkey task was answered by {shown(model)}, but the matrix declares "
                f"{shown(declared_model)} for it (workloads.toml long_context.model): rerun the cell's accuracy "
                "stage with this matrix"))]
    if mine != other:
        return [Check(**base, status="error", detail=(
            f"cannot compare: this cell's passkey task was answered by {shown(mine)}, the {reference}'s by "
            f"{shown(other)}"))]
    acc = policy.accuracy
    primary = acc.primary_filter
    out: list[Any] = []
    for name in [primary, *(f for f in acc.filters if f != primary)]:
        judged = name == primary
        if name not in own.data.scores or name not in theirs.data.scores:
            lacking = "this cell" if name not in own.data.scores else f"the {reference}"
            out.append(Check(**base, subject=name, status="missing" if judged else "info",
                             detail=f"{lacking} has no {name!r} figure for the passkey task"))
            continue
        item = accuracy_comparison(base, name, own.data, theirs.data, margin, policy, judged=judged)
        check = item.check if isinstance(item, Pending) else item
        n = (check.figures or {}).get("n")
        if isinstance(n, int) and n > 0:
            check = replace(check, notes=(*check.notes, power_statement(n, policy, cell.identity.model, kind,
                                                                            margin)))
            item = replace(item, check=check) if isinstance(item, Pending) else check
        out.append(item)
    return out


def answered_by(cell: CellResults) -> str:
    """The model that answered a cell's passkey task: the one status.json names (1.12: an engine of its own), else
    the cell's (its gsm8k engine answered it)."""
    status = cell.stage(STAGE).status
    return status.model if status is not None and status.model else cell.identity.model


def power_statement(n: int, policy: Policy, model: str, kind: str, margin: float) -> str:
    """What n passkey documents can see, at the noise flips the policy measured for the model's gsm8k comparisons."""
    acc = policy.accuracy
    flips = flips_for(policy, model)[KINDS[kind]]
    near = power.power_at(n, flips=flips, margin_points=margin, target_points=margin + acc.gap_points,
                          alpha=acc.alpha)
    large = power.power_at(n, flips=flips, margin_points=margin, target_points=LARGE_DROP_POINTS, alpha=acc.alpha)
    return (f"{n} passkey documents (every declared one; no question plan): a drop of {margin + acc.gap_points:g} pts "
            f"is caught with power {100 * near:.0f} %, one of {LARGE_DROP_POINTS:g} pts with power {100 * large:.0f} % "
            f"at {100 * flips:g} % noise flips (`kvgate power --discordance {flips:g} --n {n} --margin {margin:g} "
            f"--target-drop {LARGE_DROP_POINTS:g}`)")
