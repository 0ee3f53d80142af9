"""The distributions kvgate's tests are built from, as scipy.special computes them: the normal in log space (its
survival function and Mills ratio, accurate far into the tails), Student's t (log cdf, quantile) and the binomial
(log cdf, the Clopper-Pearson bound). Pure.

scipy.special's ufuncs rather than scipy.stats' distribution objects: the same functions (scipy.stats.norm.logsf
is log_ndtr, scipy.stats.t.cdf is stdtr, scipy.stats.binom.cdf is bdtr), without the per-call argument checking
that costs ~50 us a call, since the gate and the simulations call these hundreds of thousands of times. Each
takes scalars or numpy arrays.

A p-value below TINY_P is reported as TINY_P (kvgate.statistics.margins.reported_p), so a log cdf that scipy can
only give as log(cdf), -inf below ~1e-308 (Student's t, the binomial), is enough: every figure the gate reports
and every decision it makes is the same as with the exact logarithm.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import numpy.typing as npt
from scipy import special

SQRT_2PI = math.sqrt(2 * math.pi)
TINY_P = sys.float_info.min  # 2.2e-308: the smallest p-value kvgate reports (never 0)
_LOG_TINY_P = math.log(TINY_P)
_LOG_ALMOST_1 = math.log(1 - 1e-16)


def log_normal_sf(x: npt.ArrayLike) -> np.ndarray:
    """log P(Z > x), elementwise, accurate far into the upper tail (scipy.special.log_ndtr)."""
    return special.log_ndtr(-np.asarray(x, dtype=float))


def normal_mills_ratio(x: npt.ArrayLike) -> np.ndarray:
    """P(Z > x) / pdf(x), elementwise: sqrt(pi / 2) erfcx(x / sqrt(2)), finite for every x >= -37."""
    return math.sqrt(math.pi / 2) * special.erfcx(np.asarray(x, dtype=float) / math.sqrt(2))


def normal_quantile(probability: float) -> float:
    """The z with P(Z <= z) = probability."""
    if not 0 < probability < 1:
        raise ValueError(f"probability must be in (0, 1), got {probability}")
    return float(special.ndtri(probability))


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return float(special.ndtr(-z))


def z_from_log_p(log_p: npt.ArrayLike) -> np.ndarray:
    """The z with P(Z > z) = exp(log_p), elementwise (p clamped to [TINY_P, 1 - 1e-16])."""
    return -special.ndtri_exp(np.clip(np.asarray(log_p, dtype=float), _LOG_TINY_P, _LOG_ALMOST_1))


def t_log_cdf(t: float, df: float) -> float:
    """log P(T <= t) for Student's t with df (> 0, real or inf) degrees of freedom; -inf below ~1e-308."""
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if math.isinf(df):
        return float(special.log_ndtr(t))
    with np.errstate(divide="ignore"):
        return float(np.log(special.stdtr(df, t)))


def t_quantile(probability: float, df: float) -> float:
    """The t with P(T <= t) = probability, df > 0 (real or inf)."""
    if not 0 < probability < 1:
        raise ValueError(f"probability must be in (0, 1), got {probability}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    return float(special.ndtri(probability) if math.isinf(df) else special.stdtrit(df, probability))


def binomial_log_cdf(k: int, n: int, p: float) -> float:
    """log P(X <= k), X ~ Binomial(n, p) (what scipy.stats.binomtest(k, n, p, alternative="less") gives);
    -inf below ~1e-308."""
    if not (0 <= p <= 1) or n < 0:
        raise ValueError(f"need n >= 0 and p in [0, 1], got n={n}, p={p}")
    if k < 0:
        return -math.inf
    if k >= n:
        return 0.0
    with np.errstate(divide="ignore"):
        return float(np.log(special.bdtr(k, n, p)))


def binomial_upper_bound(k: int, n: int, alpha: float) -> float:
    """The one-sided (1 - alpha) Clopper-Pearson upper bound of a binomial proportion, k of n: the p at which
    P(X <= k) = alpha (scipy.stats.binomtest(k, n, alternative="less").proportion_ci(1 - alpha).high)."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got {k} of {n}")
    return 1.0 if k == n else float(special.betaincinv(k + 1, n - k, 1 - alpha))
