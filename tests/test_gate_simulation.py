"""Monte Carlo proof of the gate's goals on per-question data (issue 11), small enough for the test suite.

Questions come from synthetic_run.QuestionModel: per-question difficulty, noise flips and the regression are
separate parameters, with two flip models ("fragile": middling questions flip; "uniform") and two regression
models, so the figures are about the method, not one generator. The fast path is the gate's own vectorised
function (margins.margin_rejects = what margin_test decides, checked below decision by decision, and through
`kvgate gate` on a few folders). benchmarks/gate_simulation.py prints the full tables with 20000 runs a figure.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvgate.cli import main
from kvgate.gate import policy as policy_module
from kvgate.statistics import margins
from synthetic_run import QuestionModel, write_accuracy, write_cell

POLICY = policy_module.load()
ACC, TPUT = POLICY.accuracy, POLICY.throughput
FP8_TAX, BASELINE_MARGIN, ALPHA = ACC.fp8_tax_points, ACC.baseline_margin_points, ACC.alpha


def test_the_simulated_thresholds_are_the_policy_ones() -> None:
    assert (ALPHA, FP8_TAX, BASELINE_MARGIN, ACC.gap_points, ACC.questions) == (0.01, 3.0, 1.0, 3.0, 3005)


def fail_rate(model: QuestionModel, *, drop: float, margin: float, runs: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    questions = model.questions()
    failed = 0
    for start in range(0, runs, 1000):
        reference, candidate = model.runs(min(1000, runs - start), drop_points=drop, rng=rng, questions=questions)
        b = (reference & ~candidate).sum(axis=1)
        c = (~reference & candidate).sum(axis=1)
        failed += int(margins.margin_rejects(b, c, model.n, margin_points=margin, alpha=ALPHA).sum())
    return failed / runs


def mc(rate: float, runs: int) -> float:
    return 3 * math.sqrt(max(rate * (1 - rate), 1e-4) / runs)


def test_the_fast_path_is_the_gates_decision() -> None:
    model = QuestionModel(n=1319, flips=0.12)
    reference, candidate = model.runs(300, drop_points=4.5, rng=np.random.default_rng(8))
    b = (reference & ~candidate).sum(axis=1)
    c = (~reference & candidate).sum(axis=1)
    fast = margins.margin_rejects(b, c, 1319, margin_points=FP8_TAX, alpha=ALPHA)
    for run in range(300):
        counts = margins.PairedCounts.from_outcomes(reference[run], candidate[run])
        assert margin_test_regressed(counts) == fast[run]
    assert 0 < fast.sum() < 300  # both outcomes seen


def margin_test_regressed(counts: margins.PairedCounts) -> bool:
    return margins.margin_test(counts, margin_points=FP8_TAX, alpha=ALPHA).regressed


MODELS = {"fragile flips": dict(flip_model="fragile"), "uniform flips": dict(flip_model="uniform"),
          "fragile regression": dict(flip_model="uniform", regression_model="fragile")}


@pytest.mark.parametrize("variant", MODELS.values(), ids=MODELS.keys())
@pytest.mark.parametrize("margin", [FP8_TAX, BASELINE_MARGIN])
@pytest.mark.parametrize("flips", [0.05, 0.10, 0.15])
def test_a_drop_equal_to_the_margin_fails_at_most_1_percent_per_cell(flips: float, margin: float,
                                                                     variant: dict) -> None:
    runs = 4000
    rate = fail_rate(QuestionModel(n=1319, flips=flips, **variant), drop=margin, margin=margin, runs=runs, seed=100)
    print(f"\nmargin {margin:g}, {flips:.0%} flips, {variant}: drop = margin fails {rate:.2%} (+-{mc(rate, runs) / 3:.2%})")
    assert rate <= ALPHA + mc(ALPHA, runs)


@pytest.mark.parametrize("flips", [0.05, 0.15])
def test_a_run_of_32_fp8_cells_at_a_1_6_point_tax_fails_at_most_1_percent(flips: float) -> None:
    runs = 1000
    model = QuestionModel(n=1319, flips=flips)
    any_failed = np.zeros(runs, dtype=bool)
    rng = np.random.default_rng(7)
    questions = model.questions()
    for _ in range(32):
        reference, candidate = model.runs(runs, drop_points=1.6, rng=rng, questions=questions)
        b = (reference & ~candidate).sum(axis=1)
        c = (~reference & candidate).sum(axis=1)
        any_failed |= margins.margin_rejects(b, c, 1319, margin_points=FP8_TAX, alpha=ALPHA)
    rate = float(any_failed.mean())
    print(f"\n32 FP8 cells at a 1.6-point tax, {flips:.0%} flips: the run fails {rate:.2%}")
    assert rate <= 0.01 + mc(0.01, runs)


@pytest.mark.parametrize("variant", MODELS.values(), ids=MODELS.keys())
@pytest.mark.parametrize("margin", [FP8_TAX, BASELINE_MARGIN])
def test_margin_plus_3_is_caught_90_percent_with_the_policys_questions(margin: float, variant: dict) -> None:
    runs = 3000
    for flips in (0.10, 0.15):
        rate = fail_rate(QuestionModel(n=ACC.questions, flips=flips, **variant), drop=margin + ACC.gap_points,
                         margin=margin, runs=runs, seed=200)
        print(f"\nmargin {margin:g}, {flips:.0%} flips, {variant}: drop {margin + 3:g} caught {rate:.2%}")
        assert rate >= ACC.power - mc(ACC.power, runs)


def test_at_1319_questions_the_power_falls_short_as_the_policy_says() -> None:
    rate = fail_rate(QuestionModel(n=1319, flips=0.15), drop=FP8_TAX + 3, margin=FP8_TAX, runs=3000, seed=300)
    print(f"\nn = 1319, 15 % flips: a 6-point FP8 drop caught {rate:.1%}")
    assert rate < 0.75  # hence accuracy.questions = 3005 (kvgate power: 52 % with the worst-case generator)


def test_a_few_comparisons_through_kvgate_gate_agree_with_the_fast_path(tmp_path) -> None:
    model = QuestionModel(n=1319, flips=0.10)
    reference, candidate = model.runs(8, drop_points=5.5, rng=np.random.default_rng(21))
    b = (reference & ~candidate).sum(axis=1)
    c = (~reference & candidate).sum(axis=1)
    fast = margins.margin_rejects(b, c, 1319, margin_points=FP8_TAX, alpha=ALPHA)
    for run in range(8):
        folder = tmp_path / f"run-{run}"
        for dtype, outcomes in (("auto", reference[run]), ("fp8", candidate[run])):
            cell = write_cell(folder, backend="FLASHINFER", kv_cache_dtype=dtype, arch="sm90",
                              model="meta-llama/Llama-3.1-8B-Instruct")
            write_accuracy(cell, {"strict-match": outcomes.tolist(), "flexible-extract": outcomes.tolist()},
                           model="meta-llama/Llama-3.1-8B-Instruct", prompt_chars=0)
        assert main(["gate", str(folder), "--today", "2026-11-30"]) in (0, 1)
        verdict = json.loads((folder / "gate" / "verdict.json").read_text())
        check = next(c for c in verdict["checks"] if c["kind"] == "fp8_accuracy" and c["subject"] == "strict-match")
        assert check["status"] == ("fail" if fast[run] else "pass")
    assert 0 < fast.sum() < 8


# ---------------------------------------------------------------------------------------------- the seed PR

SEED = {"strict-match": (0.6444, 0.6262), "flexible-extract": (0.6520, 0.6384)}


def seed_counts(reference_accuracy: float, candidate_accuracy: float, discordance: float) -> margins.PairedCounts:
    right_ref, right_cand = round(reference_accuracy * 1319), round(candidate_accuracy * 1319)
    difference = right_ref - right_cand
    only_ref = (round(discordance * 1319) + difference) // 2
    only_cand = only_ref - difference
    both = right_ref - only_ref
    return margins.PairedCounts(both, only_ref, only_cand, 1319 - both - only_ref - only_cand)


@pytest.mark.parametrize("discordance", [0.04, 0.08, 0.12, 0.20])
def test_the_seed_pr_passes_whatever_the_flips(discordance: float) -> None:
    for name, (auto, fp8) in SEED.items():
        counts = seed_counts(auto, fp8, discordance)
        assert (round(counts.reference_accuracy, 4), round(counts.candidate_accuracy, 4)) == (auto, fp8)
        test = margins.margin_test(counts, margin_points=FP8_TAX, alpha=ALPHA)
        print(f"\nseed {name}, {discordance:.0%} flips: {test}")
        assert not test.regressed


@pytest.mark.parametrize("discordance", [0.10, 0.15])
def test_a_7_point_fp8_drop_fails_whatever_the_flips(discordance: float) -> None:
    for auto, _ in SEED.values():
        assert margins.margin_test(seed_counts(auto, auto - 0.07, discordance), margin_points=FP8_TAX,
                                 alpha=ALPHA).regressed


# ---------------------------------------------------------------------------------------------- throughput

def throughput_rate(*, interleaved: bool, slowdown: float, sd: float, runs: int, seed: int) -> float:
    """P(fail) of the policy's throughput test, 7 repeats a side: interleaved (each repeat its own noise sd,
    a 2 % drift shared by each round) or stored (each run its own level at sd, repeats 1 % apart)."""
    rng = np.random.default_rng(seed)
    rounds = TPUT.rounds
    failed = 0
    for _ in range(runs):
        if interleaved:
            drift = rng.normal(0, 0.02, rounds)
            base = 3.22 * np.exp(drift + rng.normal(0, sd, rounds))
            head = 3.22 * (1 - slowdown) * np.exp(drift + rng.normal(0, sd, rounds))
            test = margins.paired_ratio_test(dict(enumerate(base)), dict(enumerate(head)),
                                           min_ratio=1 - TPUT.tolerance, alpha=TPUT.alpha)
        else:
            base = 3.22 * np.exp(rng.normal(0, sd) + rng.normal(0, 0.01, rounds))
            head = 3.22 * (1 - slowdown) * np.exp(rng.normal(0, sd) + rng.normal(0, 0.01, rounds))
            test = margins.unpaired_ratio_test(base, head, min_ratio=1 - TPUT.tolerance, alpha=TPUT.alpha_unpaired,
                                             run_to_run_sd=TPUT.run_to_run_sd)
        failed += test.regressed
    return failed / runs


@pytest.mark.parametrize("sd", [0.02, 0.03])
def test_interleaved_throughput_meets_the_goals_with_the_policys_rounds(sd: float) -> None:
    runs = 2000
    unchanged = throughput_rate(interleaved=True, slowdown=0.0, sd=sd, runs=runs, seed=1)
    at_tolerance = throughput_rate(interleaved=True, slowdown=TPUT.tolerance, sd=sd, runs=runs, seed=2)
    caught = throughput_rate(interleaved=True, slowdown=0.10, sd=sd, runs=runs, seed=3)
    print(f"\ninterleaved, {sd:.0%} repeat SD: unchanged {unchanged:.2%}, at the tolerance {at_tolerance:.2%}, "
          f"10 % slower {caught:.2%}")
    assert unchanged <= 0.01
    assert at_tolerance <= TPUT.alpha + mc(TPUT.alpha, runs)
    assert caught >= 0.90 - mc(0.90, runs)


def test_a_stored_baseline_keeps_false_alarms_low_but_cannot_reach_the_power() -> None:
    runs = 4000
    unchanged = throughput_rate(interleaved=False, slowdown=0.0, sd=0.03, runs=runs, seed=4)
    caught = throughput_rate(interleaved=False, slowdown=0.10, sd=0.03, runs=runs, seed=5)
    twenty = throughput_rate(interleaved=False, slowdown=0.20, sd=0.03, runs=runs, seed=6)
    print(f"\nstored baseline, 3 % run-to-run SD: unchanged {unchanged:.3%}, 10 % slower {caught:.1%}, "
          f"20 % slower {twenty:.1%}")
    assert unchanged <= 0.01 / 32 + mc(0.0003, runs)  # a run of 32 unchanged cells stays within 1 %
    assert caught < 0.5 < 0.9 < twenty  # as matrix/policy.toml says: 10 % needs an A/B run


# ---------------------------------------------------------------------------------------------- the extremes

@pytest.mark.parametrize(("b", "c", "n"), [(0, 0, 0), (2, 0, 1), (-1, 0, 5), (3, 3, 5)],
                         ids=["no questions", "more discordant than questions", "negative", "b + c > n"])
def test_the_fast_path_refuses_the_counts_the_gates_test_refuses(b: int, c: int, n: int) -> None:
    """margin_rejects is what margin_test decides, at the extremes too: n = 0 read as p = 1 (a silent pass) and
    impossible counts as a certain failure; margin_test refuses them, and so does the fast path now."""
    with pytest.raises(ValueError):
        margins.margin_test(margins.PairedCounts(0, b, c, n - b - c), margin_points=FP8_TAX, alpha=ALPHA)
    with pytest.raises(ValueError, match="impossible counts"):
        margins.margin_rejects(np.array([0, b]), np.array([0, c]), n, margin_points=FP8_TAX, alpha=ALPHA)
    with pytest.raises(ValueError, match="impossible counts"):
        margins.reverse_margin_log_p(b, c, n, 0.06)


@pytest.mark.parametrize(("b", "c"), [(0, 0), (1, 0), (0, 1)])
def test_one_question_the_fast_path_and_the_test_agree(b: int, c: int) -> None:
    counts = margins.PairedCounts(1 - b - c, b, c, 0)
    assert margin_test_regressed(counts) == bool(margins.margin_rejects(b, c, 1, margin_points=FP8_TAX, alpha=ALPHA))


def test_a_question_model_needs_questions() -> None:
    with pytest.raises(ValueError, match="at least 1 question"):
        QuestionModel(n=0)
    reference, candidate = QuestionModel(n=1).runs(5, rng=np.random.default_rng(0))
    assert reference.shape == candidate.shape == (5, 1)


def test_one_question_is_written_as_lm_eval_writes_it_and_judged_underpowered(tmp_path) -> None:
    """lm-eval writes the stderr of one sample as "N/A" (the synthetic writer divided by n - 1 = 0); the gate reads
    it and errors the comparison as underpowered, never a pass. No questions: lm-eval writes no results."""
    for dtype in ("auto", "fp8"):
        cell = write_cell(tmp_path / "run", backend="FLASHINFER", kv_cache_dtype=dtype, arch="sm90")
        folder = write_accuracy(cell, {"strict-match": [True], "flexible-extract": [True]})
        results = json.loads(next(folder.glob("results_*.json")).read_text())
        assert next(iter(results["results"].values()))["exact_match_stderr,strict-match"] == "N/A"
    with pytest.raises(ValueError, match="0 questions"):
        write_accuracy(cell, {"strict-match": [], "flexible-extract": []})
    assert main(["gate", str(tmp_path / "run"), "--out", str(tmp_path / "gate"), "--today", "2026-11-30"]) == 1
    verdict = json.loads((tmp_path / "gate" / "verdict.json").read_text())
    check = next(c for c in verdict["checks"] if c["kind"] == "fp8_accuracy" and c["subject"] == "strict-match")
    assert check["status"] == "error" and check["detail"].startswith("only 1 paired questions")
