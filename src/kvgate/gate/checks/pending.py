"""A check whose decision waits for its p-value (adjusted together with its family), and that decision."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvgate.gate.checks.formatting import p_text
from kvgate.gate.verdict import Check


@dataclass(slots=True)
class Pending:
    """A check whose decision waits for the adjusted p-value."""

    check: Check
    test: Any
    decide: Callable[[Any, float | None], bool]
    passed_text: str
    failed_text: str
    failed_headline: str = ""
    family: str = "accuracy"  # accuracy | throughput: p-values are adjusted per family


def decide(item: Pending, adjusted: float | None) -> Check:
    regressed = item.decide(item.test, adjusted)
    shown_p = p_text(item.test.p_value, adjusted)
    detail = (item.failed_text if regressed else item.passed_text) + (f", {shown_p}" if shown_p else "")
    headline = f"{item.failed_headline} ({shown_p})" if regressed and shown_p and item.failed_headline else ""
    return replace(item.check, status="fail" if regressed else "pass", adjusted_p_value=adjusted, detail=detail,
                   headline=headline or (item.failed_headline if regressed else ""))
