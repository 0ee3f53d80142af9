"""Stopping a candidate cell's questions early: after each look of the policy's sequential design, its answers so far
against every reference it is compared with (the auto cell, the base side), and stop when all are decided.

The runner asks the same boundaries the gate replays (kvgate.statistics.sequential); the gate never trusts this
decision, it replays every look itself from the answers. Only a candidate stops: a cell other comparisons use as
their reference (an auto cell, a base side) answers every question of the plan.

    Design                            the policy's questions and looks for a cell (from the CLI)
    read_outcomes(folder, filter)     doc_id -> right or wrong, from an lm-eval samples file under `folder`
    Plan.from_file(path)              the worker's looks and references (written by the accuracy stage)
    decide(plan, answers, n)          [(reference, the look's decision)] once n questions are answered
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgate.statistics import sequential

FIXED = "fixed"


@dataclass(frozen=True, kw_only=True, slots=True)
class Design:
    """How many questions a cell's accuracy stage answers and where it may stop: the trusted policy's plan
    (kvgate.gate.question_plan, handed over by the CLI), in the terms the runner needs."""

    questions: int  # the first `questions` of the task's fixed order
    looks: tuple[int, ...]  # (questions,): a fixed design
    alpha: float
    beta: float
    rho: float
    gap_points: float
    filter: str  # the policy's primary filter
    margins: Mapping[str, float] = field(default_factory=dict)  # comparison kind -> margin, points
    reason: str = ""

    @property
    def name(self) -> str:
        return sequential.DESIGN_NAME if len(self.looks) > 1 else FIXED

    def record(self) -> dict[str, Any]:
        """status.json accuracy.question_plan, before the stage's own figures (answered, seconds) are added."""
        return {"design": self.name, "questions": self.questions, "looks": list(self.looks)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Reference:
    label: str  # "auto cell", "base side"
    kind: str  # the gate's check kind: fp8_accuracy | baseline_accuracy
    margin_points: float
    samples: str  # the reference's accuracy folder (its lm-eval samples file lies under it)


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What the worker of a candidate cell reads: the design's looks and the references it may stop against."""

    looks: tuple[int, ...]
    alpha: float
    beta: float
    rho: float
    gap_points: float
    filter: str
    references: tuple[Reference, ...] = field(default_factory=tuple)

    @classmethod
    def for_candidate(cls, design: Design, references: tuple[Reference, ...]) -> Plan:
        return cls(looks=design.looks, alpha=design.alpha, beta=design.beta, rho=design.rho,
                   gap_points=design.gap_points, filter=design.filter, references=references)

    def as_dict(self) -> dict[str, Any]:
        return {"looks": list(self.looks), "alpha": self.alpha, "beta": self.beta, "rho": self.rho,
                "gap_points": self.gap_points, "filter": self.filter,
                "references": [{"label": r.label, "kind": r.kind, "margin_points": r.margin_points,
                                "samples": r.samples} for r in self.references]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(looks=tuple(int(n) for n in data["looks"]), alpha=float(data["alpha"]), beta=float(data["beta"]),
                   rho=float(data["rho"]), gap_points=float(data["gap_points"]), filter=str(data["filter"]),
                   references=tuple(Reference(label=str(r["label"]), kind=str(r["kind"]),
                                              margin_points=float(r["margin_points"]), samples=str(r["samples"]))
                                    for r in data.get("references", [])))

    @classmethod
    def from_file(cls, path: Path) -> Plan:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def read_outcomes(folder: Path, filter_name: str) -> dict[int, bool]:
    """doc_id -> the answer was right (exact_match 1) on this filter, from the one samples_*.jsonl under folder."""
    found = sorted(Path(folder).rglob("samples_*.jsonl"))
    if len(found) != 1:
        raise ValueError(f"{folder}: expected one lm-eval samples file, found {len(found)}")
    outcomes: dict[int, bool] = {}
    with open(found[0], encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("filter") == filter_name:
                outcomes[int(record["doc_id"])] = float(record.get("exact_match", 0.0)) == 1.0
    return outcomes


def decide(plan: Plan, references: Mapping[str, Mapping[int, bool]], answers: Mapping[int, bool],
           n: int) -> list[tuple[Reference, sequential.Look | None]]:
    """Each reference's decision over the first n questions (None: it has not answered them all)."""
    out = []
    for reference in plan.references:
        theirs = references.get(reference.label, {})
        if any(doc not in theirs or doc not in answers for doc in range(n)):
            out.append((reference, None))
            continue
        only_ref = sum(1 for doc in range(n) if theirs[doc] and not answers[doc])
        only_cand = sum(1 for doc in range(n) if answers[doc] and not theirs[doc])
        design = sequential.design(plan.looks, alpha=plan.alpha, beta=plan.beta, rho=plan.rho,
                                   margin_points=reference.margin_points, gap_points=plan.gap_points)
        out.append((reference, sequential.decide(design, only_ref, only_cand, n)))
    return out


def all_decided(decisions: list[tuple[Reference, sequential.Look | None]]) -> bool:
    return bool(decisions) and all(look is not None and look.action != "continue" for _, look in decisions)
