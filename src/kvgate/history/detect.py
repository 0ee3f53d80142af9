"""Change points of a series by e-divisive, as Apache Otava implements it (`otava.analysis.compute_change_points`).

Otava's method (Fleming et al., "Hunter", ICPE 2023, https://doi.org/10.1145/3578244.3583719) runs Matteson and
James's e-divisive over sliding windows to propose change points, then keeps a point only while Student's t-test
between the segments either side of it gives a p-value below `max_p_value`, merging the weakest away. kvgate adapts,
never reimplements: it hands Otava the series and reads back each point's index, p-value and means.

Otava is imported only here and only when detection runs, without its dependencies (`pip install --no-deps
apache-otava==0.8.0`; ci/requirements-history.txt pins it with its hash): its analysis module needs only numpy and
scipy, which kvgate already has, while its package pins older ones and brings cloud clients kvgate never calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvgate import InputError

MAX_P_VALUE = 1e-5  # a flagged point's t-test p-value is below this (Otava's default, 1e-3, false-alarms 3.5 %: benchmarks)
WINDOW = 50  # Otava's default window of the e-divisive split step, in runs
MIN_POINTS = 6  # fewer runs than this hold no series to split
OTAVA = "apache-otava==0.8.0"


@dataclass(frozen=True, kw_only=True, slots=True)
class ChangePoint:
    """The first run of a new level: `index` into the series, the t-test p-value and the means either side."""

    index: int
    p_value: float
    mean_before: float
    mean_after: float

    @property
    def change_percent(self) -> float:
        return (self.mean_after / self.mean_before - 1) * 100 if self.mean_before else math.nan


def change_points(values: Sequence[float], *, max_p_value: float = MAX_P_VALUE,
                  window: int = WINDOW) -> list[ChangePoint]:
    """The change points of `values` (in the order main recorded them), earliest first."""
    if len(values) < MIN_POINTS:
        return []
    compute = _otava()
    # a list, not an array: Otava's detector slices its window only out of a sequence that is not an ndarray
    found, _weak = compute([float(v) for v in values], window_len=window, max_pvalue=max_p_value)
    return [ChangePoint(index=int(point.index), p_value=float(point.stats.pvalue),
                        mean_before=float(point.stats.mean_before()), mean_after=float(point.stats.mean_after()))
            for point in sorted(found, key=lambda p: p.index)]


def available() -> bool:
    try:
        _otava()
    except InputError:
        return False
    return True


def _otava():
    try:
        from otava.analysis import compute_change_points
    except ImportError as error:
        raise InputError("kvgate history --detect", f"Apache Otava's change-point detector is not installed ({error})",
                         hint=f"Run `nox -s history -- --detect`, or `pip install --no-deps {OTAVA}`") from None
    return compute_change_points
