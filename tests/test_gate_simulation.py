"""Monte Carlo proof of the accuracy gate's error rates on realistic per-question gsm8k data.

Model (per question, n = 1319, auto accuracy 0.65): the question set is fixed and each question i has its
own probability p_i of being answered right, logistic in an evenly spread difficulty (an item-response
model: most questions are reliably right or reliably wrong, a few are fragile). Two runs answer
independently with their probabilities, so fragile questions flip between runs; the spread of the
difficulties is solved so that the expected share of questions on which the two runs disagree (the
discordance) is exactly the one named. A regression of `drop` points breaks a fixed share of the
candidate's right answers: q_i = p_i (1 - drop / 0.65). The discordance named is the total one of the
compared pair (what `kvgate power --discordance` takes), so a regressed scenario's flips include its drop.

Each simulated run goes through the gate's own code: per-question outcomes -> 4 counts (the vectorised
form of PairedCounts.from_outcomes, checked against it below) -> exact McNemar p-values
(stats.mcnemar_p_values, the function paired_drop_test calls) -> run-wide adjustment
(stats.adjust_p_value_matrix) -> the rule (stats.regressed_mask, the body of accuracy_regressed).
Figures are printed (run pytest with -s to see them) and asserted with a Monte Carlo margin.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from kvgate.gate import policy as policy_module
from kvgate.gate import stats
from kvgate.gate.power import simulate_run

N = 1319
ACCURACY = 0.65
ALPHA = 0.01  # matrix/policy.toml [accuracy] alpha
FP8_TAX = 3.0  # [accuracy] fp8_tax_points
BASELINE_MARGIN = 1.0  # [accuracy] baseline_margin_points
RUNS = 4000


def test_the_simulated_thresholds_are_the_policy_ones() -> None:
    accuracy = policy_module.load().accuracy
    assert (accuracy.alpha, accuracy.fp8_tax_points, accuracy.baseline_margin_points) == (ALPHA, FP8_TAX,
                                                                                          BASELINE_MARGIN)


# ---------------------------------------------------------------------------------------------- the model

_DIFFICULTY = np.array([NormalDist().inv_cdf((i + 0.5) / N) for i in range(N)])  # fixed, evenly spread


def _logistic(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))  # 1 / (1 + e^-x) without overflow


def _bisect(f, low: float, high: float) -> float:
    """The root of an increasing f on [low, high]."""
    for _ in range(80):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if f(mid) < 0 else (low, mid)
    return 0.5 * (low + high)


def question_probabilities(*, discordance: float, drop_points: float) -> tuple[np.ndarray, np.ndarray]:
    """p (reference) and q (candidate) per question: mean(p) = 0.65 and mean(p + q - 2pq) = discordance."""
    breaks = drop_points / 100 / ACCURACY  # share of right answers the regression breaks

    def probabilities(spread: float) -> np.ndarray:
        shift = _bisect(lambda mu: _logistic(mu + spread * _DIFFICULTY).mean() - ACCURACY, -3000, 3000)
        return _logistic(shift + spread * _DIFFICULTY)

    def flips(spread: float) -> float:
        p = probabilities(spread)
        q = p * (1 - breaks)
        return float((p + q - 2 * p * q).mean())

    if not flips(1000.0) < discordance < flips(0.0):
        raise ValueError(f"no question model for discordance {discordance} with a {drop_points}-point drop")
    p = probabilities(_bisect(lambda spread: discordance - flips(spread), 0.0, 1000.0))
    return p, p * (1 - breaks)


def simulate_outcomes(p: np.ndarray, q: np.ndarray, *, runs: int, seed: int):
    """Per-question outcomes of `runs` independent (reference, candidate) pairs, in chunks."""
    rng = np.random.default_rng(seed)
    for start in range(0, runs, 1000):
        size = min(1000, runs - start)
        yield rng.random((size, N)) < p, rng.random((size, N)) < q


def paired_counts(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """(runs, 4) counts in PairedCounts order: the vectorised PairedCounts.from_outcomes."""
    both = (reference & candidate).sum(axis=1)
    only_reference = (reference & ~candidate).sum(axis=1)
    only_candidate = (~reference & candidate).sum(axis=1)
    return np.stack([both, only_reference, only_candidate, N - both - only_reference - only_candidate], axis=1)


def failure_rate(*, discordance: float, drop_points: float, margin_points: float, runs: int = RUNS,
                 seed: int = 0) -> tuple[float, float, float]:
    """Share of runs whose single check fails, with the realised mean discordance and drop (points)."""
    p, q = question_probabilities(discordance=discordance, drop_points=drop_points)
    failures, flips, drops = 0, 0.0, 0.0
    for reference, candidate in simulate_outcomes(p, q, runs=runs, seed=seed + 1):
        counts = paired_counts(reference, candidate)
        drop = 100.0 * (counts[:, 1] - counts[:, 2]) / N
        p_values = stats.mcnemar_p_values(counts[:, 1], counts[:, 2])
        adjusted = stats.adjust_p_value_matrix(p_values[:, None], "bh")[:, 0]  # a family of one
        failures += int(stats.regressed_mask(drop, adjusted, margin_points=margin_points, alpha=ALPHA).sum())
        flips += float((counts[:, 1] + counts[:, 2]).sum()) / N
        drops += float(drop.sum())
    return failures / runs, flips / runs, drops / runs


def monte_carlo_se(rate: float, runs: int = RUNS) -> float:
    return math.sqrt(max(rate * (1 - rate), 1e-4) / runs)


def test_the_vectorised_counts_and_rule_are_the_gates_own() -> None:
    p, q = question_probabilities(discordance=0.10, drop_points=2.0)
    reference, candidate = next(simulate_outcomes(p, q, runs=300, seed=8))
    counts = paired_counts(reference, candidate)
    p_values = stats.mcnemar_p_values(counts[:, 1], counts[:, 2])
    mask = stats.regressed_mask(100.0 * (counts[:, 1] - counts[:, 2]) / N, p_values, margin_points=1.0, alpha=ALPHA)
    for run in range(300):
        one = stats.PairedCounts.from_outcomes(reference[run], candidate[run])
        assert [one.both_correct, one.only_reference, one.only_candidate, one.both_wrong] == counts[run].tolist()
        test = stats.paired_drop_test(one, n_boot=200)
        assert test.p_value == p_values[run]
        assert stats.accuracy_regressed(test, margin_points=1.0, alpha=ALPHA, adjusted_p=test.p_value) == mask[run]
    assert 0 < mask.sum() < 300  # the comparison saw both outcomes


# ---------------------------------------------------------------------------------------------- per cell

UNCHANGED = {  # true drop 0: at most 1 % false failures per cell
    "baseline check, 5 % flips": (0.05, BASELINE_MARGIN),
    "baseline check, 10 % flips": (0.10, BASELINE_MARGIN),
    "baseline check, 15 % flips": (0.15, BASELINE_MARGIN),
    "fp8 check, 5 % flips": (0.05, FP8_TAX),
    "fp8 check, 10 % flips": (0.10, FP8_TAX),
    "fp8 check, 15 % flips": (0.15, FP8_TAX),
}


@pytest.mark.parametrize("discordance, margin", UNCHANGED.values(), ids=UNCHANGED.keys())
def test_unchanged_code_fails_at_most_1_percent_per_cell(discordance: float, margin: float) -> None:
    rate, flips, drop = failure_rate(discordance=discordance, drop_points=0.0, margin_points=margin, seed=100)
    print(f"\nunchanged, margin {margin:g}: flips {flips:.1%}, mean drop {drop:+.2f} pts -> false failures "
          f"{rate:.2%} of {RUNS} runs (+-{monte_carlo_se(rate):.2%})")
    assert abs(flips - discordance) < 0.005
    assert rate <= 0.01 + 2 * monte_carlo_se(0.01)


REGRESSED = {  # a true drop of 3 points beyond the allowed margin: at least 90 % detection
    "baseline check, drop 4, 5 % flips": (0.05, 4.0, BASELINE_MARGIN),
    "baseline check, drop 4, 10 % flips": (0.10, 4.0, BASELINE_MARGIN),
    "baseline check, drop 4, 15 % flips": (0.15, 4.0, BASELINE_MARGIN),
    "fp8 check, drop 6, 10 % flips": (0.10, 6.0, FP8_TAX),
    "fp8 check, drop 6, 15 % flips": (0.15, 6.0, FP8_TAX),
}


@pytest.mark.parametrize("discordance, drop, margin", REGRESSED.values(), ids=REGRESSED.keys())
def test_a_drop_3_points_beyond_the_margin_is_caught_90_percent_of_the_time(discordance: float, drop: float,
                                                                            margin: float) -> None:
    runs = 10000
    rate, flips, measured = failure_rate(discordance=discordance, drop_points=drop, margin_points=margin, runs=runs,
                                         seed=200)
    print(f"\ntrue drop {drop:g}, margin {margin:g}: flips {flips:.1%}, mean measured drop {measured:.2f} pts -> "
          f"detected in {rate:.2%} of {runs} runs (+-{monte_carlo_se(rate, runs):.2%})")
    assert abs(flips - discordance) < 0.005 and abs(measured - drop) < 0.1
    assert rate >= 0.90 - 2 * monte_carlo_se(0.90, runs)


def test_operating_curve_of_the_fp8_check() -> None:
    """What "fail above the tax AND significant" means for drops that are allowed: reported, and bounded."""
    rows = []
    for drop in (0.0, 1.5, 2.0, 3.0, 4.0, 5.0):
        rate, _, _ = failure_rate(discordance=0.12, drop_points=drop, margin_points=FP8_TAX, runs=1000, seed=300)
        rows.append((drop, rate))
        print(f"\nfp8 check, 12 % flips: true drop {drop:.1f} pts -> fails {rate:.1%}")
    rates = dict(rows)
    assert rates[0.0] < 0.01 and rates[1.5] < 0.10  # the seed PR's drop (1.4-1.8) passes >= 90 % of runs
    assert 0.35 < rates[3.0] < 0.65  # a drop right at the tax is a coin flip: the estimate decides
    assert rates[5.0] > 0.95
    assert [r for _, r in rows] == sorted(r for _, r in rows)


# ---------------------------------------------------------------------------------------------- a run of 64

@pytest.mark.parametrize("discordance", [0.05, 0.10, 0.15])
def test_a_run_of_64_cells_with_and_without_the_correction(discordance: float) -> None:
    """Run-wide false failures on unchanged code, and what the correction costs in detection (baseline
    check, margin 1, true drop 4) for a lone regressed cell and for 8 regressed cells (a broken backend)."""
    common = dict(n=N, reference_accuracy=ACCURACY, discordance=discordance, margin_points=BASELINE_MARGIN,
                  alpha=ALPHA, tests=64, runs=2000)
    figures = {}
    for method in ("none", "holm", "bh"):
        unchanged = simulate_run(**common, multiplicity=method, seed=400)
        lone = simulate_run(**common, multiplicity=method, regressed_tests=1, true_drop_points=4.0, seed=401)
        eight = simulate_run(**common, multiplicity=method, regressed_tests=8, true_drop_points=4.0, seed=402)
        figures[method] = (unchanged.false_failure_run, lone.detection_per_test, eight.detection_per_test,
                           eight.false_failure_per_test)
        print(f"\n64 cells, {discordance:.0%} flips, {method:>4}: run-wide false failure {unchanged.false_failure_run:.2%}"
              f" (per cell {unchanged.false_failure_per_test:.3%}); drop 4 detected: lone cell "
              f"{lone.detection_per_test:.1%}, 8 cells {eight.detection_per_test:.1%} (unchanged cells then failing "
              f"{eight.false_failure_per_test:.3%})")
    se = math.sqrt(0.01 * 0.99 / common["runs"])
    assert figures["none"][0] > 0.25  # 64 uncorrected checks at ~1 % each: a false red run is routine
    assert figures["holm"][0] <= ALPHA + 3 * se
    assert figures["bh"][0] <= ALPHA + 3 * se
    assert figures["bh"][2] >= figures["holm"][2]  # BH keeps power when several cells regress
    assert figures["bh"][3] <= 0.01  # ... without making unchanged cells fail noticeably


# ---------------------------------------------------------------------------------------------- throughput

def throughput_failure_rate(*, repeats: int, cv: float, slowdown: float, tests_in_family: int, runs: int,
                            seed: int) -> float:
    """Share of simulated baseline-vs-current comparisons (log-normal repeats) that fail the policy's rule,
    for a lone tested cell among `tests_in_family` (BH then asks p <= alpha / tests_in_family of it)."""
    policy = policy_module.load().throughput
    rng = np.random.default_rng(seed)
    failures = 0
    for _ in range(runs):
        baseline = 3.22 * np.exp(rng.normal(0, cv, repeats))
        current = 3.22 * (1 - slowdown) * np.exp(rng.normal(0, cv, repeats))
        test = stats.ratio_test(baseline, current)
        adjusted = None if test.p_value is None else min(1.0, test.p_value * tests_in_family)
        failures += stats.throughput_regressed(test, tolerance=policy.tolerance, alpha=policy.alpha,
                                               adjusted_p=adjusted)
    return failures / runs


@pytest.mark.parametrize("repeats", [3, 5])
def test_throughput_rule_figures(repeats: int) -> None:
    """Tolerance 5 %, Welch t on log throughput at alpha 0.05: the figures matrix/policy.toml quotes."""
    rows = {}
    for cv in (0.02, 0.03):
        for slowdown in (0.0, 0.10):
            for family in (1, 64):
                rate = throughput_failure_rate(repeats=repeats, cv=cv, slowdown=slowdown, tests_in_family=family,
                                               runs=400, seed=500)
                rows[(cv, slowdown, family)] = rate
                print(f"\nthroughput, {repeats} vs {repeats} repeats, CV {cv:.0%}, true slowdown {slowdown:.0%}, "
                      f"{'alone' if family == 1 else 'lone cell of 64 tests (bh)'}: fails {rate:.1%}")
    assert rows[(0.02, 0.0, 1)] < 0.02 and rows[(0.02, 0.0, 64)] < 0.01
    assert rows[(0.02, 0.10, 1)] > 0.95
    if repeats == 5:
        assert rows[(0.02, 0.10, 64)] > 0.85


# ---------------------------------------------------------------------------------------------- the seed PR

SEED = {  # gsm8k at n = 1319, FLASHINFER_MLA on DeepSeek-V2-Lite: (auto, fp8) accuracy per filter
    "strict-match": (0.6444, 0.6262),
    "flexible-extract": (0.6520, 0.6384),
}


def seed_outcomes(reference_accuracy: float, candidate_accuracy: float, discordance: float,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-question outcomes with exactly these accuracies (to 4 places) and about this discordance."""
    right_ref, right_cand = round(reference_accuracy * N), round(candidate_accuracy * N)
    difference = right_ref - right_cand
    only_ref = (round(discordance * N) + difference) // 2
    only_cand = only_ref - difference
    both = right_ref - only_ref
    reference = np.array([1] * both + [1] * only_ref + [0] * only_cand + [0] * (N - both - only_ref - only_cand), bool)
    candidate = np.array([1] * both + [0] * only_ref + [1] * only_cand + [0] * (N - both - only_ref - only_cand), bool)
    order = np.random.default_rng(seed).permutation(N)
    return reference[order], candidate[order]


def check_cell(pairs: dict[str, tuple[np.ndarray, np.ndarray]], margin: float, family: int = 1) -> dict[str, bool]:
    """The gate's path for one FP8 cell: one paired test per filter, BH over the run's family, the rule.

    `family` extra unchanged tests (p = 1) stand in for the rest of the run's tests."""
    tests = {name: stats.paired_drop_test(stats.PairedCounts.from_outcomes(*pair)) for name, pair in pairs.items()}
    adjusted = stats.adjust_p_values([t.p_value for t in tests.values()] + [1.0] * (family - 1), "bh")
    verdicts = {}
    for (name, test), p in zip(tests.items(), adjusted, strict=False):
        verdicts[name] = stats.accuracy_regressed(test, margin_points=margin, alpha=ALPHA, adjusted_p=p)
        print(f"\n  {name}: drop {test.drop_points:.2f} pts [{test.ci_low_points:.2f}, {test.ci_high_points:.2f}], "
              f"discordant {test.discordant}, p {test.p_value:.3g} (adjusted {p:.3g}) -> "
              f"{'FAIL' if verdicts[name] else 'pass'}")
    return verdicts


@pytest.mark.parametrize("discordance", [0.04, 0.08, 0.12, 0.20])
def test_the_seed_pr_passes_with_paired_data(discordance: float) -> None:
    margin = policy_module.load().fp8_tax_points("deepseek-ai/DeepSeek-V2-Lite-Chat")
    pairs = {name: seed_outcomes(auto, fp8, discordance, seed=9) for name, (auto, fp8) in SEED.items()}
    for name, (auto, fp8) in SEED.items():
        counts = stats.PairedCounts.from_outcomes(*pairs[name])
        assert (round(counts.reference_accuracy, 4), round(counts.candidate_accuracy, 4)) == (auto, fp8)
    print(f"seed PR, {discordance:.0%} flips, FP8 tax {margin:g} pts:")
    assert check_cell(pairs, margin, family=64) == {"strict-match": False, "flexible-extract": False}


@pytest.mark.parametrize("discordance", [0.10, 0.15])
def test_a_7_point_fp8_drop_fails_with_paired_data(discordance: float) -> None:
    pairs = {name: seed_outcomes(auto, auto - 0.07, discordance, seed=9) for name, (auto, _) in SEED.items()}
    print(f"a 7-point FP8 drop, {discordance:.0%} flips, in a run of 256 tests:")
    assert check_cell(pairs, FP8_TAX, family=256) == {"strict-match": True, "flexible-extract": True}


def _unpaired(auto: float, fp8: float) -> stats.DropTest:
    return stats.unpaired_drop_test(auto, stats.binomial_stderr(auto, N), fp8, stats.binomial_stderr(fp8, N),
                                    n_reference=N, n_candidate=N)


def test_the_seed_pr_through_the_unpaired_fallback() -> None:
    tests = {name: _unpaired(auto, fp8) for name, (auto, fp8) in SEED.items()}
    adjusted = stats.adjust_p_values([t.p_value for t in tests.values()], "bh")
    for (name, test), p in zip(tests.items(), adjusted, strict=True):
        print(f"\nunpaired seed {name}: drop {test.drop_points:.2f} [{test.ci_low_points:.2f}, "
              f"{test.ci_high_points:.2f}], p {test.p_value:.3f} (adjusted {p:.3f})")
        assert not stats.accuracy_regressed(test, margin_points=FP8_TAX, alpha=ALPHA, adjusted_p=p)
    seven = {name: _unpaired(auto, auto - 0.07) for name, (auto, _) in SEED.items()}
    adjusted = stats.adjust_p_values([t.p_value for t in seven.values()], "bh")
    for (name, test), p in zip(seven.items(), adjusted, strict=True):
        print(f"unpaired 7-point drop {name}: drop {test.drop_points:.2f}, p {test.p_value:.2g} (adjusted {p:.2g})")
        assert stats.accuracy_regressed(test, margin_points=FP8_TAX, alpha=ALPHA, adjusted_p=p)


def test_the_seed_throughput_is_reported_not_required() -> None:
    """3.22 -> 3.55 req/s (auto -> fp8): the ratio is reported; no expectation is declared for the cell."""
    from kvgate.matrix import cells as matrix_module

    policy = policy_module.load()
    seed_cell = matrix_module.load().cell("flashinfer_mla-fp8-sm100")
    assert policy.throughput.fp8_over_auto_expectation(seed_cell) is None
    test = stats.ratio_test([3.22], [3.55])
    print(f"\nseed throughput fp8/auto ratio {test.ratio:.3f} ({test.method})")
    assert test.ratio == pytest.approx(1.1025, abs=1e-4)
    # Were an expectation "fp8 at least as fast as auto" declared, the seed would meet it ...
    assert not stats.throughput_regressed(test, tolerance=0.0, alpha=0.05, adjusted_p=test.p_value)
    # ... and the same figures the other way round (a baseline at 3.55, now 3.22) fail on the tolerance alone.
    assert stats.throughput_regressed(stats.ratio_test([3.55], [3.22]), tolerance=policy.throughput.tolerance,
                                      alpha=policy.throughput.alpha, adjusted_p=None)
