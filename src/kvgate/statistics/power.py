"""What the gate's tests can see: questions and repeats needed, false alarms and power. Pure.

Accuracy: the paired margin test of kvgate.statistics.margins (H0: drop <= margin). Its operating characteristics at a
given n are computed exactly, not by a normal approximation: for each number c of questions only the candidate
got right, the test rejects from some b = critical(c) on (the p-value falls as b grows), so

    P(fail) = sum_c P(c) P(b >= critical(c) | c),   c ~ Bin(n, p01),  b | c ~ Bin(n - c, p10 / (1 - p01))

summed over the few hundred c that carry any probability. The question model: two runs of unchanged code
disagree on a share `flips` of the questions, half each way; a regression of `drop` breaks right answers on top
(p10 = flips / 2 + drop, p01 = flips / 2), the most variance a drop that only breaks answers can add, so a
generator whose regression hides inside the flips needs fewer questions than these.

Throughput: rounds of interleaved A/B repeats (paired t, exact through scipy's noncentral t), and what a stored
baseline can reach given the run-to-run SD.

Sequential designs: kvgate.statistics.sequential; here the plan in questions (`sequential_plan`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from kvgate.statistics import distributions, margins, sequential


def paired_probabilities(*, flips: float, drop_points: float) -> tuple[float, float]:
    """(p10, p01) for noise flips `flips` (a share) and a regression of drop_points that breaks right answers."""
    if not 0 <= flips < 1:
        raise ValueError(f"flips must be a share in [0, 1), got {flips}")
    p01 = flips / 2
    p10 = flips / 2 + drop_points / 100
    if p10 < 0 or p10 + p01 > 1:
        raise ValueError(f"impossible: flips {flips}, drop {drop_points} points")
    return p10, p01


def critical_counts(n: int, c: np.ndarray, *, margin_points: float, alpha: float) -> np.ndarray:
    """For each c, the smallest b with which the margin test rejects at alpha (n - c + 1 where none does)."""
    c = np.asarray(c, dtype=np.int64)
    low = np.zeros_like(c)  # rejects at b = high, not at b = low - 1 (invariant kept below)
    high = n - c + 1
    target = math.log(alpha)
    for _ in range(int(math.log2(n + 2)) + 2):
        mid = (low + high) // 2
        active = mid < high
        if not active.any():
            break
        rejects = np.zeros(c.shape, dtype=bool)
        rejects[active] = margins.margin_log_p(mid[active], c[active], n, margin_points / 100) <= target
        high = np.where(active & rejects, mid, high)
        low = np.where(active & ~rejects, mid + 1, low)
    return high


def rejection_probability(n: int, p10: float, p01: float, *, margin_points: float, alpha: float) -> float:
    """P(the fixed margin test fails the check) for n questions with cell probabilities p10, p01 (exact up to
    the c beyond 12 SD of its mean, which are dropped): scipy.stats.binom's pmf of c and survival function of b."""
    if not (0 <= p01 < 1 and 0 <= p10 <= 1 - p01):
        raise ValueError(f"impossible cell probabilities p10={p10}, p01={p01}")
    spread = 12 * math.sqrt(n * p01 * (1 - p01)) + 5
    c = np.arange(max(0, int(n * p01 - spread)), min(n, int(n * p01 + spread)) + 1) if p01 > 0 else np.zeros(1, int)
    weights = stats.binom.pmf(c, n, p01)
    critical = critical_counts(n, c, margin_points=margin_points, alpha=alpha)
    # P(b >= critical | c), b | c ~ Bin(n - c, p10 / (1 - p01)); critical = n - c + 1 where the test never rejects
    tails = stats.binom.sf(critical - 1, n - c, min(1.0, p10 / (1 - p01)))
    return float(min(1.0, (weights * tails).sum()))


def questions_needed(*, margin_points: float, target_points: float, flips: float, alpha: float,
                     power: float = 0.9) -> int:
    """The smallest n at which the fixed margin test catches a drop of target_points with `power` (exact)."""
    if not target_points > margin_points:
        raise ValueError(f"the target drop ({target_points}) must exceed the margin ({margin_points})")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")
    p10, p01 = paired_probabilities(flips=flips, drop_points=target_points)
    guess = normal_questions(margin_points=margin_points, target_points=target_points, flips=flips, alpha=alpha,
                             power=power)

    def caught(n: int) -> float:
        return rejection_probability(n, p10, p01, margin_points=margin_points, alpha=alpha)

    low, high = max(2, guess // 2), max(4, guess * 2)
    while caught(high) < power:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if caught(mid) >= power else (mid, high)
    # the lattice makes power wiggle by a few tenths of a percent: step on until it stays above for 1 % of n
    n = high
    while any(caught(m) < power for m in (n + max(1, n // 200), n + max(2, n // 100))):
        n += max(1, n // 200)
    return n


def normal_questions(*, margin_points: float, target_points: float, flips: float, alpha: float,
                     power: float = 0.9) -> int:
    """The normal-approximation n (Nam 1997 / Tango 1998): ((z_a sqrt(v0) + z_b sqrt(v1)) / gap)^2."""
    p10, p01 = paired_probabilities(flips=flips, drop_points=target_points)
    margin = margin_points / 100
    r10, r01 = margins.restricted_estimates(p10, p01, 1.0, margin)
    v0 = float(r10 + r01) - margin**2
    v1 = p10 + p01 - (p10 - p01) ** 2
    z_a, z_b = distributions.normal_quantile(1 - alpha), distributions.normal_quantile(power)
    gap = (target_points - margin_points) / 100
    return max(1, math.ceil(((z_a * math.sqrt(v0) + z_b * math.sqrt(v1)) / gap) ** 2))


@dataclass(frozen=True, slots=True)
class AccuracyFigures:
    """The fixed margin test at n questions (exact under the question model above)."""

    n: int
    flips: float
    margin_points: float
    target_points: float
    alpha: float
    fails_at_zero: float
    fails_at_half_margin: float
    fails_at_margin: float  # the test's size: at most alpha
    power_at_target: float
    run_of: int  # a run of this many checks ...
    run_fails_at_half_margin: float  # ... each at margin / 2: P(any fails), independent cells


def accuracy_figures(*, n: int, flips: float, margin_points: float, target_points: float, alpha: float,
                     run_of: int = 32) -> AccuracyFigures:
    def fails(drop: float) -> float:
        p10, p01 = paired_probabilities(flips=flips, drop_points=drop)
        return rejection_probability(n, p10, p01, margin_points=margin_points, alpha=alpha)

    half = fails(margin_points / 2)
    return AccuracyFigures(n=n, flips=flips, margin_points=margin_points, target_points=target_points, alpha=alpha,
                           fails_at_zero=fails(0.0), fails_at_half_margin=half, fails_at_margin=fails(margin_points),
                           power_at_target=fails(target_points), run_of=run_of,
                           run_fails_at_half_margin=1 - (1 - half) ** run_of)


def power_at(n: int, *, flips: float, margin_points: float, target_points: float, alpha: float) -> float:
    p10, p01 = paired_probabilities(flips=flips, drop_points=target_points)
    return rejection_probability(n, p10, p01, margin_points=margin_points, alpha=alpha)


# ---------------------------------------------------------------------------------------------- sequential

@dataclass(frozen=True, slots=True)
class SequentialPlan:
    fixed_questions: int  # the fixed design at the same alpha and power
    max_questions: int
    looks: tuple[int, ...]
    inflation: float
    expected_fraction: dict[str, float]  # scenario -> E[questions] / fixed_questions (canonical approximation)
    fails: dict[str, float]  # scenario -> P(fail)


def sequential_plan(*, fixed_questions: int, fractions: Sequence[float], alpha: float, beta: float, rho: float,
                    margin_points: float, gap_points: float) -> SequentialPlan:
    bounds = sequential.boundaries(tuple(fractions), alpha=alpha, beta=beta, rho=rho)
    max_questions = math.ceil(bounds.inflation * fixed_questions)
    looks = sequential.looks_for(max_questions, fractions)
    scenarios = {"drop 0": 0.0, "margin / 2": margin_points / 2, "margin": margin_points,
                 "margin + gap": margin_points + gap_points}
    expected, fails = {}, {}
    for name, drop in scenarios.items():
        figures = sequential.operating(bounds, (drop - margin_points) / gap_points)
        expected[name] = figures.expected_fraction(bounds.fractions) * max_questions / fixed_questions
        fails[name] = figures.fail
    return SequentialPlan(fixed_questions=fixed_questions, max_questions=max_questions, looks=looks,
                          inflation=bounds.inflation, expected_fraction=expected, fails=fails)


# ---------------------------------------------------------------------------------------------- throughput

def paired_rounds_power(rounds: int, *, repeat_sd: float, tolerance: float, slowdown: float, alpha: float) -> float:
    """P(fail) of the interleaved paired test with `rounds` rounds, each side's repeats with log-SD repeat_sd."""
    if rounds < 2:
        return 0.0
    df = rounds - 1
    se = math.sqrt(2) * repeat_sd / math.sqrt(rounds)
    if se == 0:  # no noise: the test sees the slowdown exactly
        return float(slowdown > tolerance)
    ncp = (math.log(1 - slowdown) - math.log(1 - tolerance)) / se
    # the test fails when T <= -t_{1-alpha}; T is noncentral t (scipy.special.nctdtr: scipy.stats.nct.cdf)
    return float(special.nctdtr(df, ncp, -distributions.t_quantile(1 - alpha, df)))


def rounds_needed(*, repeat_sd: float, tolerance: float, slowdown: float, alpha: float, power: float,
                  most: int = 200) -> int | None:
    """The fewest interleaved rounds that catch `slowdown` with `power` (None when `most` do not)."""
    for rounds in range(2, most + 1):
        if paired_rounds_power(rounds, repeat_sd=repeat_sd, tolerance=tolerance, slowdown=slowdown,
                               alpha=alpha) >= power:
            return rounds
    return None


def stored_power(repeats: float | None, *, repeat_sd: float, run_to_run_sd: float, tolerance: float, slowdown: float,
                 alpha: float) -> float:
    """P(fail) against a stored baseline (normal approximation; repeats None = infinitely many on each side)."""
    within = 0.0 if repeats is None else 2 * repeat_sd**2 / repeats
    se = math.sqrt(within + 2 * run_to_run_sd**2)
    if se == 0:
        return float(slowdown > tolerance)
    shift = (math.log(1 - tolerance) - math.log(1 - slowdown)) / se
    return distributions.normal_sf(distributions.normal_quantile(1 - alpha) - shift)


def engine_ab_power(engines: int, repeats: int, *, repeat_sd: float, engine_sd: float, tolerance: float,
                    slowdown: float, alpha: float) -> float:
    """P(fail) of an A/B whose sides each ran `engines` engines of `repeats` repeats (margins.engine_ratio_test):
    repeats vary repeat_sd within an engine and engines engine_sd between starts, on both sides. With two engines
    a side or more the sides take turns and the gate pairs them by engine (the paired test over the engines' means);
    with one, the engine-level test with the policy's engine_sd."""
    if engines >= 2:
        return paired_rounds_power(engines, repeat_sd=math.sqrt(engine_sd**2 + repeat_sd**2 / repeats),
                                   tolerance=tolerance, slowdown=slowdown, alpha=alpha)
    within = 2 * repeat_sd**2 / (engines * repeats)
    se = math.sqrt(within + 2 * engine_sd**2 / engines)
    df_within = 2 * engines * (repeats - 1)
    df = math.inf if within == 0 or df_within == 0 else se**4 / (within**2 / df_within)
    return ratio_test_power(se, df, tolerance=tolerance, slowdown=slowdown, alpha=alpha)


def ratio_test_power(se_log: float, df: float, *, tolerance: float, slowdown: float, alpha: float) -> float:
    """P(fail) of a throughput margin test with this standard error of the log ratio and degrees of freedom, when the
    true slowdown is `slowdown` (the noncentral t; a normal for infinite df)."""
    if se_log == 0:
        return float(slowdown > tolerance)
    ncp = (math.log(1 - slowdown) - math.log(1 - tolerance)) / se_log
    if not math.isfinite(df):
        return distributions.normal_sf(distributions.normal_quantile(1 - alpha) + ncp)
    caught = float(special.nctdtr(df, ncp, -distributions.t_quantile(1 - alpha, df)))
    if math.isnan(caught):  # scipy's noncentral t gives NaN far out (|ncp| past ~1e9: an SE of ~1e-11, repeats that
        return float(ncp < 0)  # agree to 11 digits); the power there is its limit, as at se_log = 0
    return caught
