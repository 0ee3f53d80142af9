"""The figures' words every check family uses: units, medians, p-values, numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

UNITS = {"requests_per_second": "req/s", "tokens_per_second": "tok/s", "output_tokens_per_second": "output tok/s"}


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def p_text(p: float | None, adjusted: float | None) -> str:
    if p is None:
        return ""
    text = f"p{p_value_shown(p)}"
    if adjusted is not None and abs(adjusted - p) > 1e-12:
        text += f", adj. p{p_value_shown(adjusted)}"
    return text


def p_value_shown(p: float) -> str:
    return "<0.001" if p < 0.001 else f"={p:.3f}"


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "?" if value is None else str(value)
