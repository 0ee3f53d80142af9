"""kvgate.statistics.power and `kvgate power`: exact operating figures of the margin test, the questions and rounds
the policy needs, the noncentral t, and the command's output and errors."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvgate.cli import main
from kvgate.gate import policy as policy_module
from kvgate.statistics import distributions, margins, power


def simulated_rate(n: int, p10: float, p01: float, margin: float, runs: int, seed: int) -> float:
    counts = np.random.default_rng(seed).multinomial(n, [p10, p01, 1 - p10 - p01], size=runs)
    return float(margins.margin_rejects(counts[:, 0], counts[:, 1], n, margin_points=margin, alpha=0.01).mean())


@pytest.mark.parametrize("n, flips, drop, margin", [(1319, 0.10, 3.0, 3.0), (1319, 0.15, 6.0, 3.0),
                                                    (800, 0.05, 1.0, 1.0), (2749, 0.15, 4.0, 1.0)])
def test_the_exact_rejection_probability_agrees_with_a_monte_carlo(n: int, flips: float, drop: float,
                                                                   margin: float) -> None:
    p10, p01 = power.paired_probabilities(flips=flips, drop_points=drop)
    exact = power.rejection_probability(n, p10, p01, margin_points=margin, alpha=0.01)
    runs = 40000
    rate = simulated_rate(n, p10, p01, margin, runs, seed=5)
    se = math.sqrt(max(exact * (1 - exact), 1e-6) / runs)
    print(f"n={n} flips={flips} drop={drop}: exact {exact:.4%}, simulated {rate:.4%} +- {se:.4%}")
    assert rate == pytest.approx(exact, abs=4 * se)


@pytest.mark.parametrize("margin", [1.0, 3.0])
@pytest.mark.parametrize("n", [200, 500, 1319, 3005, 6000])
def test_the_size_at_drop_equal_to_the_margin_is_at_most_alpha(n: int, margin: float) -> None:
    """Exact, over the nuisance: from no noise at all (every flip is the regression) to 30 % flips."""
    sizes = {}
    for flips in (0.0, 0.005, 0.01, 0.02, 0.05, 0.10, 0.15, 0.20, 0.30):
        p10, p01 = power.paired_probabilities(flips=flips, drop_points=margin)
        sizes[flips] = power.rejection_probability(n, p10, p01, margin_points=margin, alpha=0.01)
    print(f"n={n} margin={margin}: " + ", ".join(f"{f:.1%} flips {s:.3%}" for f, s in sizes.items()))
    assert max(sizes.values()) <= 0.01
    if n >= 1319:
        assert sizes[0.15] > 0.008  # and not needlessly conservative where the policy lives


FIGURES = {  # (margin, target, flips) -> questions for power 0.9 at alpha 0.01 (matrix/policy.toml quotes them)
    (3.0, 6.0, 0.05): 1508, (3.0, 6.0, 0.10): 2266, (3.0, 6.0, 0.15): 3005,
    (1.0, 4.0, 0.05): 1274, (1.0, 4.0, 0.10): 2019, (1.0, 4.0, 0.15): 2749,
}


@pytest.mark.parametrize("key, expected", FIGURES.items(), ids=[f"margin {k[0]:g}, {k[2]:.0%} flips" for k in FIGURES])
def test_questions_needed_are_the_smallest_n_with_the_power(key: tuple[float, float, float], expected: int) -> None:
    margin, target, flips = key
    n = power.questions_needed(margin_points=margin, target_points=target, flips=flips, alpha=0.01, power=0.9)
    assert n == expected
    p10, p01 = power.paired_probabilities(flips=flips, drop_points=target)
    assert power.rejection_probability(n, p10, p01, margin_points=margin, alpha=0.01) >= 0.9
    assert power.rejection_probability(n - 20, p10, p01, margin_points=margin, alpha=0.01) < 0.9
    normal = power.normal_questions(margin_points=margin, target_points=target, flips=flips, alpha=0.01, power=0.9)
    assert normal == pytest.approx(n, rel=0.02)  # the textbook formula is within 2 %


def test_a_target_within_the_margin_needs_no_n() -> None:
    with pytest.raises(ValueError) as caught:
        power.questions_needed(margin_points=3.0, target_points=3.0, flips=0.1, alpha=0.01)
    assert str(caught.value) == "the target drop (3.0) must exceed the margin (3.0)"


def test_the_paired_rounds_power_against_a_monte_carlo_of_the_paired_t() -> None:
    """paired_rounds_power (scipy's noncentral t) is the rate at which the paired t over the rounds' log
    differences rejects, simulated; at a slowdown equal to the tolerance it is alpha exactly (a central t)."""
    rng = np.random.default_rng(2)
    for rounds, repeat_sd, slowdown in ((3, 0.03, 0.10), (5, 0.02, 0.08), (7, 0.05, 0.10), (11, 0.03, 0.05)):
        differences = rng.normal(math.log(1 - slowdown), math.sqrt(2) * repeat_sd, size=(200000, rounds))
        se = differences.std(axis=1, ddof=1) / math.sqrt(rounds)
        t = (differences.mean(axis=1) - math.log(0.95)) / se
        rate = float((t <= -distributions.t_quantile(0.99, rounds - 1)).mean())
        figure = power.paired_rounds_power(rounds, repeat_sd=repeat_sd, tolerance=0.05, slowdown=slowdown, alpha=0.01)
        print(rounds, repeat_sd, slowdown, figure, rate)
        assert figure == pytest.approx(rate, abs=0.004)
    assert power.paired_rounds_power(6, repeat_sd=0.03, tolerance=0.05, slowdown=0.05, alpha=0.01) == pytest.approx(
        0.01, rel=1e-9)


def test_rounds_needed_for_a_10_percent_slowdown() -> None:
    assert power.rounds_needed(repeat_sd=0.02, tolerance=0.05, slowdown=0.10, alpha=0.05, power=0.9) == 5
    assert power.rounds_needed(repeat_sd=0.03, tolerance=0.05, slowdown=0.10, alpha=0.05, power=0.9) == 7
    assert power.rounds_needed(repeat_sd=0.03, tolerance=0.05, slowdown=0.10, alpha=0.01, power=0.9) == 11
    # a stored baseline cannot reach 90 %: the run-to-run SD stays however many repeats
    assert power.stored_power(None, repeat_sd=0.0, run_to_run_sd=0.03, tolerance=0.05, slowdown=0.10,
                              alpha=0.05) == pytest.approx(0.356, abs=0.001)


# ---------------------------------------------------------------------------------------------- the command

def test_power_command_prints_the_questions_each_check_needs(capsys) -> None:
    assert main(["power"]) == 0
    out = capsys.readouterr().out
    print(out)
    lines = out.splitlines()
    assert "  fp8_accuracy (FP8 vs auto)       3        6       1508        2266        3005" in lines
    assert "  baseline_accuracy                1        4       1274        2019        2749" in lines
    assert "the policy asks 3005 questions (accuracy.questions, sized at 15 % flips)" in lines
    assert lines[lines.index("the policy asks 3005 questions (accuracy.questions, sized at 15 % flips)") + 2] == (
        "group-sequential: looks at 807, 1613, 2420, 3226 questions (up to 3226 = 1.0732 x 3005); O'Brien-Fleming "
        "alpha spending, futility at the drop to catch with beta t^2, non-binding")
    assert "  7 % per-repeat SD" not in out and "  3 % per-repeat SD: 7 rounds" in out
    # the GPU noise the policy records (matrix/policy.toml [[throughput.measured_noise]]) and the power it leaves
    assert ("| flash_attn-fp8-sm90 | tiny-llama-any (not in this matrix) | 15.5 % | - | 7 engines x 1 repeat, paired "
            "| 5.0 % / 14.4 % / 32.5 % | 1.4 % | 5.0 % | 4.0 % | 2026-12-02, 5 engines, 5 repeats, kvgate:tiny-llama, "
            "1000 prompts 512/128, eager, each repeat its own engine |") in lines
    # the seed's shape on the H200: one engine a side catches a 10 % slowdown >= 90 % of the time
    row = next(line for line in lines if line.startswith("| flashmla-fp8-sm90 | deepseek-v2-lite |"))
    assert "| 1 engine x 3 repeats | 5.0 % / 100.0 % / 100.0 % | 0 % | 5.0 % |" in row
    # Llama's auto cell, two engines on one machine: the 95 % upper bound of their spread (1.12 %) still gives >= 90 %
    row = next(line for line in lines if line.startswith("| flash_attn-auto-sm90 | llama-3_1-8b |"))
    assert "| 0.093 % | 1.12 % | 1 engine x 3 repeats | 5.0 % / 96.1 % / 100.0 % |" in row


def test_a_cell_measured_in_one_engine_has_the_run_to_run_sd_stand_in_and_says_so(capsys, tmp_path) -> None:
    """Its workload's design, with the run-to-run SD standing in for the engine SD it lacks, as the gate's test assumes
    (ThroughputPolicy.engine_sd_for), so its power is low and the table says why (Llama's auto cell before
    2026-12-03's second engine)."""
    text = Path(policy_module.default_policy_path()).read_text()
    measured = 'repeat_sd = 0.00093\nengine_sd = 0.0112\nengines = 2\nrepeats = 6'
    assert measured in text
    (tmp_path / "policy.toml").write_text(text.replace(measured, 'repeat_sd = 0.00115\nengines = 1\nrepeats = 3'))
    assert main(["power", "--policy", str(tmp_path / "policy.toml")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| flash_attn-auto-sm90 | llama-3_1-8b |"))
    assert "| 0.115 % | 3 % (run_to_run_sd stands in) | 1 engine x 3 repeats | 5.0 % / 35.5 % / 83.5 % |" in row


def test_measured_noise_power_agrees_with_a_simulation_of_the_paired_test() -> None:
    """The A/B figure `kvgate power` states at a measured SD is what the real paired test does on simulated runs."""
    rng = np.random.default_rng(20261202)
    sd, rounds, slowdown, runs = 0.155, 7, 0.10, 4000
    fails = 0
    for _ in range(runs):
        base = np.exp(rng.normal(0, sd, rounds)) * 100
        head = np.exp(rng.normal(np.log(1 - slowdown), sd, rounds)) * 100
        test = margins.paired_ratio_test(dict(enumerate(base)), dict(enumerate(head)), min_ratio=0.95, alpha=0.05)
        fails += margins.throughput_regressed(test, alpha=0.05)
    stated = power.paired_rounds_power(rounds, repeat_sd=sd, tolerance=0.05, slowdown=slowdown, alpha=0.05)
    assert abs(fails / runs - stated) < 4 * np.sqrt(stated * (1 - stated) / runs)


def test_power_command_for_one_margin_and_flips(capsys) -> None:
    assert main(["power", "--margin", "1", "--target-drop", "4", "--discordance", "0.10", "--n", "1319"]) == 0
    out = capsys.readouterr().out
    assert "  the check       1        4        2019" in out.splitlines()
    assert ("  the check, 10 % flips: drop 0 0.021 %, margin/2 0.2 %, margin 0.9 %, 4 pts 71.7 %; run of 32 at "
            "margin/2 5.2 %") in out.splitlines()


def test_power_command_simulates_on_request(capsys) -> None:
    assert main(["power", "--margin", "3", "--discordance", "0.10", "--n", "1319", "--simulate", "500"]) == 0
    assert "    simulated (500 comparisons each): margin " in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--discordance", "1.5"],
     "ERROR kvgate power: --discordance must be a share in (0, 1), e.g. 0.10. See `kvgate power --help`"),
    (["--n", "0"], "ERROR kvgate power: --n must be >= 1. See `kvgate power --help`"),
    (["--alpha", "1"], "ERROR kvgate power: --alpha must be in (0, 0.5). See `kvgate power --help`"),
    (["--target-drop", "4"], "ERROR kvgate power: --target-drop needs --margin. See `kvgate power --help`"),
    (["--margin", "3", "--target-drop", "2"],
     "ERROR kvgate power: --target-drop must exceed --margin: a drop within the margin is built to pass, at any n. "
     "See `kvgate power --help`"),
    (["--simulate", "100"], "ERROR kvgate power: --simulate needs --n. See `kvgate power --help`"),
    (["--margin", "100"], "ERROR kvgate power: --margin must be in [0, 100) points. See `kvgate power --help`"),
    (["--margin", "-1"], "ERROR kvgate power: --margin must be in [0, 100) points. See `kvgate power --help`"),
    # a drop that with the flips breaks more answers than there are questions: was a ValueError traceback
    (["--margin", "5", "--target-drop", "inf"],
     "ERROR kvgate power: --target-drop: a drop of inf points on top of 5 % noise flips breaks more answers than "
     "there are questions. Lower --discordance or the drop to catch (--margin, --target-drop)"),
    (["--discordance", "0.99"],
     "ERROR kvgate power: --discordance: a drop of 6 points on top of 99 % noise flips breaks more answers than "
     "there are questions. Lower --discordance or the drop to catch (--margin, --target-drop)"),
    (["--discordance", "0.05", "--margin", "80", "--target-drop", "90"],  # the sequential plan's design_flips
     "ERROR kvgate power: --target-drop: a drop of 90 points on top of 15 % noise flips breaks more answers than "
     "there are questions. Lower --discordance or the drop to catch (--margin, --target-drop)"),
])
def test_power_command_bad_arguments(argv: list[str], message: str, capsys) -> None:
    assert main(["power", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [message]


def power_process(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`kvgate power` in a process of its own, so that a hang is a failed test, not a hung suite."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    try:
        return subprocess.run([sys.executable, "-m", "kvgate", "power", *argv], env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"kvgate power {' '.join(argv)} hung (killed after {timeout:g} s)") from None


@pytest.mark.parametrize("argv, message", [
    (["--margin", "5", "--target-drop", "5.01"],  # hung, counting questions towards 127 million
     "ERROR kvgate power: catching a drop of 5.01 points over a margin of 5 at 5 % flips needs about 1.27e+08 "
     "questions, more than the 1000000 kvgate power counts exactly. Widen the gap between --margin and "
     "--target-drop, or ask less (--alpha, --power)"),
    (["--margin", "0", "--target-drop", "1e-300"],  # an OverflowError traceback
     "ERROR kvgate power: catching a drop of 1e-300 points over a margin of 0 at 5 % flips needs unboundedly many "
     "questions, more than the 1000000 kvgate power counts exactly. Widen the gap between --margin and "
     "--target-drop, or ask less (--alpha, --power)"),
])
def test_a_drop_too_close_to_the_margin_is_refused_not_counted_for_ever(argv: list[str], message: str) -> None:
    done = power_process(*argv, timeout=30)
    assert (done.returncode, done.stderr) == (2, message + "\n")


@pytest.mark.parametrize("se_log", [1e-300, 1e-17, 1e-14, 1e-12, 1e-10, 1e-9, 0.0])
@pytest.mark.parametrize("df", [1.0, 6.0, 60.0, math.inf])
def test_the_throughput_power_at_a_vanishing_standard_error_is_its_limit_not_nan(se_log: float, df: float) -> None:
    """Repeats that agree to the last digits (a paired run whose rounds all show one ratio: an SE of log 1e-16)
    gave NaN from scipy's noncentral t: verdict.json's power_at_10_percent null and report.md "catches a 10 %
    slowdown nan % of the time". The power there is its limit: 1 for a slowdown past the tolerance, 0 within it."""
    assert power.ratio_test_power(se_log, df, tolerance=0.05, slowdown=0.10, alpha=0.05) == pytest.approx(1.0)
    assert power.ratio_test_power(se_log, df, tolerance=0.05, slowdown=0.01, alpha=0.05) == pytest.approx(0.0, abs=1e-12)


def test_a_simulation_where_none_or_all_failed_states_a_bound_not_a_zero_standard_error(capsys) -> None:
    """One question: the test never fails (0 of 20), and at n = 1319 a 9-point drop always does (20 of 20): the
    standard error of 0 % or 100 % is 0, which `kvgate power` printed as a precision of "± 2.2e-05 %" (its 1e-12
    floor) from 20 comparisons. It states the exact one-sided 95 % bound of what 20 comparisons can tell instead."""
    assert main(["power", "--margin", "3", "--target-drop", "9", "--discordance", "0.10", "--n", "1",
                 "--simulate", "20"]) == 0
    never = [line for line in capsys.readouterr().out.splitlines() if "simulated (20 comparisons each)" in line]
    assert never == ["    simulated (20 comparisons each): margin 0 % (0 of 20; 95 % upper bound 13.9 %), 9 pts 0 % "
                     "(0 of 20; 95 % upper bound 13.9 %)"]
    assert main(["power", "--margin", "3", "--target-drop", "9", "--discordance", "0.10", "--n", "1319",
                 "--simulate", "20"]) == 0
    always = next(line for line in capsys.readouterr().out.splitlines() if "simulated (20 comparisons each)" in line)
    assert always.endswith("9 pts 100.0 % (20 of 20; 95 % lower bound 86.1 %)")
