"""What the accuracy gate can see: minimum detectable drop, false-alarm rates, questions needed. Pure.

The analytic figures use the normal approximation of the paired difference: on n questions where the two
runs disagree on a share d, the measured drop has SE ~ sqrt(d / n). The gate's rule (kvgate.gate.stats) fails a
check when the measured drop exceeds the margin AND is significant at the per-test level, so it fails when

    measured drop > threshold = max(margin, z(1 - a) * SE)

where a is alpha for one test, and alpha / m for a lone regression among m tests after Holm or
Benjamini-Hochberg (both ask exactly that of the smallest p-value). A true drop of
    threshold + z(power) * SE
is caught with the given power. `simulate_run` replays the real tests (exact McNemar, the adjustment, the
rule) on simulated paired outcomes to check these figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvgate.gate.stats import (
    adjust_p_value_matrix,
    mcnemar_p_values,
    normal_quantile,
    normal_sf,
    regressed_mask,
)


@dataclass(frozen=True, slots=True)
class PowerFigures:
    n: int
    discordance: float  # share of questions on which the two runs disagree
    margin_points: float
    alpha: float  # for the whole family of tests
    power: float
    tests: int  # size of the family the alpha is spread over (1 = no correction)
    per_test_alpha: float
    se_points: float
    threshold_points: float  # the check fails when the measured drop exceeds this
    minimum_detectable_drop_points: float  # true drop caught with probability `power`
    false_alarm_per_test: float  # probability that an unchanged cell (true drop 0) fails
    false_alarm_run: float  # probability that any of `tests` unchanged, independent tests fails
    fails_at_margin: float  # probability that a true drop exactly at the margin fails


def accuracy_power(*, n: int, discordance: float, margin_points: float, alpha: float, power: float = 0.9,
                   tests: int = 1) -> PowerFigures:
    """Analytic figures for one paired accuracy check in a family of `tests` tests."""
    _check(n=n, discordance=discordance, margin_points=margin_points, alpha=alpha, power=power, tests=tests)
    se = 100.0 * math.sqrt(discordance / n)
    per_test_alpha = alpha / tests
    z_alpha = normal_quantile(1 - per_test_alpha)
    threshold = max(margin_points, z_alpha * se)
    false_alarm = normal_sf(threshold / se)
    return PowerFigures(
        n=n, discordance=discordance, margin_points=margin_points, alpha=alpha, power=power, tests=tests,
        per_test_alpha=per_test_alpha, se_points=se, threshold_points=threshold,
        minimum_detectable_drop_points=threshold + normal_quantile(power) * se,
        false_alarm_per_test=false_alarm, false_alarm_run=1 - (1 - false_alarm) ** tests,
        fails_at_margin=normal_sf((threshold - margin_points) / se),
    )


def questions_needed(*, target_drop_points: float, discordance: float, margin_points: float, alpha: float,
                     power: float = 0.9, tests: int = 1) -> int | None:
    """The smallest n at which a true drop of target_drop_points is caught with `power`.

    None when the target is not above the margin: such a drop passes by design, at any n.
    """
    _check(n=1, discordance=discordance, margin_points=margin_points, alpha=alpha, power=power, tests=tests)
    if target_drop_points <= margin_points:
        return None
    z_alpha = normal_quantile(1 - alpha / tests)
    z_power = normal_quantile(power)
    d = discordance * 100.0**2  # variance of one question's difference, in points^2
    need = max((z_alpha + z_power) / target_drop_points, max(z_power, 0.0) / (target_drop_points - margin_points))
    n = max(1, math.ceil(d * need**2))
    # ceil of a float product can land one below the exact boundary: step to the first n that reaches it
    while accuracy_power(n=n, discordance=discordance, margin_points=margin_points, alpha=alpha, power=power,
                         tests=tests).minimum_detectable_drop_points > target_drop_points + 1e-9:
        n += 1
    return n


def unpaired_se_points(*, n: int, accuracy: float) -> float:
    """SE of a drop from two independent means at this accuracy (what the unpaired fallback sees)."""
    return 100.0 * math.sqrt(2 * accuracy * (1 - accuracy) / n)


def _check(*, n: int, discordance: float, margin_points: float, alpha: float, power: float, tests: int) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 < discordance <= 1:
        raise ValueError(f"discordance must be in (0, 1], got {discordance}")
    if not margin_points >= 0:
        raise ValueError(f"margin must be >= 0 points, got {margin_points}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")
    if tests < 1:
        raise ValueError(f"tests must be >= 1, got {tests}")


# ---------------------------------------------------------------------------------------------- simulation

def cell_probabilities(*, reference_accuracy: float, discordance: float, drop: float) -> np.ndarray:
    """P(both right), P(only reference right), P(only candidate right), P(both wrong) for one question.

    `drop` and `discordance` are fractions (0.03 = 3 points); the discordant share splits so that the
    expected drop is `drop`.
    """
    only_reference = (discordance + drop) / 2
    only_candidate = (discordance - drop) / 2
    both_correct = reference_accuracy - only_reference
    both_wrong = 1 - both_correct - only_reference - only_candidate
    probabilities = np.array([both_correct, only_reference, only_candidate, both_wrong])
    if (probabilities < -1e-12).any():
        raise ValueError(f"impossible: accuracy {reference_accuracy}, discordance {discordance}, drop {drop} "
                         "(the discordance must be at least the drop)")
    return np.clip(probabilities, 0, 1)


@dataclass(frozen=True, slots=True)
class SimulatedRun:
    runs: int
    tests: int
    regressed_tests: int
    run_failure_rate: float  # share of runs in which any test failed
    false_failure_per_test: float  # share of unchanged tests that failed
    false_failure_run: float  # share of runs in which some unchanged test failed
    detection_per_test: float | None  # share of regressed tests that failed (None without regressed ones)


def simulate_run(*, n: int, reference_accuracy: float, discordance: float, margin_points: float, alpha: float,
                 multiplicity: str, tests: int = 1, regressed_tests: int = 0, true_drop_points: float = 0.0,
                 runs: int = 2000, seed: int = 0) -> SimulatedRun:
    """Monte Carlo of whole gate runs: `tests` paired checks, the first `regressed_tests` of which truly drop
    by true_drop_points (the others by 0), each checked with the real exact McNemar test, the run-wide
    adjustment and the gate's rule. The discordance of the unchanged tests is `discordance`; a regressed
    test keeps that discordance (its drop comes out of the same flips)."""
    if not 0 <= regressed_tests <= tests:
        raise ValueError("regressed_tests must be between 0 and tests")
    rng = np.random.default_rng(seed)
    counts = np.empty((runs, tests, 4), dtype=np.int64)
    unchanged = cell_probabilities(reference_accuracy=reference_accuracy, discordance=discordance, drop=0.0)
    counts[:, regressed_tests:] = rng.multinomial(n, unchanged, size=(runs, tests - regressed_tests))
    if regressed_tests:
        regressed = cell_probabilities(reference_accuracy=reference_accuracy, discordance=discordance,
                                       drop=true_drop_points / 100)
        counts[:, :regressed_tests] = rng.multinomial(n, regressed, size=(runs, regressed_tests))
    failed = gate_failures(counts, margin_points=margin_points, alpha=alpha, multiplicity=multiplicity)
    null_failed = failed[:, regressed_tests:]
    return SimulatedRun(
        runs=runs, tests=tests, regressed_tests=regressed_tests,
        run_failure_rate=float(failed.any(axis=1).mean()),
        false_failure_per_test=float(null_failed.mean()) if null_failed.size else 0.0,
        false_failure_run=float(null_failed.any(axis=1).mean()) if null_failed.size else 0.0,
        detection_per_test=float(failed[:, :regressed_tests].mean()) if regressed_tests else None,
    )


def gate_failures(counts: np.ndarray, *, margin_points: float, alpha: float, multiplicity: str) -> np.ndarray:
    """Which checks fail, for counts of shape (runs, tests, 4) in PairedCounts order; one family per run."""
    counts = np.asarray(counts)
    n = counts.sum(axis=-1)
    drop_points = 100.0 * (counts[..., 1] - counts[..., 2]) / n
    p_values = mcnemar_p_values(counts[..., 1], counts[..., 2])
    adjusted = adjust_p_value_matrix(p_values, multiplicity)
    return regressed_mask(drop_points, adjusted, margin_points=margin_points, alpha=alpha)
