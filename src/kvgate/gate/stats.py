"""The gate's statistics: paired accuracy tests, throughput ratio tests, multiplicity. Pure, no I/O.

Accuracy (gsm8k) compares two runs on the same questions, so only the four cell counts of the paired
outcomes matter (both right, only the reference right, only the candidate right, both wrong):

- the p-value is the exact one-sided McNemar test: under "no drop" a discordant question is equally likely
  to go either way, so `only_reference` ~ Binomial(discordant, 1/2); p = P(X >= only_reference);
- the interval is a paired bootstrap over questions, i.e. a multinomial over the four counts (drawn as
  two binomials, which is the same distribution and costs microseconds);
- when no per-question data exists, `unpaired_drop_test` falls back to a z-test from the reported means and
  standard errors, which ignores the pairing and is much weaker (SE about 1.9 points instead of 0.9 at
  n = 1319).

A check fails (`accuracy_regressed`) when the estimated drop is larger than the allowed margin AND the drop
is significantly above zero after the run-wide multiplicity adjustment (`adjust_p_values`). Throughput
(`ratio_test`) compares the medians of repeats and tests the log throughputs with Welch's t.

Every function raises ValueError on impossible input (negative counts, NaN, empty samples); the gate
turns that into a failed check.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

MULTIPLICITY_METHODS = ("holm", "bh", "none")
PAIRED_METHOD = "paired: exact McNemar + paired bootstrap"
UNPAIRED_METHOD = "unpaired: z from reported means (weaker)"
RATIO_METHOD = "ratio of medians; Welch t on log throughput over repeats"
RATIO_TOLERANCE_ONLY = "ratio of medians; tolerance only (fewer than 2 repeats on a side: weaker)"

_NORMAL = NormalDist()


# ---------------------------------------------------------------------------------------------- accuracy

@dataclass(frozen=True, slots=True)
class PairedCounts:
    """Per-question outcomes of a reference run (auto, or the baseline) and a candidate run."""

    both_correct: int
    only_reference: int  # reference right, candidate wrong
    only_candidate: int  # candidate right, reference wrong
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


@dataclass(frozen=True, slots=True)
class DropTest:
    """drop = reference - candidate accuracy, in percentage points; positive = the candidate is worse."""

    drop_points: float
    ci_low_points: float
    ci_high_points: float
    confidence: float
    p_value: float  # one-sided, H0: no drop (drop <= 0)
    n: int
    discordant: int | None
    method: str


def mcnemar_p_values(only_reference: npt.ArrayLike, only_candidate: npt.ArrayLike) -> np.ndarray:
    """One-sided exact McNemar p-values, elementwise: P(X >= only_reference), X ~ Bin(discordant, 1/2).

    Vectorised for the simulation; the tails of each discordant count are computed once and cached.
    """
    b = np.asarray(only_reference, dtype=np.int64)
    c = np.asarray(only_candidate, dtype=np.int64)
    if b.shape != c.shape:
        raise ValueError(f"shapes differ: {b.shape} and {c.shape}")
    if b.size and (b.min() < 0 or c.min() < 0):
        raise ValueError("counts must be >= 0")
    total = b + c
    out = np.empty(b.shape, dtype=float)
    flat_total, flat_b, flat_out = total.ravel(), b.ravel(), out.reshape(-1)
    order = np.argsort(flat_total, kind="stable")
    sorted_total = flat_total[order]
    starts = np.flatnonzero(np.r_[True, sorted_total[1:] != sorted_total[:-1]]) if sorted_total.size else []
    ends = [*starts[1:], sorted_total.size]
    for start, end in zip(starts, ends, strict=True):
        index = order[start:end]
        flat_out[index] = _upper_tails(int(sorted_total[start]))[flat_b[index]]
    return out


def binomial_upper_tail(successes: int, trials: int) -> float:
    """P(X >= successes) for X ~ Binomial(trials, 1/2)."""
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    return float(_upper_tails(trials)[successes])


@lru_cache(maxsize=8192)
def _upper_tails(trials: int) -> np.ndarray:
    """tail[k] = P(X >= k), X ~ Binomial(trials, 1/2), for k = 0 .. trials (read-only array)."""
    k = np.arange(trials + 1)
    log_fact = _log_factorials(trials)
    pmf = np.exp(log_fact[trials] - log_fact[k] - log_fact[trials - k] - trials * math.log(2.0))
    tail = np.cumsum(pmf[::-1])[::-1]  # summed from the small end: tiny tails keep their precision
    tail = np.minimum(tail, 1.0)
    tail[0] = 1.0
    tail.setflags(write=False)
    return tail


_LOG_FACTORIALS = np.zeros(1)


def _log_factorials(upto: int) -> np.ndarray:
    global _LOG_FACTORIALS
    if _LOG_FACTORIALS.size <= upto:
        size = max(upto + 1, 2 * _LOG_FACTORIALS.size)
        _LOG_FACTORIALS = np.array([math.lgamma(i + 1.0) for i in range(size)])
    return _LOG_FACTORIALS


def paired_drop_test(counts: PairedCounts, *, confidence: float = 0.95, n_boot: int = 2000,
                     seed: int = 0) -> DropTest:
    """Exact one-sided McNemar p-value and a paired-bootstrap interval for the drop (points)."""
    _check_confidence(confidence)
    if n_boot < 100:
        raise ValueError(f"n_boot must be at least 100, got {n_boot}")
    n = counts.n
    if n == 0:
        raise ValueError("no questions: both runs are empty")
    b, c = counts.only_reference, counts.only_candidate
    p_value = float(mcnemar_p_values(b, c))
    drops = bootstrap_drops(counts, n_boot=n_boot, seed=seed)
    low, high = np.quantile(drops, [(1 - confidence) / 2, (1 + confidence) / 2])
    return DropTest(drop_points=100.0 * (b - c) / n, ci_low_points=float(low), ci_high_points=float(high),
                    confidence=confidence, p_value=p_value, n=n, discordant=b + c, method=PAIRED_METHOD)


def bootstrap_drops(counts: PairedCounts, *, n_boot: int, seed: int) -> np.ndarray:
    """Drops (points) of n_boot resamples of the questions, i.e. multinomial draws over the 4 counts.

    Only only_reference (b) and only_candidate (c) move the drop, so the multinomial is drawn as
    b* ~ Bin(n, b/n) and c* | b* ~ Bin(n - b*, c / (n - b)): the same distribution, two vector draws.
    """
    n, b, c = counts.n, counts.only_reference, counts.only_candidate
    rng = np.random.default_rng(seed)
    b_star = rng.binomial(n, b / n, size=n_boot)
    rest = n - b
    c_star = rng.binomial(n - b_star, c / rest) if rest else np.zeros(n_boot, dtype=np.int64)
    return 100.0 * (b_star - c_star) / n


def binomial_stderr(mean: float, n: int) -> float:
    """lm-eval's standard error of a mean of 0/1 scores: sqrt(p (1 - p) / (n - 1))."""
    if n < 2:
        raise ValueError(f"need n >= 2, got {n}")
    _check_fraction(mean, "mean")
    return math.sqrt(mean * (1 - mean) / (n - 1))


def unpaired_drop_test(reference_mean: float, reference_stderr: float, candidate_mean: float,
                       candidate_stderr: float, *, n_reference: int, n_candidate: int,
                       confidence: float = 0.95) -> DropTest:
    """Fallback without per-question data: a z-test on the reported means and standard errors.

    It ignores that both runs answer the same questions, so it is far less sensitive than the paired test
    (conservative: it rarely raises a false alarm, and misses drops the paired test would catch).
    """
    _check_confidence(confidence)
    for value, name in ((reference_mean, "reference_mean"), (candidate_mean, "candidate_mean")):
        _check_fraction(value, name)
    for value, name in ((reference_stderr, "reference_stderr"), (candidate_stderr, "candidate_stderr")):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    for value, name in ((n_reference, "n_reference"), (n_candidate, "n_candidate")):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    drop = 100.0 * (reference_mean - candidate_mean)
    se = 100.0 * math.hypot(reference_stderr, candidate_stderr)
    if se == 0:
        p_value = 0.0 if drop > 0 else 1.0
        low = high = drop
    else:
        p_value = 1.0 - _NORMAL.cdf(drop / se)
        half = _NORMAL.inv_cdf((1 + confidence) / 2) * se
        low, high = drop - half, drop + half
    return DropTest(drop_points=drop, ci_low_points=low, ci_high_points=high, confidence=confidence,
                    p_value=p_value, n=min(n_reference, n_candidate), discordant=None, method=UNPAIRED_METHOD)


def accuracy_regressed(test: DropTest, *, margin_points: float, alpha: float, adjusted_p: float) -> bool:
    """Fail when the drop is larger than the margin AND significantly above zero after adjustment."""
    return bool(regressed_mask(test.drop_points, adjusted_p, margin_points=margin_points, alpha=alpha))


def regressed_mask(drop_points: npt.ArrayLike, adjusted_p: npt.ArrayLike, *, margin_points: float,
                   alpha: float) -> np.ndarray:
    """The accuracy rule, elementwise (the simulation applies it to thousands of runs at once)."""
    drop = np.asarray(drop_points, dtype=float)
    p = np.asarray(adjusted_p, dtype=float)
    if np.isnan(drop).any() or np.isnan(p).any():
        raise ValueError("a drop or p-value is NaN")
    _check_alpha(alpha)
    return (drop > margin_points) & (p <= alpha)


# ---------------------------------------------------------------------------------------------- multiplicity

def adjust_p_values(p_values: Sequence[float], method: str) -> list[float]:
    """Adjusted p-values over one family of tests (compare each with alpha).

    holm: Holm's step-down, controls the family-wise error rate under any dependence.
    bh:   Benjamini-Hochberg step-up, controls the false-discovery rate (under independence or positive
          dependence); when nothing changed it also bounds the chance of any false failure by alpha.
    none: unchanged.
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
    """Throughput of the current run against the baseline run's repeats (higher is better)."""

    ratio: float  # median(current) / median(baseline)
    ci_low: float | None  # interval of the geometric-mean ratio (Welch t on the logs)
    ci_high: float | None
    p_value: float | None  # one-sided, H0: current not slower; None with < 2 repeats on a side
    n_baseline: int
    n_current: int
    method: str


def ratio_test(baseline: Sequence[float], current: Sequence[float], *, confidence: float = 0.95) -> RatioTest:
    """Ratio of medians, with Welch's t-test on log throughput when both sides have 2+ repeats."""
    _check_confidence(confidence)
    base = _throughputs(baseline, "baseline")
    cur = _throughputs(current, "current")
    ratio = float(np.median(cur) / np.median(base))
    if base.size < 2 or cur.size < 2:
        return RatioTest(ratio, None, None, None, base.size, cur.size, RATIO_TOLERANCE_ONLY)
    log_base, log_cur = np.log(base), np.log(cur)
    diff = float(log_cur.mean() - log_base.mean())
    var_base = float(log_base.var(ddof=1)) / base.size
    var_cur = float(log_cur.var(ddof=1)) / cur.size
    se = math.sqrt(var_base + var_cur)
    if se == 0:  # identical repeats on both sides: the sign of the difference is certain
        p_value = 0.0 if diff < 0 else 1.0
        low = high = math.exp(diff)
    else:
        df = (var_base + var_cur) ** 2 / (var_base**2 / (base.size - 1) + var_cur**2 / (cur.size - 1))
        p_value = student_t_cdf(diff / se, df)
        half = student_t_ppf((1 + confidence) / 2, df) * se
        low, high = math.exp(diff - half), math.exp(diff + half)
    return RatioTest(ratio, low, high, p_value, base.size, cur.size, RATIO_METHOD)


def _throughputs(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name}: need at least one repeat")
    if not np.isfinite(array).all() or (array <= 0).any():
        raise ValueError(f"{name}: throughputs must be finite and > 0, got {array.tolist()}")
    return array


def throughput_regressed(test: RatioTest, *, tolerance: float, alpha: float, adjusted_p: float | None) -> bool:
    """Fail when current/baseline < 1 - tolerance AND (when a test exists) the slowdown is significant.

    A negative tolerance demands a speed-up (a declared fp8/auto expectation of min_ratio 1.05 is
    tolerance -0.05).
    """
    if not (math.isfinite(tolerance) and tolerance < 1):
        raise ValueError(f"tolerance must be < 1, got {tolerance}")
    _check_alpha(alpha)
    below = test.ratio < 1 - tolerance
    if adjusted_p is None or test.p_value is None:
        return bool(below)
    if math.isnan(adjusted_p):
        raise ValueError("adjusted p-value is NaN")
    return bool(below and adjusted_p <= alpha)


# ---------------------------------------------------------------------------------------------- distributions

def normal_quantile(probability: float) -> float:
    return _NORMAL.inv_cdf(probability)


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return _NORMAL.cdf(-z)


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df (> 0, real) degrees of freedom."""
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    x = df / (df + t * t)
    tail = 0.5 * regularized_incomplete_beta(df / 2, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def student_t_ppf(probability: float, df: float) -> float:
    """The t with P(T <= t) = probability: Newton from the normal quantile, kept inside a bisection bracket."""
    if not 0 < probability < 1:
        raise ValueError(f"probability must be in (0, 1), got {probability}")
    if probability == 0.5:
        return 0.0
    if probability < 0.5:
        return -student_t_ppf(1 - probability, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < probability:
        low, high = high, high * 2
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    t = min(max(_NORMAL.inv_cdf(probability), low), high)
    for _ in range(100):
        error = student_t_cdf(t, df) - probability
        if abs(error) < 1e-14:
            break
        if error < 0:
            low = t
        else:
            high = t
        density = math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))
        step = t - error / density if density > 0 else math.nan
        t = step if low < step < high else 0.5 * (low + high)
        if high - low < 1e-13 * max(1.0, high):
            break
    return t


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) by its continued fraction (modified Lentz), using the symmetry for fast convergence."""
    if not (a > 0 and b > 0):
        raise ValueError("a and b must be > 0")
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1 - x) / b


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1, a - 1
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


# ---------------------------------------------------------------------------------------------- checks

def _check_confidence(confidence: float) -> None:
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def _check_fraction(value: float, name: str) -> None:
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise ValueError(f"{name} must be a fraction in [0, 1], got {value!r}")
