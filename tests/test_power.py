"""kvgate.gate.power and `kvgate power`: analytic figures, their inverse, and a Monte Carlo cross-check."""

from __future__ import annotations

import math

import pytest

from kvgate.cli import main
from kvgate.gate.power import (
    accuracy_power,
    cell_probabilities,
    questions_needed,
    simulate_run,
    unpaired_se_points,
)


def test_minimum_detectable_drop_matches_the_published_figures() -> None:
    """../shared/facts/gating.md: at n = 1319, one-sided alpha 0.05, power 0.8 the paired MDD is about 2.2
    points at d = 10 % and 1.5 at d = 5 %; TensorRT-LLM's unpaired theta (sigma 50) is 4.84 points."""
    at_10 = accuracy_power(n=1319, discordance=0.10, margin_points=0.0, alpha=0.05, power=0.8)
    at_5 = accuracy_power(n=1319, discordance=0.05, margin_points=0.0, alpha=0.05, power=0.8)
    print(f"MDD d=10 %: {at_10.minimum_detectable_drop_points:.3f}, d=5 %: {at_5.minimum_detectable_drop_points:.3f}")
    assert at_10.minimum_detectable_drop_points == pytest.approx(2.2, abs=0.05)
    assert at_5.minimum_detectable_drop_points == pytest.approx(1.5, abs=0.05)
    unpaired_theta = (1.6448536 + 0.8416212) * unpaired_se_points(n=1319, accuracy=0.5)
    assert unpaired_theta == pytest.approx(4.84, abs=0.01)


def test_figures_of_the_default_policy_at_gsm8k_size() -> None:
    single = accuracy_power(n=1319, discordance=0.10, margin_points=1.0, alpha=0.01, power=0.9)
    family = accuracy_power(n=1319, discordance=0.10, margin_points=1.0, alpha=0.01, power=0.9, tests=64)
    se = 100 * math.sqrt(0.10 / 1319)
    assert single.se_points == pytest.approx(se)
    assert single.threshold_points == pytest.approx(2.3263479 * se)  # z(0.99) SE > margin
    assert single.minimum_detectable_drop_points == pytest.approx((2.3263479 + 1.2815516) * se)
    assert single.false_alarm_per_test == pytest.approx(0.01)
    assert family.per_test_alpha == pytest.approx(0.01 / 64)
    assert family.false_alarm_run == pytest.approx(0.01, rel=0.01)
    # A margin larger than z * SE takes over the threshold: the FP8 tax at low discordance.
    fp8 = accuracy_power(n=1319, discordance=0.05, margin_points=3.0, alpha=0.01, power=0.9)
    assert fp8.threshold_points == 3.0
    assert fp8.fails_at_margin == pytest.approx(0.5)


@pytest.mark.parametrize("target, discordance, margin, tests", [
    (3.0, 0.10, 1.0, 1), (3.0, 0.10, 1.0, 64), (6.0, 0.15, 3.0, 64), (3.2, 0.05, 3.0, 1), (2.0, 0.02, 0.0, 256)])
def test_questions_needed_inverts_the_minimum_detectable_drop(target: float, discordance: float, margin: float,
                                                              tests: int) -> None:
    n = questions_needed(target_drop_points=target, discordance=discordance, margin_points=margin, alpha=0.01,
                         power=0.9, tests=tests)
    assert n is not None

    def mdd(questions: int) -> float:
        return accuracy_power(n=questions, discordance=discordance, margin_points=margin, alpha=0.01, power=0.9,
                              tests=tests).minimum_detectable_drop_points

    assert mdd(n) <= target + 1e-9 < mdd(n - 1) if n > 1 else mdd(n) <= target


def test_a_drop_within_the_margin_needs_no_n() -> None:
    assert questions_needed(target_drop_points=3.0, discordance=0.1, margin_points=3.0, alpha=0.01) is None


def test_cell_probabilities_refuse_a_drop_larger_than_the_discordance() -> None:
    assert cell_probabilities(reference_accuracy=0.65, discordance=0.10, drop=0.04).tolist() == pytest.approx(
        [0.58, 0.07, 0.03, 0.32])
    with pytest.raises(ValueError, match="the discordance must be at least the drop"):
        cell_probabilities(reference_accuracy=0.65, discordance=0.05, drop=0.06)


@pytest.mark.parametrize("discordance", [0.05, 0.10, 0.15])
@pytest.mark.parametrize("tests", [1, 64])
def test_simulation_agrees_with_the_analytic_figures(discordance: float, tests: int) -> None:
    """The normal approximation against the real exact test: false alarms at most the analytic rate (the
    exact test is conservative) and detection at the analytic MDD within a few points of the power."""
    figures = accuracy_power(n=1319, discordance=discordance, margin_points=1.0, alpha=0.01, power=0.9, tests=tests)
    common = dict(n=1319, reference_accuracy=0.65, discordance=discordance, margin_points=1.0, alpha=0.01,
                  multiplicity="bh", tests=tests, runs=4000 if tests == 1 else 1000)
    unchanged = simulate_run(**common, seed=11)
    caught = simulate_run(**common, regressed_tests=1, true_drop_points=figures.minimum_detectable_drop_points,
                          seed=12)
    print(f"d={discordance} tests={tests}: analytic false alarm/run {figures.false_alarm_run:.4f}, simulated "
          f"{unchanged.false_failure_run:.4f}; MDD {figures.minimum_detectable_drop_points:.2f} pts caught in "
          f"{caught.detection_per_test:.3f} (analytic 0.90)")
    monte_carlo = 3 * math.sqrt(0.01 * 0.99 / common["runs"])
    assert unchanged.false_failure_run <= figures.false_alarm_run + monte_carlo
    assert caught.detection_per_test == pytest.approx(0.90, abs=0.04)


def test_power_command_prints_the_figures(capsys) -> None:
    assert main(["power", "--n", "1319", "--discordance", "0.10", "--margin", "1.0"]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "SE of the paired drop 0.87 pts (an unpaired test from the two means: 1.86 pts" in out
    assert "fails when the measured drop exceeds" in out and "2.03 pts" in out and "3.14 pts" in out
    assert "minimum detectable drop (power 0.9)" in out and "4.25 pts" in out
    assert "47.4 %" in out  # 64 uncorrected checks at 1 % each


def test_power_command_target_drop(capsys) -> None:
    assert main(["power", "--discordance", "0.10", "--margin", "1.0", "--target-drop", "3"]) == 0
    out = capsys.readouterr().out
    assert "questions needed to catch a 3-pt drop with power 0.9: 1447 for one check alone, 2653 after bh over " \
           "64 tests (gsm8k's test split has 1319)" in out
    assert main(["power", "--discordance", "0.10", "--margin", "3", "--target-drop", "2"]) == 0
    assert "is not above the margin (3 pts): the check is built to let it pass, at any n" in capsys.readouterr().out


def test_power_command_simulates_on_request(capsys) -> None:
    assert main(["power", "--n", "1319", "--discordance", "0.10", "--margin", "3", "--simulate", "500"]) == 0
    out = capsys.readouterr().out
    assert "simulated (500 runs each" in out and "64 tests, bh: false failures" in out


@pytest.mark.parametrize("argv, message", [
    (["--discordance", "0.1"], "ERROR kvgate power: nothing to compute. Give --n, --target-drop, or both"),
    (["--n", "1319", "--discordance", "1.5"],
     "ERROR kvgate power: --discordance must be a share in (0, 1], e.g. 0.10. See `kvgate power --help`"),
    (["--n", "0", "--discordance", "0.1"], "ERROR kvgate power: --n must be >= 1. See `kvgate power --help`"),
    (["--n", "1319", "--discordance", "0.1", "--alpha", "1"],
     "ERROR kvgate power: --alpha must be in (0, 1). See `kvgate power --help`"),
])
def test_power_command_bad_arguments(argv: list[str], message: str, capsys) -> None:
    assert main(["power", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [message]
