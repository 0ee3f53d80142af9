"""kvgate.statistics.sequential: the boundaries (against a published table and a Monte Carlo of the canonical
process), the runner's decide(), the gate's replay(), the real tests' error rates, and the gate end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvgate.cli import main
from kvgate.gate import policy as policy_module
from kvgate.statistics import distributions, margins, power, sequential
from synthetic_run import paired_outcomes, write_accuracy, write_cell, write_status

POLICY = policy_module.load()
ACC = POLICY.accuracy
QUARTERS = (0.25, 0.5, 0.75, 1.0)


def policy_bounds() -> sequential.Boundaries:
    return sequential.boundaries(ACC.sequential.looks, alpha=ACC.alpha, beta=1 - ACC.power,
                                 rho=ACC.sequential.beta_spending_rho)


def test_efficacy_bounds_match_the_published_lan_demets_obrien_fleming_table() -> None:
    """gsDesign (sfLDOF, one-sided alpha 0.025, 4 equally spaced looks): 4.3326, 2.9631, 2.3590, 2.0141."""
    bounds = sequential.boundaries(QUARTERS, alpha=0.025, beta=0.1, rho=2.0)
    assert bounds.efficacy == pytest.approx((4.3326, 2.9631, 2.3590, 2.0141), abs=2e-4)


def test_one_look_is_the_fixed_design() -> None:
    bounds = sequential.boundaries((1.0,), alpha=0.01, beta=0.1, rho=2.0)
    assert bounds.efficacy[0] == pytest.approx(distributions.normal_quantile(0.99), abs=1e-8)
    assert bounds.drift == pytest.approx(distributions.normal_quantile(0.99) + distributions.normal_quantile(0.9), abs=1e-6)
    assert bounds.inflation == pytest.approx(1.0, abs=1e-6)


def test_the_policy_design_spends_alpha_and_beta_as_declared() -> None:
    bounds = policy_bounds()
    print(bounds)
    assert bounds.efficacy == pytest.approx((5.0201, 3.4605, 2.7649, 2.3625), abs=1e-4)
    assert bounds.futility[-1] == pytest.approx(bounds.efficacy[-1] - bounds.drift)  # the bounds meet at the end
    assert bounds.inflation == pytest.approx(1.0732, abs=1e-4)
    at_margin = sequential.operating(bounds, 0.0)
    at_target = sequential.operating(bounds, 1.0)
    assert at_margin.fail <= ACC.alpha  # below alpha: futility stops only take rejections away (non-binding)
    assert at_target.fail == pytest.approx(ACC.power, abs=1e-6)


def test_the_bounds_against_a_monte_carlo_of_the_canonical_process() -> None:
    """Brownian motion in information time, drift 0 (H0) and eta (H1): crossing rates per look."""
    bounds = policy_bounds()
    rng = np.random.default_rng(17)
    runs = 400000
    t = np.array(bounds.fractions)
    for drift_rel in (0.0, 1.0):
        increments = rng.normal(size=(runs, t.size)) * np.sqrt(np.diff(np.r_[0, t])) + \
            drift_rel * bounds.drift * np.diff(np.r_[0, t])
        z = np.cumsum(increments, axis=1) / np.sqrt(t)
        alive = np.ones(runs, dtype=bool)
        fails = []
        for k in range(t.size):
            fail = alive & (z[:, k] >= bounds.efficacy[k])
            passes = alive & ~fail & (z[:, k] <= bounds.futility_on_margin_scale(k))
            fails.append(fail.mean())
            alive &= ~(fail | passes)
        expected = sequential.operating(bounds, drift_rel).fail_at
        print(drift_rel, fails, expected)
        for got, want in zip(fails, expected, strict=True):
            assert got == pytest.approx(want, abs=4 * math.sqrt(max(want, 1e-5) / runs) + 1e-5)


def test_expected_questions_on_unchanged_code_are_at_most_0_6_of_the_fixed_design() -> None:
    plan_fp8 = power.sequential_plan(fixed_questions=ACC.questions, fractions=ACC.sequential.looks, alpha=ACC.alpha,
                                     beta=1 - ACC.power, rho=ACC.sequential.beta_spending_rho,
                                     margin_points=ACC.fp8_tax_points, gap_points=ACC.gap_points)
    plan_base = power.sequential_plan(fixed_questions=ACC.questions, fractions=ACC.sequential.looks,
                                      alpha=ACC.alpha, beta=1 - ACC.power, rho=ACC.sequential.beta_spending_rho,
                                      margin_points=ACC.baseline_margin_points, gap_points=ACC.gap_points)
    print(plan_fp8, plan_base, sep="\n")
    assert plan_fp8.max_questions == ACC.sequential.max_questions
    assert plan_fp8.expected_fraction["drop 0"] <= 0.6 and plan_fp8.expected_fraction["margin / 2"] <= 0.6
    assert plan_base.expected_fraction["drop 0"] <= 0.6


# ---------------------------------------------------------------------------------------------- decide / replay

def design(margin: float = 3.0) -> sequential.Design:
    return sequential.design(sequential.looks_for(ACC.sequential.max_questions, ACC.sequential.looks),
                             alpha=ACC.alpha, beta=1 - ACC.power, rho=ACC.sequential.beta_spending_rho,
                             margin_points=margin, gap_points=ACC.gap_points)


def test_decide_at_the_looks() -> None:
    d = design()
    assert d.looks == (807, 1613, 2420, 3226)
    assert sequential.decide(d, 40, 40, 807).action == "pass"  # no drop at all: far below 3 + 3
    assert sequential.decide(d, 140, 20, 807).action == "fail"  # 15 points after 807 questions
    assert sequential.decide(d, 75, 35, 807).action == "continue"  # 5 points: not yet clear either way
    last = sequential.decide(d, 150, 70, 3226)
    assert last.action in ("fail", "pass")  # the last look always decides
    with pytest.raises(ValueError) as caught:
        sequential.decide(d, 10, 10, 1000)
    assert str(caught.value) == "1000 questions is not a look of this design (looks at 807, 1613, 2420, 3226)"


def test_replay_decides_at_the_first_crossing_and_ignores_what_came_after() -> None:
    d = design()
    ref, cand = paired_outcomes(3226, reference_correct=2100, only_reference=160, only_candidate=160, seed=4)
    result = sequential.replay(d, ref, cand)
    assert (result.decision, result.look.look, result.unused) == ("pass", 1, 3226 - 807)
    assert result.counts.n == 807 and result.p_value > 0.5
    assert result.upper_points < ACC.fp8_tax_points + ACC.gap_points  # why it could stop: 6 points is ruled out


def test_replay_of_a_comparison_that_stopped_too_soon() -> None:
    d = design()
    ref, cand = paired_outcomes(900, reference_correct=600, only_reference=75, only_candidate=35, seed=4)
    with pytest.raises(sequential.IncompleteSequence) as caught:
        sequential.replay(d, ref, cand)
    assert str(caught.value) == ("the comparison stopped at 900 questions without crossing a boundary (looks at 807, "
                                 "1613, 2420, 3226; last look 807: continue)")


def test_the_stagewise_p_value_agrees_with_the_decision() -> None:
    bounds = policy_bounds()
    for look in range(1, 5):
        at_bound = math.exp(sequential.stagewise_log_p(bounds, look, bounds.efficacy[look - 1]))
        assert at_bound == pytest.approx(bounds.alpha_spent[look - 1], rel=1e-6)  # <= alpha exactly at the bound
        assert math.exp(sequential.stagewise_log_p(bounds, look, bounds.efficacy[look - 1] - 0.3)) > \
            bounds.alpha_spent[look - 1]


# ---------------------------------------------------------------------------------------------- the real tests

def simulate_sequential(d: sequential.Design, flips: float, drop: float, runs: int, seed: int) -> tuple[float, float]:
    """P(fail) and E[questions] / looks[-1] with the real margin tests at each look (multinomial increments)."""
    p10, p01 = power.paired_probabilities(flips=flips, drop_points=drop)
    rng = np.random.default_rng(seed)
    sizes = np.diff(np.r_[0, d.looks])
    b = np.zeros(runs, dtype=np.int64)
    c = np.zeros(runs, dtype=np.int64)
    alive = np.ones(runs, dtype=bool)
    failed = np.zeros(runs, dtype=bool)
    used = np.zeros(runs)
    for k, (n, size) in enumerate(zip(d.looks, sizes, strict=True)):
        draw = rng.multinomial(size, [p10, p01, 1 - p10 - p01], size=runs)
        b += draw[:, 0]
        c += draw[:, 1]
        log_p = margins.margin_log_p(b, c, n, d.margin_points / 100)
        log_q = margins.reverse_margin_log_p(b, c, n, (d.margin_points + d.gap_points) / 100)
        fail = alive & (log_p <= float(distributions.log_normal_sf(d.bounds.efficacy[k])))
        z_futility = -distributions.z_from_log_p(log_q)
        stop = fail | (alive & (z_futility <= d.bounds.futility[k])) if k < len(d.looks) - 1 else alive
        used[alive & stop] = n
        failed |= fail
        alive &= ~stop
    return float(failed.mean()), float(used.mean() / d.looks[-1])


@pytest.mark.parametrize("margin", [3.0, 1.0])
def test_the_real_tests_keep_the_design_error_rates(margin: float) -> None:
    d = design(margin)
    runs = 20000
    size, _ = simulate_sequential(d, 0.15, margin, runs, seed=1)
    caught, spent = simulate_sequential(d, 0.15, margin + ACC.gap_points, runs, seed=2)
    _, unchanged = simulate_sequential(d, 0.15, 0.0, runs, seed=3)
    print(f"margin {margin}: size {size:.4f}, power {caught:.4f} (E[n] {spent:.2f}), E[n] at drop 0 {unchanged:.2f} "
          f"of the max, {unchanged * d.looks[-1] / ACC.questions:.2f} of the fixed design")
    assert size <= ACC.alpha + 3 * math.sqrt(0.01 * 0.99 / runs)
    assert caught >= ACC.power - 3 * math.sqrt(0.09 / runs)
    assert unchanged * d.looks[-1] / ACC.questions <= 0.6


# ---------------------------------------------------------------------------------------------- through the gate

# The matrix's TRITON_MLA cells on sm89 run kvgate's tiny DeepSeek-V2 on its local task, which holds the policy's
# questions: its plan is 1619 in 4 looks
BACKEND, ARCH = "TRITON_MLA", "sm89"
PLAN = {"design": sequential.DESIGN_NAME, "questions": 1619, "looks": [405, 810, 1215, 1619]}


def sequential_run(tmp_path: Path, *, n_candidate: int, record: dict | None = None, only_ref: int = 24,
                   only_cand: int = 24, auto_record: dict | None = None) -> Path:
    """An auto cell that answered the plan's 1619 questions and an FP8 cell that answered the first n_candidate,
    each with its runner's record (status.json accuracy.question_plan; None: none recorded)."""
    run = tmp_path / "run"
    n = PLAN["questions"]
    ref, cand = paired_outcomes(n, reference_correct=1314, only_reference=only_ref, only_candidate=only_cand, seed=4)
    auto = write_cell(run, backend=BACKEND, kv_cache_dtype="auto", arch=ARCH, extra={"contract_version": "1.6"})
    write_accuracy(auto, {"strict-match": ref, "flexible-extract": ref})
    write_status(auto, {"accuracy": {"status": "ok", "question_plan": auto_record or {**PLAN, "answered": n}}})
    fp8 = write_cell(run, backend=BACKEND, kv_cache_dtype="fp8", arch=ARCH, extra={"contract_version": "1.6"})
    write_accuracy(fp8, {"strict-match": cand[:n_candidate], "flexible-extract": cand[:n_candidate]})
    evidence = {"element_bytes": [1], "layer_kv_cache_dtypes": ["fp8"]}
    write_status(fp8, {"accuracy": {"status": "ok", "kv_cache": evidence,
                                    **({"question_plan": record} if record is not None else {})}})
    return run


def fp8_check(run: Path) -> dict:
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    return next(c for c in verdict["checks"] if c["kind"] == "fp8_accuracy" and c["subject"] == "strict-match")


def test_the_gate_judges_a_comparison_stopped_at_its_first_look(tmp_path) -> None:
    run = sequential_run(tmp_path, n_candidate=405, record={**PLAN, "answered": 405, "seconds": 9.0})
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    check = fp8_check(run)
    print(json.dumps(check, indent=1))
    assert check["status"] == "pass" and check["method"] == sequential.SEQUENTIAL_METHOD
    assert (check["figures"]["n"], check["figures"]["look"], check["figures"]["looks"]) == (405, 1, PLAN["looks"])
    assert "sequential: decided at look 1 of 4 (405 of up to 1619 questions)" in check["notes"]


def test_a_break_beyond_the_margin_fails_at_the_first_look(tmp_path) -> None:
    run = sequential_run(tmp_path, n_candidate=405, only_ref=320, only_cand=24,
                         record={**PLAN, "answered": 405})
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    check = fp8_check(run)
    assert (check["status"], check["figures"]["look"]) == ("fail", 1)


def test_a_runner_that_stopped_where_the_replay_does_not_decide_fails_closed(tmp_path) -> None:
    run = sequential_run(tmp_path, n_candidate=380, record={**PLAN, "answered": 380})
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    check = fp8_check(run)
    assert (check["status"], check["detail"]) == (
        "error", "cannot decide: the comparison stopped at 380 questions without crossing a boundary (looks at 405, "
                 "810, 1215, 1619; no look reached); yet this cell stopped after 380 of 1619 questions")


def test_fewer_questions_than_the_plan_are_underpowered_and_an_error_under_require_baseline(tmp_path) -> None:
    run = sequential_run(tmp_path, n_candidate=380)  # no record: a run cut short, or an older runner
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    check = fp8_check(run)
    assert check["status"] == "pass" and any(note.startswith("380 paired questions, fewer than the plan's 1619")
                                             for note in check["notes"])
    assert main(["gate", str(run), "--today", "2026-11-30", "--require-baseline"]) == 1
    check = fp8_check(run)
    assert check["status"] == "error" and "--require-baseline needs the plan's questions" in check["detail"]


@pytest.mark.parametrize("forged", [
    {"design": "fixed", "questions": 240, "looks": [240], "answered": 240},
    {"design": sequential.DESIGN_NAME, "questions": 1619, "looks": [100, 1619], "answered": 100},
])
def test_a_results_folder_cannot_choose_its_own_design(tmp_path, forged) -> None:
    """The gate judges by the policy's plan; a record of any other design is the cell's error (kvgate.gate.trusted),
    naming both, never the rule; and the FP8 cell's comparisons are not judged by it."""
    run = sequential_run(tmp_path, n_candidate=forged["answered"], record=forged)
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    refused = next(c for c in verdict["checks"] if c["kind"] == "cell" and c["cell"] == "triton_mla-fp8-sm89")
    assert refused["status"] == "error"
    assert (f"{run}/triton_mla-fp8-sm89/status.json accuracy.question_plan is {forged['design']} with "
            f"{forged['questions']} questions, looks {forged['looks']}, but the policy plans kvgate-gs/1 with 1619 "
            "questions, looks [405, 810, 1215, 1619] (matrix/policy.toml [accuracy])") in refused["detail"]
    assert not any(c["kind"] == "fp8_accuracy" for c in verdict["checks"])


def test_a_malformed_question_plan_record_is_an_error_of_the_check(tmp_path) -> None:
    run = sequential_run(tmp_path, n_candidate=405, record={**PLAN, "looks": [405, 100], "answered": 405})
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    assert fp8_check(run)["detail"] == (
        "cannot compare: this cell's status.json accuracy.question_plan.looks: expected increasing numbers of "
        "questions ending at questions (1619), got [405, 100]")
