"""kvgate.statistics.margins: the paired margin test (against exact tails), its bounds, the floor test, multiplicity,
the throughput margin tests (paired by round, and with run-to-run variance), Student's t, log-space p-values."""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from kvgate.statistics import distributions, margins
from kvgate.statistics.margins import (
    MarginTest,
    PairedCounts,
    RatioTest,
    accuracy_regressed,
    adjust_p_value_matrix,
    adjust_p_values,
    drop_bounds,
    floor_test,
    log_difference_tail,
    margin_log_p,
    margin_test,
    paired_ratio_test,
    restricted_estimates,
    throughput_regressed,
    unpaired_ratio_test,
)


def exact_log_tail(s: int, n: int, p10: float, p01: float) -> float:
    """log P(b - c >= s) for (b, c, rest) ~ Multinomial(n; p10, p01, rest), by summing the trinomial."""
    p0 = 1 - p10 - p01
    logs = {k: (math.log(v) if v > 0 else -math.inf) for k, v in (("b", p10), ("c", p01), ("r", p0))}
    terms = []
    for c in range(n + 1):
        for b in range(max(s + c, 0), n - c + 1):
            if (b and logs["b"] == -math.inf) or (c and logs["c"] == -math.inf):
                continue
            terms.append(math.lgamma(n + 1) - math.lgamma(b + 1) - math.lgamma(c + 1) - math.lgamma(n - b - c + 1)
                         + (b * logs["b"] if b else 0.0) + (c * logs["c"] if c else 0.0)
                         + ((n - b - c) * logs["r"] if n - b - c else 0.0))
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


# ---------------------------------------------------------------------------------------------- log space

def test_log_normal_sf_is_accurate_into_the_far_tail() -> None:
    for x in (-3.0, 0.0, 1.0, 5.0, 12.0, 29.9, 37.0):
        assert float(distributions.log_normal_sf(x)) == pytest.approx(math.log(0.5 * math.erfc(x / math.sqrt(2))), rel=1e-12)
    # beyond erfc's range (x > 38): Laplace's asymptotic series, log P(Z > x) = -x^2/2 - log(x sqrt(2 pi))
    # + log(1 - 1/x^2 + 3/x^4 - ...)
    for x in (100.0, 1e4):
        assert float(distributions.log_normal_sf(x)) == pytest.approx(
            -0.5 * x * x - math.log(x * math.sqrt(2 * math.pi)) + math.log1p(-1 / x**2 + 3 / x**4), rel=1e-12)
    assert distributions.log_normal_sf(np.array([-1.0, 50.0])).shape == (2,)  # elementwise


def test_the_mills_ratio_is_the_tail_over_the_density() -> None:
    for x in (-5.0, 0.0, 1.0, 8.0, 30.0):
        density = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        assert float(distributions.normal_mills_ratio(x)) == pytest.approx(0.5 * math.erfc(x / math.sqrt(2)) / density,
                                                                           rel=1e-12)
    for x in (60.0, 1e5):  # where the tail and the density underflow: Laplace's series, 1/x (1 - 1/x^2 + 3/x^4 ...)
        series = (1 - 1 / x**2 + 3 / x**4 - 15 / x**6 + 105 / x**8) / x
        assert float(distributions.normal_mills_ratio(x)) == pytest.approx(series, rel=1e-12)


def test_a_p_value_is_never_reported_as_zero() -> None:
    everything_lost = PairedCounts(both_correct=0, only_reference=1319, only_candidate=0, both_wrong=0)
    test = margin_test(everything_lost, margin_points=3.0, alpha=0.01)
    print(test)
    assert test.log_p_value < -700  # exp() of it underflows ...
    assert test.p_value == sys.float_info.min  # ... so it is reported as the smallest normal double, not 0
    assert test.regressed
    assert margins.reported_p(-5.0) == pytest.approx(math.exp(-5.0))
    assert float(distributions.z_from_log_p(math.log(0.01))) == pytest.approx(2.3263479, abs=1e-6)


# ---------------------------------------------------------------------------------------------- counts

def test_paired_counts_from_outcomes() -> None:
    reference = [True, True, True, False, False, True, False]
    candidate = [True, False, True, True, False, False, False]
    counts = PairedCounts.from_outcomes(reference, candidate)
    assert counts == PairedCounts(both_correct=2, only_reference=2, only_candidate=1, both_wrong=2)
    assert (counts.n, counts.discordant) == (7, 3)
    assert counts.reference_accuracy == pytest.approx(4 / 7)
    assert counts.candidate_accuracy == pytest.approx(3 / 7)
    assert counts.drop_points == pytest.approx(100 / 7)
    assert PairedCounts.from_outcomes([1, 0, 1], [1.0, 1.0, 0.0]) == PairedCounts(1, 1, 1, 0)


def test_paired_counts_refuse_bad_outcomes() -> None:
    with pytest.raises(ValueError) as caught:
        PairedCounts.from_outcomes([True, False], [True, False, True])
    assert str(caught.value) == "the runs cover different numbers of questions: 2 reference, 3 candidate"
    with pytest.raises(ValueError) as caught:
        PairedCounts.from_outcomes([1, 0], [1, 0.5])
    assert str(caught.value) == "candidate outcomes must be true/false or 0/1"
    with pytest.raises(ValueError) as caught:
        PairedCounts(1, 2, -1, 0)
    assert str(caught.value) == "only_candidate must be a count (an integer >= 0), got -1"


# ---------------------------------------------------------------------------------------------- the margin test

@pytest.mark.parametrize("b, c, n, delta", [(78, 54, 1319, 0.03), (30, 2, 400, 0.01), (0, 12, 300, 0.02),
                                             (40, 0, 500, 0.05), (60, 60, 900, -0.02)])
def test_restricted_estimates_maximise_the_likelihood_on_the_h0_boundary(b: int, c: int, n: int, delta: float) -> None:
    p10, p01 = (float(v) for v in restricted_estimates(b, c, n, delta))
    assert p10 - p01 == pytest.approx(delta, abs=1e-12)

    def log_likelihood(x: float) -> float:
        q10, q01 = x + delta, x
        return b * math.log(q10) + c * math.log(q01) + (n - b - c) * math.log(1 - q10 - q01) if q01 > 0 else -math.inf

    grid = np.linspace(max(0, -delta) + 1e-7, (1 - abs(delta)) / 2 - 1e-7, 20001)
    best = max(grid, key=log_likelihood) if c else grid[0]
    assert p01 == pytest.approx(best, abs=2e-4)


def test_at_zero_margin_the_restriction_is_mcnemars() -> None:
    p10, p01 = restricted_estimates(78, 54, 1319, 0.0)
    assert float(p10) == float(p01) == pytest.approx(132 / 2638)


SADDLEPOINT_CASES = {  # (s, n, p10, p01): the tails the gate's p-values are made of
    "near the mean": (10, 200, 0.05, 0.03),
    "1e-4": (20, 200, 0.05, 0.03),
    "1e-20": (60, 300, 0.06, 0.04),
    "1e-55": (150, 400, 0.10, 0.07),
    "lower half": (-5, 300, 0.06, 0.04),
    "no flips back (binomial)": (40, 150, 0.05, 0.0),
    "few flips back": (12, 250, 0.03, 0.002),
    "none flips forward, top of the support": (0, 60, 0.0, 0.1),
}


@pytest.mark.parametrize("s, n, p10, p01", SADDLEPOINT_CASES.values(), ids=SADDLEPOINT_CASES.keys())
def test_the_saddlepoint_tail_matches_the_exact_trinomial(s: int, n: int, p10: float, p01: float) -> None:
    exact = exact_log_tail(s, n, p10, p01)
    approx = float(log_difference_tail(s, n, p10, p01))
    print(f"s={s} n={n}: exact {exact:.6f}, saddlepoint {approx:.6f}")
    assert approx == pytest.approx(exact, abs=2e-3)  # relative error of p below 0.2 %


def test_the_tail_at_the_edges_of_the_support() -> None:
    assert float(log_difference_tail(5, 4, 0.1, 0.1)) == -math.inf  # more than n
    assert float(log_difference_tail(-4, 4, 0.1, 0.1)) == 0.0  # everything
    assert float(log_difference_tail(4, 4, 0.1, 0.1)) == pytest.approx(4 * math.log(0.1))
    assert float(log_difference_tail(0, 50, 0.1, 0.0)) == 0.0  # b - c >= 0 is certain when nothing flips back


def test_the_seed_tax_is_far_from_evidence_beyond_the_margin() -> None:
    """The seed PR's strict-match figures (auto 850, fp8 826 of 1319; 78 + 54 discordant)."""
    counts = PairedCounts(both_correct=772, only_reference=78, only_candidate=54, both_wrong=415)
    test = margin_test(counts, margin_points=3.0, alpha=0.01)
    print(test)
    assert test.drop_points == pytest.approx(100 * 24 / 1319)
    assert 0.9 < test.p_value < 0.95 and not test.regressed
    assert test.lower_points < test.drop_points < test.upper_points
    assert test.lower_points < 3.0  # the decision: fail <=> lower bound > margin
    assert (test.n, test.discordant, test.method) == (1319, 132, margins.MARGIN_METHOD)


def test_a_seven_point_drop_is_evidence_beyond_the_margin() -> None:
    counts = PairedCounts(both_correct=726, only_reference=124, only_candidate=30, both_wrong=439)
    test = margin_test(counts, margin_points=3.0, alpha=0.01)
    assert test.regressed and test.lower_points > 3.0
    assert test.p_value == pytest.approx(3.2426e-06, rel=1e-4)


def test_the_bounds_are_the_test_inverted() -> None:
    """lower bound > margin <=> p <= alpha, over many counts; the bounds sit where p = alpha."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(200, 3000))
        c = int(rng.integers(0, n // 10))
        b = int(rng.integers(0, n // 6))
        counts = PairedCounts(n - b - c, b, c, 0)
        margin = float(rng.choice([1.0, 3.0]))
        test = margin_test(counts, margin_points=margin, alpha=0.01)
        if abs(test.lower_points - margin) > 1e-6:
            assert (test.lower_points > margin) == test.regressed, (b, c, n)
    counts = PairedCounts(700, 100, 40, 479)
    lower, upper = drop_bounds(counts, 0.01)
    assert float(margin_log_p(100, 40, 1319, lower / 100)) == pytest.approx(math.log(0.01), abs=1e-6)
    assert float(margins.reverse_margin_log_p(100, 40, 1319, upper / 100)) == pytest.approx(math.log(0.01), abs=1e-6)


def test_the_scalar_twin_used_for_the_bounds_is_the_vectorised_p_value() -> None:
    rng = np.random.default_rng(1)
    for _ in range(3000):
        n = int(rng.integers(50, 5000))
        b = 0 if rng.random() < 0.1 else int(rng.integers(0, n // 4))
        c = 0 if rng.random() < 0.1 else int(rng.integers(0, n // 4))
        delta = float(rng.uniform(-0.2, 0.3))
        assert margins._margin_log_p_scalar(b, c, n, delta) == pytest.approx(float(margin_log_p(b, c, n, delta)),
                                                                           rel=1e-8, abs=1e-12)


def test_the_rule_and_its_refusals() -> None:
    test = MarginTest(drop_points=4.0, margin_points=1.0, alpha=0.01, p_value=0.004, log_p_value=math.log(0.004),
                      lower_points=1.2, upper_points=6.0, n=1319, discordant=130)
    assert accuracy_regressed(test, alpha=0.01) is True
    assert accuracy_regressed(test, alpha=0.01, adjusted_p=0.02) is False  # a multiplicity rule can lift it
    with pytest.raises(ValueError) as caught:
        accuracy_regressed(test, alpha=0.01, adjusted_p=math.nan)
    assert str(caught.value) == "p-value is NaN"
    with pytest.raises(ValueError) as caught:
        margin_test(PairedCounts(0, 0, 0, 0), margin_points=1.0, alpha=0.01)
    assert str(caught.value) == "no questions: both runs are empty"


# ---------------------------------------------------------------------------------------------- floor

def exact_binomial_cdf(k: int, n: int, p: Fraction) -> float:
    return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1)))


def test_the_floor_test_is_the_exact_binomial() -> None:
    test = floor_test(180, 300, floor=0.65, alpha=0.01)
    assert test.p_value == pytest.approx(exact_binomial_cdf(180, 300, Fraction(65, 100)), rel=1e-9)
    assert exact_binomial_cdf(180, 300, Fraction(test.upper)) == pytest.approx(0.01, rel=1e-9)  # Clopper-Pearson
    scipy_test = stats.binomtest(180, 300, 0.65, alternative="less")
    assert test.p_value == pytest.approx(scipy_test.pvalue, rel=1e-12)
    assert test.upper == pytest.approx(scipy_test.proportion_ci(0.99).high, rel=1e-12)
    assert (test.accuracy, test.correct, test.n) == (0.6, 180, 300)
    seed = floor_test(850, 1319, floor=0.671 * 0.92, alpha=0.01)  # the seed's auto cell: well above the floor
    assert seed.p_value > 0.9 and seed.upper > seed.floor
    broken = floor_test(500, 1319, floor=0.671 * 0.92, alpha=0.01)  # a break that hits auto too
    assert broken.p_value < 1e-20 and broken.upper < broken.floor


# ---------------------------------------------------------------------------------------------- multiplicity

def test_holm_and_bh_on_a_hand_computed_example() -> None:
    p = [0.01, 0.04, 0.03, 0.005]
    assert adjust_p_values(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert adjust_p_values(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust_p_values(p, "none") == p
    assert adjust_p_values([], "bh") == []


def test_benjamini_hochberg_1995_example() -> None:
    """The 15 p-values of Benjamini & Hochberg (1995), section 4.2: at 0.05 BH rejects 4, Bonferroni-Holm 3."""
    p = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719,
         0.6528, 0.7590, 1.000]
    assert sum(q <= 0.05 for q in adjust_p_values(p, "bh")) == 4
    assert sum(q <= 0.05 for q in adjust_p_values(p, "holm")) == 3


def test_adjustment_caps_at_one_and_keeps_order_and_rows() -> None:
    p = np.array([[0.9, 0.5, 0.8], [0.001, 0.02, 0.5]])
    for method in ("holm", "bh"):
        adjusted = adjust_p_value_matrix(p, method)
        assert (adjusted <= 1).all() and (adjusted >= p).all()
        for row in range(2):
            assert adjusted[row].tolist() == adjust_p_values(p[row].tolist(), method)


def test_adjustment_refuses_unknown_methods_and_bad_p_values() -> None:
    with pytest.raises(ValueError) as caught:
        adjust_p_values([0.1], "bonferroni")
    assert str(caught.value) == "unknown multiplicity method 'bonferroni'; known: holm, bh, none"
    with pytest.raises(ValueError) as caught:
        adjust_p_values([0.1, math.nan], "bh")
    assert str(caught.value) == "p-values must lie in [0, 1]"


# ---------------------------------------------------------------------------------------------- throughput

def test_the_paired_ratio_test_is_a_t_over_rounds() -> None:
    base = {1: 3.22, 2: 3.10, 3: 3.30, 4: 3.18}
    head = {1: 2.95, 2: 2.80, 3: 3.02, 4: 2.90}  # each round ~9 % slower, whatever the round's own level
    test = paired_ratio_test(base, head, min_ratio=0.95, alpha=0.05)
    d = np.log([head[r] / base[r] for r in (1, 2, 3, 4)])
    se = d.std(ddof=1) / 2
    print(test)
    assert test.estimate == pytest.approx(math.exp(d.mean()))
    # scipy's one-sample t test of the rounds' log differences against log(0.95), and its confidence interval
    against_tolerance = stats.ttest_1samp(d, math.log(0.95), alternative="less")
    assert test.p_value == pytest.approx(against_tolerance.pvalue, rel=1e-9)
    interval = stats.ttest_1samp(d, 0.0, alternative="less").confidence_interval(0.95)
    assert test.upper == pytest.approx(math.exp(interval.high), rel=1e-12)
    assert test.upper == pytest.approx(math.exp(d.mean() + 2.353363 * se), rel=1e-6)  # t(0.95, 3) from a table
    assert test.regressed and test.upper < 0.95 and test.df == 3
    assert throughput_regressed(test, alpha=0.05) is True


def test_interleaved_rounds_must_match() -> None:
    with pytest.raises(ValueError) as caught:
        paired_ratio_test({1: 3.2, 2: 3.1, 3: 3.3}, {1: 3.2, 2: 3.1}, min_ratio=0.95, alpha=0.05)
    assert str(caught.value) == ("the interleaved rounds differ: round 3 only on the baseline side, none only on the "
                                 "current side")
    with pytest.raises(ValueError) as caught:
        paired_ratio_test({1: 3.2}, {1: 3.0}, min_ratio=0.95, alpha=0.05)
    assert str(caught.value) == "1 interleaved round: the paired test needs at least 2"


def test_the_unpaired_ratio_test_adds_run_to_run_variance() -> None:
    base, cur = [3.21, 3.22, 3.24], [3.00, 3.02, 3.01]
    lb, lc = np.log(base), np.log(cur)
    pooled = (((lb - lb.mean()) ** 2).sum() + ((lc - lc.mean()) ** 2).sum()) / 4
    within = pooled * (1 / 3 + 1 / 3)
    test = unpaired_ratio_test(base, cur, min_ratio=0.95, alpha=0.05, run_to_run_sd=0.03)
    se = math.sqrt(within + 2 * 0.03**2)
    print(test)
    assert test.se_log == pytest.approx(se)
    assert test.df == pytest.approx((within + 2 * 0.0009) ** 2 / (within**2 / 4))
    assert test.p_value == pytest.approx(stats.t.cdf((lc.mean() - lb.mean() - math.log(0.95)) / se, test.df),
                                         rel=1e-9)
    # the same 6.6 % slowdown: significant beyond 5 % within one run's repeats, not across runs 3 % apart
    assert unpaired_ratio_test(base, cur, min_ratio=0.95, alpha=0.05, run_to_run_sd=0.0).regressed
    assert not test.regressed


def test_the_unpaired_ratio_test_needs_a_spread() -> None:
    with pytest.raises(ValueError) as caught:
        unpaired_ratio_test([3.22], [3.55], min_ratio=0.95, alpha=0.05, run_to_run_sd=0.03)
    assert str(caught.value) == ("a single repeat on each side: the within-run spread cannot be estimated (needs 2 "
                                 "repeats on one side at least)")
    with pytest.raises(ValueError) as caught:
        unpaired_ratio_test([3.0], [3.0, 0.0], min_ratio=0.95, alpha=0.05, run_to_run_sd=0.03)
    assert str(caught.value) == "current: throughputs must be finite and > 0, got [3.0, 0.0]"
    identical = unpaired_ratio_test([2.0, 2.0], [1.0, 1.0], min_ratio=0.95, alpha=0.05, run_to_run_sd=0.0)
    assert identical.p_value == sys.float_info.min and identical.regressed  # certain, and still not 0


def test_the_throughput_rule() -> None:
    slower = RatioTest(ratio=0.9, estimate=0.9, lower=0.85, upper=0.93, p_value=0.001, log_p_value=math.log(0.001),
                       min_ratio=0.95, alpha=0.05, n_baseline=7, n_current=7, df=6, se_log=0.01,
                       method=margins.PAIRED_RATIO_METHOD)
    assert throughput_regressed(slower, alpha=0.05) is True
    assert throughput_regressed(slower, alpha=0.05, adjusted_p=0.2) is False


def test_run_to_run_sd_is_recovered_from_stored_runs() -> None:
    rng = np.random.default_rng(11)
    runs = [3.2 * np.exp(rng.normal(0, 0.03) + rng.normal(0, 0.01, 5)) for _ in range(400)]
    sd, df = margins.run_to_run_sd_estimate(runs)
    print(sd, df)
    assert sd == pytest.approx(0.03, abs=0.003) and df == 399
    assert margins.run_to_run_sd_estimate([[3.0, 3.1], [3.0, 3.1]])[0] == 0.0  # no spread between runs


# ---------------------------------------------------------------------------------------------- Student's t

def test_student_t_against_closed_forms_and_a_table() -> None:
    for t in (-3.0, -0.4, 0.7, 2.5, 12.0):
        assert math.exp(distributions.t_log_cdf(t, 1)) == pytest.approx(0.5 + math.atan(t) / math.pi, rel=1e-12)
        assert math.exp(distributions.t_log_cdf(t, 2)) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), rel=1e-12)
    assert math.exp(distributions.t_log_cdf(2.0, 4)) == pytest.approx(0.94194174, abs=1e-8)
    assert distributions.t_quantile(0.975, 10) == pytest.approx(2.228139, abs=1e-6)
    assert distributions.t_quantile(0.995, 2) == pytest.approx(9.924843, abs=1e-6)
    assert distributions.t_quantile(0.99, math.inf) == pytest.approx(2.3263479, abs=1e-7)  # the normal
    # P(T <= t) -> 2 sqrt(3) / pi |t|^-3 for df = 3 (the density's leading term, integrated)
    assert distributions.t_log_cdf(-1e80, 3) == pytest.approx(math.log(2 * math.sqrt(3) / math.pi) - 3 * math.log(1e80),
                                                       rel=1e-9)
    # below ~1e-308 the log cdf is -inf, which the gate reports as TINY_P, as it would the exact value (~e^-1253)
    assert distributions.t_log_cdf(-50.0, 1e6) == -math.inf
    assert margins.reported_p(distributions.t_log_cdf(-50.0, 1e6)) == margins.reported_p(-1253.3) == sys.float_info.min
