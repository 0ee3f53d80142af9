"""The gate's statistics: margin tests for paired accuracy and for throughput, the floor test, multiplicity. Pure.

Every decision is a one-sided test of "the regression is within what the policy allows" (H0), failing only when
the data reject it at the policy's alpha:

- accuracy (`margin_test`): two runs answer the same questions; with b = questions only the reference got right
  and c = only the candidate, the drop is (b - c) / n. H0: drop <= margin. The nuisance (how many questions flip
  at all) is set to its maximum-likelihood value under the H0 boundary (Tango 1998's restricted estimate for
  paired proportions), and the p-value is the tail P(b - c >= observed) of the trinomial at that estimate,
  by a saddlepoint approximation (Lugannani-Rice with the lattice correction; Daniels 1987): kvgate's own code,
  as scipy has no distribution of the difference of two multinomial counts. This is an
  approximation to the "estimated exact" unconditional p-value (Lloyd 2008), cheap enough to vectorise. Its
  size at drop = margin is at most alpha, and close to it (tests/test_stats.py and benchmarks/gate_simulation.py
  simulate it); Tango's plain score z is liberal when few questions flip (up to 1.9 % at alpha 1 %);
- the bounds (`drop_bounds`) invert the same test: the lower bound is the one-sided (1 - alpha) bound the decision
  uses (fail <=> lower bound > margin), the upper bound its mirror, so [lower, upper] is a (1 - 2 alpha) interval;
- accuracy floor (`floor_test`): H0: true accuracy >= floor, exact binomial; the Clopper-Pearson upper bound (what
  scipy.stats.binomtest and its proportion_ci give);
- throughput (`paired_ratio_test`, `unpaired_ratio_test`): H0: current / baseline >= min_ratio (1 - tolerance),
  on log throughput. Interleaved A/B repeats pair by round (a paired t over rounds: shared drift cancels);
  otherwise the two means also differ by run-to-run variance, which repeats within one run cannot see, so a
  known run-to-run SD (the policy's, learned from stored runs: `run_to_run_sd_estimate`) is added.

p-values are computed in log space and never reported below TINY_P (the smallest normal double), so none is ever
0. Every function raises ValueError on impossible input; the gate turns that into an errored check.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize

from kvgate.statistics import distributions

MULTIPLICITY_METHODS = ("holm", "bh", "none")
MARGIN_METHOD = "paired margin test (restricted-MLE saddlepoint tail of b - c)"
FLOOR_METHOD = "exact binomial test against the floor"
PAIRED_RATIO_METHOD = "paired t over interleaved rounds, log throughput, against the tolerance"
UNPAIRED_RATIO_METHOD = "t on mean log throughput with the policy's run-to-run SD, against the tolerance"
ENGINE_RATIO_METHOD = ("t on the mean of each side's engines (log throughput): the repeats' spread within an engine "
                       "from this run, the engine-to-engine SD from the policy's measurement, against the tolerance")
TINY_P = distributions.TINY_P  # 2.2e-308: a p-value below this is reported as this, never as 0
_LOG_TINY_P = math.log(TINY_P)


# ---------------------------------------------------------------------------------------------- normal, log space


def reported_p(log_p: float) -> float:
    """A p-value for people and verdict.json: exp(log_p), never below TINY_P (so never 0)."""
    if math.isnan(log_p):
        raise ValueError("p-value is NaN")
    return min(1.0, max(TINY_P, math.exp(log_p)) if log_p > _LOG_TINY_P else TINY_P)


# ---------------------------------------------------------------------------------------------- paired counts

@dataclass(frozen=True, slots=True)
class PairedCounts:
    """Per-question outcomes of a reference run (auto, or the baseline) and a candidate run."""

    both_correct: int
    only_reference: int  # reference right, candidate wrong (b)
    only_candidate: int  # candidate right, reference wrong (c)
    both_wrong: int

    def __post_init__(self) -> None:
        for name in ("both_correct", "only_reference", "only_candidate", "both_wrong"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be a count (an integer >= 0), got {value!r}")

    @property
    def n(self) -> int:
        return int(self.both_correct + self.only_reference + self.only_candidate + self.both_wrong)

    @property
    def discordant(self) -> int:
        return int(self.only_reference + self.only_candidate)

    @property
    def reference_accuracy(self) -> float:
        return (self.both_correct + self.only_reference) / self.n if self.n else math.nan

    @property
    def candidate_accuracy(self) -> float:
        return (self.both_correct + self.only_candidate) / self.n if self.n else math.nan

    @property
    def drop_points(self) -> float:
        return 100.0 * (self.only_reference - self.only_candidate) / self.n if self.n else math.nan

    @classmethod
    def from_outcomes(cls, reference: Sequence[bool], candidate: Sequence[bool]) -> PairedCounts:
        """Counts from per-question outcomes in the same question order (True/1 = correct)."""
        ref = _outcomes(reference, "reference")
        cand = _outcomes(candidate, "candidate")
        if ref.shape != cand.shape:
            raise ValueError(f"the runs cover different numbers of questions: {ref.size} reference, "
                             f"{cand.size} candidate")
        both = int(np.count_nonzero(ref & cand))
        only_ref = int(np.count_nonzero(ref & ~cand))
        only_cand = int(np.count_nonzero(~ref & cand))
        return cls(both, only_ref, only_cand, ref.size - both - only_ref - only_cand)


def _outcomes(values: Sequence[bool], name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} outcomes must be a flat sequence, got shape {array.shape}")
    if array.dtype == bool:
        return array
    if array.size and not np.isin(array, (0, 1)).all():
        raise ValueError(f"{name} outcomes must be true/false or 0/1")
    return array.astype(bool)


# ---------------------------------------------------------------------------------------------- the margin test

def restricted_estimates(b: npt.ArrayLike, c: npt.ArrayLike, n: npt.ArrayLike,
                         delta: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(p10, p01): the maximum-likelihood cell probabilities given p10 - p01 = delta (Tango 1998), elementwise
    (over counts and deltas alike).

    p10 = P(only the reference right), p01 = P(only the candidate right); delta in (-1, 1)."""
    b, c, n, delta = (np.asarray(v, dtype=float) for v in np.broadcast_arrays(b, c, n, delta))
    if ((delta <= -1) | (delta >= 1)).any():
        raise ValueError(f"delta must be in (-1, 1), got {delta[(delta <= -1) | (delta >= 1)].ravel()[0]}")
    negative = delta < 0  # the mirror image: swap the roles of b and c
    bb, cc, d = np.where(negative, c, b), np.where(negative, b, c), np.abs(delta)
    a2 = 2 * n
    b2 = -bb - cc + (2 * n - bb + cc) * d
    c2 = -cc * d * (1 - d)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = (-b2 + np.sqrt(np.maximum(b2 * b2 - 4 * a2 * c2, 0.0))) / (2 * a2)
    x = np.clip(np.nan_to_num(x), 0.0, (1 - d) / 2)
    return np.where(negative, x, x + d), np.where(negative, x + d, x)


def log_difference_tail(s: npt.ArrayLike, n: npt.ArrayLike, p10: npt.ArrayLike, p01: npt.ArrayLike) -> np.ndarray:
    """log P(S >= s) for S = b - c, (b, c, rest) ~ Multinomial(n; p10, p01, 1 - p10 - p01), elementwise.

    Lugannani-Rice's saddlepoint approximation with the continuity correction for a lattice of span 1; near the
    mean, where it is singular, the normal approximation with a continuity correction (p ~ 0.5 there)."""
    s, n, p10, p01 = (np.asarray(v, dtype=float) for v in np.broadcast_arrays(s, n, p10, p01))
    out = np.zeros(s.shape, dtype=float)
    p0 = np.clip(1 - p10 - p01, 0.0, 1.0)
    mean = n * (p10 - p01)
    var = n * (p10 + p01 - (p10 - p01) ** 2)
    impossible = (s > n) | ((p10 <= 0) & (s > 0))
    certain = (s <= -n) | ((p01 <= 0) & (s <= 0)) | (var <= 0) & (s <= mean)
    out[impossible] = -np.inf
    top = (s == n) & ~impossible & ~certain
    with np.errstate(divide="ignore"):
        out[top] = n[top] * np.log(p10[top])
    edge = (p10 <= 0) & (s == 0) & ~impossible & ~certain  # the top of S = -c's support: no c at all
    out[edge] = n[edge] * np.log1p(-p01[edge])
    top |= edge
    rest = ~(impossible | certain | top)
    if rest.any():
        out[rest] = _saddlepoint_log_tail(s[rest], n[rest], p10[rest], p01[rest], p0[rest], mean[rest], var[rest])
    return out


def _saddlepoint_log_tail(s: np.ndarray, n: np.ndarray, p10: np.ndarray, p01: np.ndarray, p0: np.ndarray,
                          mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    y = s / n
    with np.errstate(divide="ignore", invalid="ignore"):  # u = e^t solves K'(t) = y (a quadratic; linear at p10 = 0)
        u = np.where(p10 > 0, (y * p0 + np.sqrt((y * p0) ** 2 + 4 * p10 * p01 * (1 - y * y))) / (2 * p10 * (1 - y)),
                     -p01 * (1 + y) / (y * p0))
        t = np.log(u)
        m = p10 * u + p01 / u + p0
        k2 = (p10 * u + p01 / u) / m - y * y
        w = np.sign(t) * np.sqrt(np.maximum(2 * n * (t * y - np.log(m)), 0.0))
        u1 = -np.expm1(-t) * np.sqrt(n * k2)
    out = np.empty_like(s)
    near = ~(np.abs(t) > 1e-3) | ~np.isfinite(w) | ~np.isfinite(u1) | (u1 == 0) | (w == 0)
    if near.any():  # within ~0.001 SD of the mean: the normal approximation, continuity-corrected
        z = (s[near] - 0.5 - mean[near]) / np.sqrt(np.maximum(var[near], 1e-300))
        out[near] = distributions.log_normal_sf(z)
    far = ~near
    wf, uf = w[far], u1[far]
    upper = wf > 0
    result = np.empty_like(wf)
    if upper.any():  # P = pdf(w) (Mills(w) + 1/u1 - 1/w), kept in log space
        wu, uu = wf[upper], uf[upper]
        bracket = distributions.normal_mills_ratio(wu) + 1 / uu - 1 / wu
        result[upper] = np.where(bracket > 0, -0.5 * wu * wu - math.log(distributions.SQRT_2PI) + np.log(np.maximum(bracket, 1e-300)),
                                 distributions.log_normal_sf(wu))
    lower = ~upper
    if lower.any():  # p > 1/2: no underflow, plain arithmetic
        wl, ul = wf[lower], uf[lower]
        value = 1 - np.exp(distributions.log_normal_sf(-wl)) + np.exp(-0.5 * wl * wl) / distributions.SQRT_2PI * (1 / ul - 1 / wl)
        result[lower] = np.log(np.clip(value, 1e-300, 1.0))
    out[far] = result
    return np.minimum(out, 0.0)


def _check_counts(b: npt.ArrayLike, c: npt.ArrayLike, n: npt.ArrayLike) -> None:
    """What PairedCounts refuses, elementwise: no questions (n = 0 reads as p = 1, a pass), or discordant counts that
    are negative or more than the questions (a drop no data can show)."""
    b, c, n = np.broadcast_arrays(np.asarray(b, dtype=float), np.asarray(c, dtype=float), np.asarray(n, dtype=float))
    bad = ~(n >= 1) | ~(b >= 0) | ~(c >= 0) | ~(b + c <= n)  # NaN counts are bad too
    if bad.any():
        i = np.flatnonzero(bad.ravel())[0]
        raise ValueError(f"impossible counts: {b.ravel()[i]:g} + {c.ravel()[i]:g} discordant of {n.ravel()[i]:g} "
                         "questions (the test needs n >= 1 and 0 <= b + c <= n)")


def margin_log_p(b: npt.ArrayLike, c: npt.ArrayLike, n: npt.ArrayLike, margin: npt.ArrayLike) -> np.ndarray:
    """log p of H0 "drop <= margin" (margin a fraction, e.g. 0.03), elementwise over counts and margins; a
    ValueError for counts no comparison can have (n < 1, b or c negative, b + c > n)."""
    _check_counts(b, c, n)
    p10, p01 = restricted_estimates(b, c, n, margin)
    return log_difference_tail(np.asarray(b) - np.asarray(c), n, p10, p01)


def reverse_margin_log_p(b: npt.ArrayLike, c: npt.ArrayLike, n: npt.ArrayLike, drop: npt.ArrayLike) -> np.ndarray:
    """log p of H0 "drop >= `drop`" (what a futility look tests at margin + gap), elementwise; counts as
    margin_log_p checks them."""
    _check_counts(b, c, n)
    p10, p01 = restricted_estimates(b, c, n, drop)
    return log_difference_tail(np.asarray(c) - np.asarray(b), n, p01, p10)


def margin_rejects(b: npt.ArrayLike, c: npt.ArrayLike, n: npt.ArrayLike, *, margin_points: float,
                   alpha: float) -> np.ndarray:
    """The accuracy rule, elementwise: p <= alpha for H0 "drop <= margin" (the simulation's fast path)."""
    _check_alpha(alpha)
    return margin_log_p(b, c, n, margin_points / 100) <= math.log(alpha)


def drop_bounds(counts: PairedCounts, alpha: float) -> tuple[float, float]:
    """(lower, upper) bounds of the drop in points, each one-sided at 1 - alpha, by inverting the margin test.

    The lower bound is the margin at which H0 "drop <= margin" has p = alpha (fail <=> lower > margin), the upper
    one where H0 "drop >= d" has p = alpha. Solved with the scalar twin of margin_log_p (same formulas in plain
    floats, ~20x faster for one value; tests/test_stats.py checks they agree) by Brent's method to 1e-11 in the
    drop."""
    _check_alpha(alpha)
    b, c, n = counts.only_reference, counts.only_candidate, counts.n
    target = math.log(alpha)
    lower = _root(lambda d: _margin_log_p_scalar(b, c, n, d) - target, -1 + 1e-12, 1 - 1e-12)
    upper = _root(lambda d: _margin_log_p_scalar(c, b, n, -d) - target, -1 + 1e-12, 1 - 1e-12)
    return 100.0 * lower, 100.0 * upper


def _root(f, low: float, high: float) -> float:
    """The root of a monotone f on [low, high] (scipy.optimize.brentq); the nearer end when f keeps one sign."""
    f_low, f_high = f(low), f(high)
    if (f_low > 0) == (f_high > 0):
        return low if abs(f_low) < abs(f_high) else high
    return optimize.brentq(f, low, high, xtol=1e-11)


def _margin_log_p_scalar(b: float, c: float, n: float, delta: float) -> float:
    """margin_log_p for one count and margin, in plain floats (for inverting it)."""
    d = abs(delta)
    bb, cc = (c, b) if delta < 0 else (b, c)
    b2 = -bb - cc + (2 * n - bb + cc) * d
    x = (-b2 + math.sqrt(max(b2 * b2 + 8 * n * cc * d * (1 - d), 0.0))) / (4 * n)
    x = min(max(x, 0.0), (1 - d) / 2)
    p10, p01 = (x, x + d) if delta < 0 else (x + d, x)
    return _log_tail_scalar(b - c, n, p10, p01)


def _log_tail_scalar(s: float, n: float, p10: float, p01: float) -> float:
    """log_difference_tail for one value, in plain floats (the same cases and formulas)."""
    p0 = min(max(1 - p10 - p01, 0.0), 1.0)
    mean = n * (p10 - p01)
    var = n * (p10 + p01 - (p10 - p01) ** 2)
    if s > n or (p10 <= 0 and s > 0):
        return -math.inf
    if s <= -n or (p01 <= 0 and s <= 0) or (var <= 0 and s <= mean):
        return 0.0
    if s == n:
        return n * math.log(p10)
    if p10 <= 0 and s == 0:
        return n * math.log1p(-p01)
    y = s / n
    if p10 > 0:
        u = (y * p0 + math.sqrt((y * p0) ** 2 + 4 * p10 * p01 * (1 - y * y))) / (2 * p10 * (1 - y))
    else:
        u = -p01 * (1 + y) / (y * p0) if y * p0 != 0 else math.inf
    t = math.log(u) if 0 < u < math.inf else -math.inf
    if not abs(t) > 1e-3 or math.isinf(t):
        return float(distributions.log_normal_sf((s - 0.5 - mean) / math.sqrt(max(var, 1e-300))))
    m = p10 * u + p01 / u + p0
    k2 = (p10 * u + p01 / u) / m - y * y
    w = math.copysign(math.sqrt(max(2 * n * (t * y - math.log(m)), 0.0)), t)
    u1 = -math.expm1(-t) * math.sqrt(max(n * k2, 0.0))
    if w == 0 or u1 == 0:
        return float(distributions.log_normal_sf((s - 0.5 - mean) / math.sqrt(max(var, 1e-300))))
    if w > 0:
        bracket = float(distributions.normal_mills_ratio(w)) + 1 / u1 - 1 / w
        if bracket <= 0:
            return min(float(distributions.log_normal_sf(w)), 0.0)
        return min(-0.5 * w * w - math.log(distributions.SQRT_2PI) + math.log(max(bracket, 1e-300)), 0.0)
    value = 1 - math.exp(distributions.log_normal_sf(-w)) + math.exp(-0.5 * w * w) / distributions.SQRT_2PI * (1 / u1 - 1 / w)
    return min(math.log(min(max(value, 1e-300), 1.0)), 0.0)


@dataclass(frozen=True, slots=True)
class MarginTest:
    """H0: drop <= margin (drop = reference - candidate accuracy, points); the check fails when p <= alpha."""

    drop_points: float
    margin_points: float
    alpha: float
    p_value: float  # one-sided, never below TINY_P
    log_p_value: float
    lower_points: float  # one-sided (1 - alpha) lower bound of the drop: fail <=> lower > margin
    upper_points: float  # one-sided (1 - alpha) upper bound
    n: int
    discordant: int
    method: str = MARGIN_METHOD

    @property
    def regressed(self) -> bool:
        return self.log_p_value <= math.log(self.alpha)


def margin_test(counts: PairedCounts, *, margin_points: float, alpha: float) -> MarginTest:
    if counts.n == 0:
        raise ValueError("no questions: both runs are empty")
    if not 0 <= margin_points < 100:
        raise ValueError(f"margin must be in [0, 100) points, got {margin_points}")
    _check_alpha(alpha)
    log_p = float(margin_log_p(counts.only_reference, counts.only_candidate, counts.n, margin_points / 100))
    lower, upper = drop_bounds(counts, alpha)
    return MarginTest(drop_points=counts.drop_points, margin_points=margin_points, alpha=alpha,
                      p_value=reported_p(log_p), log_p_value=log_p, lower_points=lower, upper_points=upper,
                      n=counts.n, discordant=counts.discordant)


def accuracy_regressed(test: MarginTest, *, alpha: float, adjusted_p: float | None = None) -> bool:
    """Fail when H0 "drop <= margin" is rejected: p (adjusted, when a multiplicity rule applies) <= alpha."""
    _check_alpha(alpha)
    p = test.p_value if adjusted_p is None else adjusted_p
    if math.isnan(p):
        raise ValueError("p-value is NaN")
    return p <= alpha


# ---------------------------------------------------------------------------------------------- accuracy floor


@dataclass(frozen=True, slots=True)
class FloorTest:
    """H0: the true accuracy is at least the floor; fails when p <= alpha (the upper bound is below the floor)."""

    accuracy: float
    floor: float
    alpha: float
    p_value: float
    log_p_value: float
    upper: float  # one-sided (1 - alpha) Clopper-Pearson upper bound of the accuracy
    correct: int
    n: int
    method: str = FLOOR_METHOD


def floor_test(correct: int, n: int, *, floor: float, alpha: float) -> FloorTest:
    if n < 1 or not 0 <= correct <= n:
        raise ValueError(f"need 0 <= correct <= n and n >= 1, got {correct} of {n}")
    if not 0 < floor < 1:
        raise ValueError(f"floor must be in (0, 1), got {floor}")
    _check_alpha(alpha)
    log_p = distributions.binomial_log_cdf(correct, n, floor)
    return FloorTest(accuracy=correct / n, floor=floor, alpha=alpha, p_value=reported_p(log_p), log_p_value=log_p,
                     upper=distributions.binomial_upper_bound(correct, n, alpha), correct=correct, n=n)


# ---------------------------------------------------------------------------------------------- multiplicity

def adjust_p_values(p_values: Sequence[float], method: str) -> list[float]:
    """Adjusted p-values over one family of tests (compare each with alpha).

    holm: Holm's step-down, controls the family-wise error rate under any dependence.
    bh:   Benjamini-Hochberg step-up, controls the false-discovery rate (under independence or positive
          dependence).
    none: unchanged (each test at alpha on its own; the policy says why that is enough for margin tests).
    """
    return [float(p) for p in adjust_p_value_matrix(np.asarray(p_values, dtype=float), method)]


def adjust_p_value_matrix(p_values: np.ndarray, method: str) -> np.ndarray:
    """adjust_p_values along the last axis (one family per row)."""
    if method not in MULTIPLICITY_METHODS:
        raise ValueError(f"unknown multiplicity method {method!r}; known: {', '.join(MULTIPLICITY_METHODS)}")
    p = np.asarray(p_values, dtype=float)
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError("p-values must lie in [0, 1]")
    m = p.shape[-1] if p.ndim else 0
    if method == "none" or m == 0:
        return p.copy()
    order = np.argsort(p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1)
    if method == "holm":
        adjusted = np.maximum.accumulate(ranked * (m - np.arange(m)), axis=-1)
    else:
        scaled = ranked * (m / np.arange(1, m + 1))
        adjusted = np.minimum.accumulate(scaled[..., ::-1], axis=-1)[..., ::-1]
    out = np.empty_like(p)
    np.put_along_axis(out, order, np.minimum(adjusted, 1.0), axis=-1)
    return out


# ---------------------------------------------------------------------------------------------- throughput

@dataclass(frozen=True, slots=True)
class RatioTest:
    """Throughput of the current run against a reference (higher is better); H0: ratio >= min_ratio."""

    ratio: float  # median(current) / median(reference), for people
    estimate: float  # the tested ratio: exp(mean log difference)
    lower: float  # one-sided (1 - alpha) bounds of the tested ratio; fail <=> upper < min_ratio
    upper: float
    p_value: float
    log_p_value: float
    min_ratio: float
    alpha: float
    n_baseline: int
    n_current: int
    df: float  # degrees of freedom of the t (inf: normal)
    se_log: float
    method: str

    @property
    def regressed(self) -> bool:
        return self.log_p_value <= math.log(self.alpha)


def paired_ratio_test(baseline: Mapping[int, float], current: Mapping[int, float], *, min_ratio: float,
                      alpha: float) -> RatioTest:
    """Interleaved repeats, paired by round: t over the rounds' log differences (R - 1 degrees of freedom)."""
    _check_ratio_inputs(min_ratio, alpha)
    if set(baseline) != set(current):
        only_base = sorted(set(baseline) - set(current))
        only_cur = sorted(set(current) - set(baseline))
        raise ValueError(f"the interleaved rounds differ: {rounds_text(only_base)} only on the baseline side, "
                         f"{rounds_text(only_cur)} only on the current side")
    rounds = sorted(baseline)
    base = _throughputs([baseline[r] for r in rounds], "baseline")
    cur = _throughputs([current[r] for r in rounds], "current")
    if len(rounds) < 2:
        raise ValueError(f"{len(rounds)} interleaved round: the paired test needs at least 2")
    diff = np.log(cur) - np.log(base)
    se = float(diff.std(ddof=1)) / math.sqrt(diff.size)
    return _ratio_result(base, cur, float(diff.mean()), se, diff.size - 1.0, min_ratio, alpha, PAIRED_RATIO_METHOD)


def unpaired_ratio_test(baseline: Sequence[float], current: Sequence[float], *, min_ratio: float, alpha: float,
                        run_to_run_sd: float) -> RatioTest:
    """Two runs (a stored baseline, or two cells of one run): the difference of mean log throughputs, with
    SE^2 = s_within^2 (1/R_b + 1/R_c) + 2 run_to_run_sd^2 and Satterthwaite's degrees of freedom (the run-to-run
    part is known, so it adds none)."""
    _check_ratio_inputs(min_ratio, alpha)
    if not (math.isfinite(run_to_run_sd) and run_to_run_sd >= 0):
        raise ValueError(f"run_to_run_sd must be >= 0, got {run_to_run_sd}")
    base = _throughputs(baseline, "baseline")
    cur = _throughputs(current, "current")
    df_within = base.size + cur.size - 2
    if df_within < 1:
        raise ValueError("a single repeat on each side: the within-run spread cannot be estimated (needs 2 repeats "
                         "on one side at least)")
    log_b, log_c = np.log(base), np.log(cur)
    pooled = (float(((log_b - log_b.mean()) ** 2).sum()) + float(((log_c - log_c.mean()) ** 2).sum())) / df_within
    within = pooled * (1 / base.size + 1 / cur.size)
    se2 = within + 2 * run_to_run_sd**2
    df = math.inf if within == 0 else se2**2 / (within**2 / df_within)
    return _ratio_result(base, cur, float(log_c.mean() - log_b.mean()), math.sqrt(se2), df, min_ratio, alpha,
                         UNPAIRED_RATIO_METHOD)


def engine_ratio_test(baseline: Sequence[Sequence[float]], current: Sequence[Sequence[float]], *, min_ratio: float,
                      alpha: float, engine_sd: tuple[float, float]) -> RatioTest:
    """Each side's throughput measured in engines (one engine start, several repeats in it). An engine's level varies
    between starts by an SD no number of repeats in it averages away; kvgate takes that SD from the policy's
    measurement (engine_sd: the baseline's, the current side's) and the repeats' spread within an engine from the
    run. Each side's level is the mean of its engines' mean log throughput, with variance
        engine_sd^2 / E + s_within^2 x mean(1 / R_j) / E,
    s_within^2 pooled over every engine of both sides (n - E degrees of freedom); the difference of the two levels is
    tested with Satterthwaite's degrees of freedom (the engine part is known, so it adds none). With one repeat per
    engine the within spread cannot be told from the engines' and a ValueError says so."""
    _check_ratio_inputs(min_ratio, alpha)
    for value in engine_sd:
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"engine_sd must be >= 0, got {value}")
    sides = []
    for engines, name in ((baseline, "baseline"), (current, "current")):
        if not engines:
            raise ValueError(f"{name}: need at least one engine")
        sides.append([np.log(_throughputs(values, name)) for values in engines])
    df_within = sum(e.size - 1 for side in sides for e in side)
    if df_within < 1:
        raise ValueError("one repeat in every engine: the spread within an engine cannot be estimated (needs 2 "
                         "repeats in one engine at least)")
    within_sd2 = sum(float(((e - e.mean()) ** 2).sum()) for side in sides for e in side) / df_within
    levels, engine_parts, within_parts = [], [], []
    for side, sd in zip(sides, engine_sd, strict=True):
        count = len(side)
        levels.append(float(np.mean([e.mean() for e in side])))
        engine_parts.append(sd**2 / count)
        within_parts.append(within_sd2 * float(np.mean([1 / e.size for e in side])) / count)
    within = sum(within_parts)
    se2 = within + sum(engine_parts)
    df = math.inf if within == 0 else se2**2 / (within**2 / df_within)
    base = np.exp(np.concatenate(sides[0]))
    cur = np.exp(np.concatenate(sides[1]))
    return _ratio_result(base, cur, levels[1] - levels[0], math.sqrt(se2), df, min_ratio, alpha, ENGINE_RATIO_METHOD)


MAX_LOG_RATIO = math.log(sys.float_info.max)  # math.exp of more overflows


def _ratio_result(base: np.ndarray, cur: np.ndarray, diff: float, se: float, df: float, min_ratio: float,
                  alpha: float, method: str) -> RatioTest:
    shift = diff - math.log(min_ratio)
    quantile = 0.0 if se == 0 else distributions.t_quantile(1 - alpha, df)
    if diff + quantile * se > MAX_LOG_RATIO:  # the sides' throughputs, or their spread, span more than a float
        raise ValueError(f"the ratio or its upper bound is past a float's range (log ratio {diff:.4g}, standard error "
                         f"{se:.4g}): the repeats' throughputs span more than any measurement can")
    if se == 0:
        log_p = 0.0 if shift >= 0 else -math.inf
        lower = upper = math.exp(diff)
    else:
        log_p = distributions.t_log_cdf(shift / se, df)
        lower, upper = math.exp(diff - quantile * se), math.exp(diff + quantile * se)
    return RatioTest(ratio=float(np.median(cur) / np.median(base)), estimate=math.exp(diff), lower=lower, upper=upper,
                     p_value=reported_p(log_p), log_p_value=log_p, min_ratio=min_ratio, alpha=alpha,
                     n_baseline=base.size, n_current=cur.size, df=df, se_log=se, method=method)


def _check_ratio_inputs(min_ratio: float, alpha: float) -> None:
    if not (math.isfinite(min_ratio) and min_ratio > 0):
        raise ValueError(f"min_ratio must be > 0, got {min_ratio}")
    _check_alpha(alpha)


def rounds_text(rounds: list[int]) -> str:
    """'none', 'round 3' or 'rounds 3, 4'."""
    return "none" if not rounds else "round " + ", ".join(map(str, rounds)) if len(rounds) == 1 else \
        "rounds " + ", ".join(map(str, rounds))


def _throughputs(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name}: need at least one repeat")
    if not np.isfinite(array).all() or (array <= 0).any():
        raise ValueError(f"{name}: throughputs must be finite and > 0, got {array.tolist()}")
    return array


def throughput_regressed(test: RatioTest, *, alpha: float, adjusted_p: float | None = None) -> bool:
    """Fail when H0 "ratio >= min_ratio" is rejected: p (adjusted, when a multiplicity rule applies) <= alpha."""
    _check_alpha(alpha)
    p = test.p_value if adjusted_p is None else adjusted_p
    if math.isnan(p):
        raise ValueError("adjusted p-value is NaN")
    return p <= alpha


def run_to_run_sd_estimate(runs: Sequence[Sequence[float]]) -> tuple[float, int]:
    """The SD of a run's level of log throughput between runs, from stored runs of unchanged code (each a list
    of its repeats): one-way random-effects ANOVA, method of moments, (MS_between - MS_within) / n0, floored at
    0. Returns (sd, degrees of freedom between runs). Feed it the same cell's runs on one machine type."""
    groups = [np.log(_throughputs(r, f"run {i}")) for i, r in enumerate(runs)]
    if len(groups) < 2:
        raise ValueError("need at least 2 stored runs")
    sizes = np.array([g.size for g in groups], dtype=float)
    total = sizes.sum()
    grand = sum(float(g.sum()) for g in groups) / total
    between = sum(g.size * (float(g.mean()) - grand) ** 2 for g in groups) / (len(groups) - 1)
    df_within = total - len(groups)
    within = sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / df_within if df_within > 0 else 0.0
    n0 = (total - float((sizes**2).sum()) / total) / (len(groups) - 1)
    return math.sqrt(max(0.0, (between - within) / n0)), len(groups) - 1


# ---------------------------------------------------------------------------------------------- checks

def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
