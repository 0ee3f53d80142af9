"""How many questions a cell's accuracy stage draws, and where it may stop: the trusted policy's plan. Pure.

The CLI hands the plan to the runner (which draws that many questions of the task's fixed order and stops a
candidate cell at the first look where the sequential design has decided every comparison it is in); the gate
takes the same plan from the same policy to judge, never from the results folder, whose record of what the runner
did must agree with it.

    questions = min(the task's pool, ceil(inflation x n_fixed))   n_fixed: the fixed design's questions for the
                                                                 policy's power at margin + gap, for each comparison
                                                                 kind it takes part in, at the noise measured for its
                                                                 model (design_flips_by_model; else design_flips)
    looks     = ceil(fraction x questions) for the policy's fractions (kvgate.statistics.sequential.looks_for)
A run with no base side on an arch of `single_side_questions` (the README's main job on the CPU) draws that many
instead, in one fixed look: its comparisons state the power they have there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvgate.gate.policy import COMPARISON_KINDS, Policy
from kvgate.statistics import power, sequential


@dataclass(frozen=True, kw_only=True, slots=True)
class QuestionPlan:
    questions: int  # the questions drawn, in the task's fixed order
    looks: tuple[int, ...]  # where a candidate may stop; (questions,) for a fixed design
    fixed_questions: int  # the fixed design's questions for the policy's power (before the sequential inflation;
    #                       more than `questions` where a single-side run or the task's pool holds fewer)
    flips: Mapping[str, float] = field(default_factory=dict)  # comparison kind -> the noise it was sized for
    reason: str = ""  # in words, for the run's first lines and the report

    @property
    def sequential(self) -> bool:
        return len(self.looks) > 1

    @property
    def design(self) -> str:
        return sequential.DESIGN_NAME if self.sequential else FIXED

    def as_record(self) -> dict:
        """The design the runner records it ran (status.json accuracy.question_plan), for the gate to check."""
        return {"design": self.design, "questions": self.questions, "looks": list(self.looks)}


FIXED = "fixed"


def power_at(policy: Policy, plan_: QuestionPlan, n: int, model: str, kind: str) -> float:
    """The power of a comparison of `kind` with n questions to catch a drop of margin + gap, at the noise the plan
    was sized for (fixed design)."""
    margin = policy.fp8_tax_points(model) if kind == "fp8_accuracy" else policy.accuracy.baseline_margin_points
    flips = plan_.flips.get(kind, policy.accuracy.design_flips)
    return _power(n, margin, margin + policy.accuracy.gap_points, flips, policy.accuracy.alpha)


def flips_for(policy: Policy, model: str) -> dict[str, float]:
    measured = policy.accuracy.design_flips_by_model.get(model, {})
    return {kind: measured.get(kind, policy.accuracy.design_flips) for kind in COMPARISON_KINDS}


def plan(policy: Policy, *, arch: str, task: str, model: str, ab: bool) -> QuestionPlan:
    """The plan of a cell's accuracy stage. ab: the cell is compared with a base side or a baseline (an A/B run, a
    run for `--require-baseline`): every comparison powered. The FP8-vs-auto comparison sizes every cell of a model
    (an auto cell is the reference its FP8 cells answer against: both answer the same questions)."""
    acc = policy.accuracy
    pool = acc.pool_questions.get(task)
    note = f"; {acc.pool_notes[task]}" if task in acc.pool_notes else ""
    flips = flips_for(policy, model)
    kinds = ["fp8_accuracy", "baseline_accuracy"] if ab else ["fp8_accuracy"]
    margins = {"fp8_accuracy": policy.fp8_tax_points(model), "baseline_accuracy": acc.baseline_margin_points}
    fixed = max(_needed(margins[kind], margins[kind] + acc.gap_points, flips[kind], acc.alpha, acc.power)
                for kind in kinds)
    if not ab and arch in acc.single_side_questions:
        n = acc.single_side_questions[arch]
        n = min(n, pool) if pool else n
        return QuestionPlan(questions=n, looks=(n,), fixed_questions=fixed, flips=flips,
                            reason=f"a run with no base side on {arch}: {n} questions (single_side_questions), "
                                   f"its power stated{note}")
    fractions = acc.sequential.looks
    inflation = _inflation(fractions, acc.alpha, 1 - acc.power, acc.sequential.beta_spending_rho) \
        if len(fractions) > 1 else 1.0
    wanted = math.ceil(inflation * fixed)
    n = min(wanted, pool) if pool else wanted
    looks = sequential.looks_for(n, fractions) if len(fractions) > 1 else (n,)
    shown = ", ".join(f"{kind} {100 * flips[kind]:g} %" for kind in kinds)
    capped = f", all the {pool} the task holds" if pool and wanted > pool else ""
    return QuestionPlan(questions=n, looks=tuple(dict.fromkeys(looks)), fixed_questions=fixed, flips=flips,
                        reason=f"power {100 * acc.power:g} % at margin + {acc.gap_points:g} pts with noise flips "
                               f"{shown}: {fixed} questions fixed, up to {n} in {len(set(looks))} looks{capped}{note}")


@functools.lru_cache(maxsize=64)
def _needed(margin: float, target: float, flips: float, alpha: float, wanted_power: float) -> int:
    return power.questions_needed(margin_points=margin, target_points=target, flips=flips, alpha=alpha,
                                  power=wanted_power)


@functools.lru_cache(maxsize=256)
def _power(n: int, margin: float, target: float, flips: float, alpha: float) -> float:
    return power.power_at(n, flips=flips, margin_points=margin, target_points=target, alpha=alpha)


@functools.lru_cache(maxsize=16)
def _inflation(fractions: tuple[float, ...], alpha: float, beta: float, rho: float) -> float:
    return sequential.boundaries(tuple(fractions), alpha=alpha, beta=beta, rho=rho).inflation
