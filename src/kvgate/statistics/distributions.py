"""The distributions kvgate's tests are built from, accurate far into the tails (p-values down to 1e-300): the normal in
log space (its survival function and Mills ratio), Student's t (cdf, log cdf, quantile) through the regularized
incomplete beta, and the binomial's log cdf. Pure; numpy and the standard library only.
"""

from __future__ import annotations

import math
import sys
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

_NORMAL = NormalDist()
SQRT_2PI = math.sqrt(2 * math.pi)
TINY_P = sys.float_info.min  # 2.2e-308: the smallest p-value kvgate reports (never 0)
_LOG_TINY_P = math.log(TINY_P)

_erfc = np.frompyfunc(math.erfc, 1, 1)


_inv_cdf = np.frompyfunc(_NORMAL.inv_cdf, 1, 1)


def log_normal_sf(x: npt.ArrayLike) -> np.ndarray:
    """log P(Z > x), elementwise, accurate far into the upper tail (no underflow to -inf before x ~ 1e154)."""
    x = np.asarray(x, dtype=float)
    out = np.empty_like(x)
    far = x > 30
    near = ~far
    if near.any():
        with np.errstate(divide="ignore"):
            out[near] = np.log(0.5 * _erfc(x[near] / math.sqrt(2)).astype(float))
    if far.any():
        xf = x[far]
        out[far] = -0.5 * xf * xf - np.log(SQRT_2PI) + np.log(_mills_far(xf))
    return out


def normal_mills_ratio(x: npt.ArrayLike) -> np.ndarray:
    """P(Z > x) / pdf(x), elementwise (finite for every finite x >= -37)."""
    x = np.asarray(x, dtype=float)
    out = np.empty_like(x)
    far = x > 30
    near = ~far
    if near.any():
        xn = x[near]
        out[near] = 0.5 * _erfc(xn / math.sqrt(2)).astype(float) * SQRT_2PI * np.exp(0.5 * xn * xn)
    if far.any():
        out[far] = _mills_far(x[far])
    return out


def _mills_far(x: np.ndarray) -> np.ndarray:
    """Laplace's asymptotic series for x > 30 (relative error < 1e-12 there)."""
    inv2 = 1.0 / (x * x)
    return (1 - inv2 * (1 - 3 * inv2 * (1 - 5 * inv2 * (1 - 7 * inv2)))) / x


def normal_quantile(probability: float) -> float:
    return _NORMAL.inv_cdf(probability)


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return _NORMAL.cdf(-z)


def z_from_log_p(log_p: npt.ArrayLike) -> np.ndarray:
    """The z with P(Z > z) = exp(log_p), elementwise (p clamped to [TINY_P, 1 - 1e-16])."""
    log_p = np.asarray(log_p, dtype=float)
    p = np.clip(np.exp(np.maximum(log_p, _LOG_TINY_P)), TINY_P, 1 - 1e-16)
    return -np.asarray(_inv_cdf(p), dtype=float)


def log_normal_sf_scalar(x: float) -> float:
    if x <= 30:
        return math.log(0.5 * math.erfc(x / math.sqrt(2))) if x < 37 else -math.inf
    return -0.5 * x * x - math.log(SQRT_2PI) + math.log(normal_mills_ratio_scalar(x))


def normal_mills_ratio_scalar(x: float) -> float:
    if x <= 30:
        return 0.5 * math.erfc(x / math.sqrt(2)) * SQRT_2PI * math.exp(0.5 * x * x)
    inv2 = 1.0 / (x * x)
    return (1 - inv2 * (1 - 3 * inv2 * (1 - 5 * inv2 * (1 - 7 * inv2)))) / x


def binomial_log_cdf(k: int, n: int, p: float) -> float:
    """log P(X <= k), X ~ Binomial(n, p), summed in log space."""
    if not (0 <= p <= 1) or n < 0:
        raise ValueError(f"need n >= 0 and p in [0, 1], got n={n}, p={p}")
    if k < 0:
        return -math.inf
    if k >= n or p == 0:
        return 0.0
    if p == 1:
        return -math.inf
    i = np.arange(k + 1, dtype=float)
    log_pmf = (math.lgamma(n + 1) - _lgamma(i + 1).astype(float) - _lgamma(n - i + 1).astype(float)
               + i * math.log(p) + (n - i) * math.log1p(-p))
    top = log_pmf.max()
    return float(min(0.0, top + math.log(np.exp(log_pmf - top).sum())))


_lgamma = np.frompyfunc(math.lgamma, 1, 1)


def t_log_cdf(t: float, df: float) -> float:
    """log P(T <= t), accurate in the far lower tail (where the p-values of big slowdowns live)."""
    if math.isinf(df) or df > 1e7:
        return float(log_normal_sf(-t))
    if t >= 0:
        return math.log(student_t_cdf(t, df))
    x = df / (df + t * t)  # P(T <= t) = I_x(df/2, 1/2) / 2 for t < 0
    a, b = df / 2, 0.5
    if x < (a + 1) / (a + b + 2):
        log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
        return math.log(0.5) + log_front + math.log(_beta_continued_fraction(a, b, x) / a)
    return math.log(student_t_cdf(t, df))


def t_quantile(probability: float, df: float) -> float:
    return _NORMAL.inv_cdf(probability) if math.isinf(df) or df > 1e7 else student_t_ppf(probability, df)


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
