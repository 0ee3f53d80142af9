"""kvgate.gate.stats: exact McNemar tails, paired bootstrap, unpaired fallback, Holm/BH, throughput ratio test."""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest

from kvgate.gate import stats
from kvgate.gate.stats import (
    DropTest,
    PairedCounts,
    RatioTest,
    accuracy_regressed,
    adjust_p_value_matrix,
    adjust_p_values,
    binomial_upper_tail,
    mcnemar_p_values,
    paired_drop_test,
    ratio_test,
    throughput_regressed,
    unpaired_drop_test,
)


def exact_tail(successes: int, trials: int) -> float:
    """P(X >= successes), X ~ Bin(trials, 1/2), in exact rational arithmetic."""
    return float(Fraction(sum(math.comb(trials, k) for k in range(successes, trials + 1)), 2**trials))


# ---------------------------------------------------------------------------------------------- McNemar

# (only_reference, only_candidate, hand-computed one-sided p)
HAND_COMPUTED = {
    "8 of 10 go the candidate's way down": (8, 2, (45 + 10 + 1) / 1024),
    "all 5 discordant against the candidate": (5, 0, 1 / 32),
    "3 each way": (3, 3, (20 + 15 + 6 + 1) / 64),
    "none against the candidate": (0, 5, 1.0),
    "no discordant question": (0, 0, 1.0),
    "1 of 1": (1, 0, 0.5),
}


@pytest.mark.parametrize("b, c, expected", HAND_COMPUTED.values(), ids=HAND_COMPUTED.keys())
def test_exact_mcnemar_matches_hand_computed_binomial_tails(b: int, c: int, expected: float) -> None:
    assert float(mcnemar_p_values(b, c)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("b, c", [(78, 54), (125, 33), (66, 66), (90, 240), (700, 619), (200, 0)])
def test_exact_mcnemar_matches_exact_rational_tails_at_gsm8k_sizes(b: int, c: int) -> None:
    assert float(mcnemar_p_values(b, c)) == pytest.approx(exact_tail(b, b + c), rel=1e-9)


def test_mcnemar_is_vectorised_and_agrees_with_the_scalar_tail() -> None:
    rng = np.random.default_rng(5)
    b = rng.integers(0, 200, size=(50, 7))
    c = rng.integers(0, 200, size=(50, 7))
    p = mcnemar_p_values(b, c)
    assert p.shape == (50, 7)
    for i, j in [(0, 0), (13, 4), (49, 6)]:
        assert p[i, j] == binomial_upper_tail(int(b[i, j]), int(b[i, j] + c[i, j]))


def test_mcnemar_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="counts must be >= 0"):
        mcnemar_p_values(-1, 3)


# ---------------------------------------------------------------------------------------------- counts

def test_paired_counts_from_outcomes() -> None:
    reference = [True, True, True, False, False, True, False]
    candidate = [True, False, True, True, False, False, False]
    counts = PairedCounts.from_outcomes(reference, candidate)
    assert counts == PairedCounts(both_correct=2, only_reference=2, only_candidate=1, both_wrong=2)
    assert (counts.n, counts.discordant) == (7, 3)
    assert counts.reference_accuracy == pytest.approx(4 / 7)
    assert counts.candidate_accuracy == pytest.approx(3 / 7)
    assert PairedCounts.from_outcomes([1, 0, 1], [1.0, 1.0, 0.0]) == PairedCounts(1, 1, 1, 0)


def test_paired_counts_refuse_bad_outcomes() -> None:
    with pytest.raises(ValueError, match="the runs cover different numbers of questions: 2 reference, 3 candidate"):
        PairedCounts.from_outcomes([True, False], [True, False, True])
    with pytest.raises(ValueError, match="candidate outcomes must be true/false or 0/1"):
        PairedCounts.from_outcomes([1, 0], [1, 0.5])
    with pytest.raises(ValueError, match="only_candidate must be a count"):
        PairedCounts(1, 2, -1, 0)


# ---------------------------------------------------------------------------------------------- paired test

def test_paired_drop_test_figures() -> None:
    counts = PairedCounts(both_correct=772, only_reference=78, only_candidate=54, both_wrong=415)
    test = paired_drop_test(counts)
    print(test)
    assert test.drop_points == pytest.approx(100 * 24 / 1319)
    assert test.p_value == pytest.approx(exact_tail(78, 132), rel=1e-9)
    assert (test.n, test.discordant, test.method) == (1319, 132, "paired: exact McNemar + paired bootstrap")
    assert test.ci_low_points < test.drop_points < test.ci_high_points
    # The bootstrap interval has the width of the analytic one: SE^2 = (d - delta^2) / n.
    se = 100 * math.sqrt((132 / 1319 - (24 / 1319) ** 2) / 1319)
    assert test.ci_high_points - test.ci_low_points == pytest.approx(2 * 1.96 * se, rel=0.08)
    assert paired_drop_test(counts) == test  # same seed, same interval


def test_bootstrap_draws_the_multinomial_over_the_four_counts() -> None:
    counts = PairedCounts(both_correct=772, only_reference=78, only_candidate=54, both_wrong=415)
    ours = stats.bootstrap_drops(counts, n_boot=20000, seed=3)
    probabilities = np.array([772, 78, 54, 415]) / 1319
    direct = np.random.default_rng(4).multinomial(1319, probabilities, size=20000)
    theirs = 100 * (direct[:, 1] - direct[:, 2]) / 1319
    print(f"bootstrap drop mean/std: two binomials {ours.mean():.3f}/{ours.std():.3f}, "
          f"multinomial {theirs.mean():.3f}/{theirs.std():.3f}")
    assert ours.mean() == pytest.approx(theirs.mean(), abs=0.03)
    assert ours.std() == pytest.approx(theirs.std(), rel=0.03)
    assert np.quantile(ours, 0.025) == pytest.approx(np.quantile(theirs, 0.025), abs=0.1)


def test_paired_drop_test_without_discordance_and_without_questions() -> None:
    same = paired_drop_test(PairedCounts(10, 0, 0, 5))
    assert (same.drop_points, same.p_value, same.ci_low_points, same.ci_high_points) == (0.0, 1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="no questions"):
        paired_drop_test(PairedCounts(0, 0, 0, 0))


# ---------------------------------------------------------------------------------------------- unpaired

def test_unpaired_drop_test_from_reported_means() -> None:
    se_ref, se_cand = stats.binomial_stderr(0.6444, 1319), stats.binomial_stderr(0.6262, 1319)
    assert se_ref == pytest.approx(math.sqrt(0.6444 * 0.3556 / 1318))
    test = unpaired_drop_test(0.6444, se_ref, 0.6262, se_cand, n_reference=1319, n_candidate=1319)
    se = 100 * math.hypot(se_ref, se_cand)
    assert test.drop_points == pytest.approx(1.82)
    assert test.p_value == pytest.approx(1 - NormalDist().cdf(1.82 / se))
    assert (test.ci_low_points, test.ci_high_points) == pytest.approx((1.82 - 1.959964 * se, 1.82 + 1.959964 * se))
    assert (test.discordant, test.method) == (None, "unpaired: z from reported means (weaker)")


def test_unpaired_refuses_impossible_input() -> None:
    with pytest.raises(ValueError, match="candidate_mean must be a fraction in"):
        unpaired_drop_test(0.6, 0.01, 64.0, 0.01, n_reference=10, n_candidate=10)
    with pytest.raises(ValueError, match="reference_stderr must be a finite number"):
        unpaired_drop_test(0.6, math.nan, 0.6, 0.01, n_reference=10, n_candidate=10)


# ---------------------------------------------------------------------------------------------- multiplicity

def test_holm_and_bh_on_a_hand_computed_example() -> None:
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005x4, 0.01x3, 0.03x2, 0.04x1, then running maximum.
    assert adjust_p_values(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: sorted 0.005x4/1, 0.01x4/2, 0.03x4/3, 0.04x4/4, then running minimum from the top.
    assert adjust_p_values(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust_p_values(p, "none") == p
    assert adjust_p_values([], "bh") == []


def test_benjamini_hochberg_1995_example() -> None:
    """The 15 p-values of Benjamini & Hochberg (1995), section 4.2: at 0.05 BH rejects 4, Bonferroni-Holm 3."""
    p = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719,
         0.6528, 0.7590, 1.000]
    assert sum(q <= 0.05 for q in adjust_p_values(p, "bh")) == 4
    assert sum(q <= 0.05 for q in adjust_p_values(p, "holm")) == 3
    assert adjust_p_values(p, "bh")[3] == pytest.approx(0.0095 * 15 / 4)


def test_adjustment_caps_at_one_and_keeps_order_and_rows() -> None:
    p = np.array([[0.9, 0.5, 0.8], [0.001, 0.02, 0.5]])
    for method in ("holm", "bh"):
        adjusted = adjust_p_value_matrix(p, method)
        assert (adjusted <= 1).all() and (adjusted >= p).all()
        for row in range(2):
            assert adjusted[row].tolist() == adjust_p_values(p[row].tolist(), method)
    assert adjust_p_values([0.9, 0.5, 0.8], "holm") == [1.0, 1.0, 1.0]


def test_adjustment_refuses_unknown_methods_and_bad_p_values() -> None:
    with pytest.raises(ValueError, match="unknown multiplicity method 'bonferroni'; known: holm, bh, none"):
        adjust_p_values([0.1], "bonferroni")
    with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\]"):
        adjust_p_values([0.1, math.nan], "bh")


# ---------------------------------------------------------------------------------------------- rules

def _drop(drop: float, p: float) -> DropTest:
    return DropTest(drop, drop - 1, drop + 1, 0.95, p, 1319, 130, "paired: exact McNemar + paired bootstrap")


@pytest.mark.parametrize("drop, adjusted_p, expected", [
    (4.0, 0.001, True),    # above the margin and significant
    (4.0, 0.2, False),     # above the margin but not significant
    (0.9, 0.0001, False),  # significant but within the margin
    (1.0, 0.0001, False),  # at the margin exactly: allowed
])
def test_accuracy_rule(drop: float, adjusted_p: float, expected: bool) -> None:
    assert accuracy_regressed(_drop(drop, adjusted_p), margin_points=1.0, alpha=0.01, adjusted_p=adjusted_p) is expected


def test_accuracy_rule_refuses_nan() -> None:
    with pytest.raises(ValueError, match="NaN"):
        accuracy_regressed(_drop(4.0, 0.001), margin_points=1.0, alpha=0.01, adjusted_p=math.nan)


# ---------------------------------------------------------------------------------------------- throughput

def test_student_t_against_closed_forms_and_a_table() -> None:
    for t in (-3.0, -0.4, 0.0, 0.7, 2.5, 12.0):
        assert stats.student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert stats.student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert stats.student_t_cdf(2.0, 4) == pytest.approx(0.94194174, abs=1e-8)
    assert stats.student_t_ppf(0.975, 10) == pytest.approx(2.228139, abs=1e-6)
    assert stats.student_t_ppf(0.995, 2) == pytest.approx(9.924843, abs=1e-6)
    assert stats.student_t_ppf(0.025, 10) == pytest.approx(-2.228139, abs=1e-6)


def test_student_t_against_scipy_where_installed() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1.3, 2.0, 3.7, 8.0, 40.0):
        for t in (-5.0, -1.0, 0.3, 2.2, 9.0):
            assert stats.student_t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), rel=1e-9, abs=1e-14)


def test_ratio_test_welch_on_logs_against_a_hand_computation() -> None:
    baseline, current = [3.22, 3.20, 3.25], [3.00, 2.95, 3.02]
    test = ratio_test(baseline, current)
    lb, lc = np.log(baseline), np.log(current)
    vb, vc = lb.var(ddof=1) / 3, lc.var(ddof=1) / 3
    t = (lc.mean() - lb.mean()) / math.sqrt(vb + vc)
    df = (vb + vc) ** 2 / (vb**2 / 2 + vc**2 / 2)
    print(test, f"t={t:.3f} df={df:.2f}")
    assert test.ratio == pytest.approx(3.00 / 3.22)
    assert test.p_value == pytest.approx(stats.student_t_cdf(t, df), rel=1e-12)
    assert test.p_value < 0.01
    assert test.ci_low < math.exp(lc.mean() - lb.mean()) < test.ci_high < 1
    assert (test.n_baseline, test.n_current) == (3, 3)


def test_ratio_test_with_one_repeat_is_tolerance_only() -> None:
    test = ratio_test([3.22], [3.55])
    assert test == RatioTest(3.55 / 3.22, None, None, None, 1, 1,
                             "ratio of medians; tolerance only (fewer than 2 repeats on a side: weaker)")
    assert throughput_regressed(test, tolerance=0.05, alpha=0.05, adjusted_p=None) is False
    slower = ratio_test([3.22], [3.0])
    assert throughput_regressed(slower, tolerance=0.05, alpha=0.05, adjusted_p=None) is True


def test_ratio_test_with_identical_repeats() -> None:
    assert ratio_test([2.0, 2.0], [1.0, 1.0]).p_value == 0.0
    assert ratio_test([2.0, 2.0], [2.0, 2.0]).p_value == 1.0


@pytest.mark.parametrize("ratio, p, adjusted, expected", [
    (0.90, 0.001, 0.004, True),   # 10 % slower, significant
    (0.90, 0.20, 0.40, False),    # 10 % slower, could be noise
    (0.97, 0.0001, 0.0004, False),  # significant but within the 5 % tolerance
])
def test_throughput_rule(ratio: float, p: float, adjusted: float, expected: bool) -> None:
    test = RatioTest(ratio, ratio - 0.02, ratio + 0.02, p, 3, 3, stats.RATIO_METHOD)
    assert throughput_regressed(test, tolerance=0.05, alpha=0.05, adjusted_p=adjusted) is expected


def test_ratio_test_refuses_bad_repeats() -> None:
    with pytest.raises(ValueError, match=r"current: throughputs must be finite and > 0, got \[3.0, 0.0\]"):
        ratio_test([3.0], [3.0, 0.0])
    with pytest.raises(ValueError, match="baseline: need at least one repeat"):
        ratio_test([], [3.0])
