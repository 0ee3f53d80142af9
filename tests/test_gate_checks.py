"""The gate's decisions, check by check, on results folders written in the contract's format."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest

from kvgate.gate import evaluation as gate
from kvgate.gate import policy as policy_module
from kvgate.gate import probe_agreement
from kvgate.gate.checks import pending, throughput
from kvgate.gate.verdict import Verdict
from kvgate.matrix import cells as matrix_module
from kvgate.results.run_loader import KnownNames, load_run
from synthetic_run import (
    paired_outcomes,
    write_accuracy,
    write_cell,
    write_kernels,
    write_probe,
    write_seed_run,
    write_status,
    write_throughput,
)

MATRIX = matrix_module.load()
POLICY = policy_module.load(matrix=MATRIX)
KNOWN = KnownNames.from_matrix(MATRIX)
TODAY = dt.date(2026, 11, 30)
FP8, AUTO = "flashinfer_mla-fp8-sm100", "flashinfer_mla-auto-sm100"


def judge(run: Path, baseline: Path | None = None, today: dt.date = TODAY, require=()) -> Verdict:
    verdict = gate.evaluate(load_run(run, KNOWN), policy=POLICY,
                            baseline=load_run(baseline, KNOWN) if baseline else None, waiver_for=MATRIX.waiver_for,
                            today=today, require=require, probe_compare=probe_agreement.compare)
    for check in verdict.checks:
        print(check.status, check.name, "|", check.detail, "|", *check.notes)
    return verdict


def only(verdict: Verdict, cell: str, kind: str, subject: str | None = None):
    found = [c for c in verdict.checks if c.cell == cell and c.kind == kind and (subject is None or c.subject == subject)]
    assert len(found) == 1, found
    return found[0]


def test_the_seed_case_passes_with_paired_figures(tmp_path):
    verdict = judge(write_seed_run(tmp_path / "run"))
    strict = only(verdict, FP8, "fp8_accuracy", "strict-match")
    assert strict.status == "pass"
    assert strict.figures["reference"] == pytest.approx(0.6444, abs=5e-5)
    assert strict.figures["candidate"] == pytest.approx(0.6262, abs=5e-5)
    assert strict.figures["n"] == 1319 and strict.figures["discordant"] == 132
    assert strict.figures["drop_points"] == pytest.approx(1.82, abs=0.01)
    assert strict.figures["lower_bound_points"] < 3.0 < strict.figures["upper_bound_points"]
    assert strict.p_value > 0.5  # H0 "drop <= 3" is nowhere near rejected
    flexible = only(verdict, FP8, "fp8_accuracy", "flexible-extract")  # reported, not judged
    assert (flexible.status, flexible.figures["reference"], flexible.figures["candidate"]) == (
        "info", pytest.approx(0.6520, abs=5e-5), pytest.approx(0.6384, abs=5e-5))
    ratio = only(verdict, FP8, "fp8_throughput")
    assert ratio.status == "info" and ratio.figures["ratio"] == pytest.approx(3.55 / 3.22)
    assert verdict.exit_status == 0
    assert verdict.multiplicity["accuracy"] == {"method": "none", "alpha": 0.01, "family_size": 2}  # + the floor


def test_a_seven_point_fp8_drop_fails(tmp_path):
    verdict = judge(write_seed_run(tmp_path / "run", fp8_drop_points=7.1))
    check = only(verdict, FP8, "fp8_accuracy", "strict-match")
    assert check.status == "fail"
    assert check.headline == "drop 7.1 pts, lower bound 5.0 > margin 3.0 (p<0.001)"
    assert only(verdict, FP8, "fp8_accuracy", "flexible-extract").status == "info"
    assert verdict.exit_status == 1


@pytest.mark.parametrize(("fp8_only", "where"), [(False, "the auto cell"), (True, "this cell")])
def test_without_sample_logs_the_comparison_fails_closed(tmp_path, fp8_only, where):
    run = write_seed_run(tmp_path / "run", samples=fp8_only)
    if fp8_only:
        shutil.rmtree(run / FP8 / "accuracy")
        _, fp8 = paired_outcomes(1319, reference_correct=850, only_reference=78, only_candidate=54)
        write_accuracy(run / FP8, {"strict-match": fp8, "flexible-extract": fp8}, samples=False)
    verdict = judge(run)
    check = only(verdict, FP8, "fp8_accuracy", "strict-match")
    assert (check.status, check.detail) == ("error", f"no per-question sample log in {where} (lm-eval --log_samples): "
                                                     "the paired test cannot run, and a test on the two means cannot "
                                                     "resolve the margin")
    assert verdict.exit_status == 1


def _replace_fp8_log(run: Path, **options) -> None:
    shutil.rmtree(run / FP8 / "accuracy")
    _, fp8 = paired_outcomes(1319, reference_correct=850, only_reference=78, only_candidate=54)
    keep = options.pop("keep", 1319)
    write_accuracy(run / FP8, {"strict-match": fp8[:keep], "flexible-extract": fp8[:keep]},
                   question_ids=range(keep), **options)


PAIRING_PROBLEMS = {
    "different prompts": (dict(prompt_salt="other few-shot"),
                          "prompt_hash differs on 1319 of 1319 questions: the two runs saw different prompts "
                          "(few-shot examples, chat template or task version)"),
    "fewer questions": (dict(keep=1000),
                        "the two sample logs hold different questions: 1000 in common, 319 only in the auto cell's, "
                        "0 only in this cell's"),
    "mixed join keys": (dict(without_doc_hash=set(range(10))),
                        "mixed join keys in this cell's sample log: 10 records keyed by doc_id, 1309 by doc_hash; one "
                        "log must use one key"),
    "another join key": (dict(without_doc_hash=set(range(1319))),
                         "the auto cell's sample log identifies questions by doc_hash, this cell's by doc_id: they "
                         "cannot be joined"),
}


@pytest.mark.parametrize(("options", "message"), PAIRING_PROBLEMS.values(), ids=PAIRING_PROBLEMS.keys())
def test_logs_that_cannot_be_paired_are_an_error_of_the_check(tmp_path, options, message):
    run = write_seed_run(tmp_path / "run")
    _replace_fp8_log(run, **options)
    verdict = judge(run)
    check = only(verdict, FP8, "fp8_accuracy", "strict-match")
    assert (check.status, check.detail, check.headline) == ("error", message, message)
    assert only(verdict, FP8, "fp8_accuracy", "flexible-extract").status == "info"
    assert verdict.exit_status == 1


def test_an_fp8_cell_without_its_auto_partner_is_missing(tmp_path):
    run = write_seed_run(tmp_path / "run")
    shutil.rmtree(run / AUTO)
    verdict = judge(run)
    check = only(verdict, FP8, "fp8_accuracy")
    assert (check.status, check.detail) == ("missing", "no auto cell of the same backend, arch, model and task in "
                                                       "this run")
    assert verdict.exit_status == 1


def test_too_few_questions_cannot_resolve_the_margin(tmp_path):
    run = tmp_path / "run"
    auto, fp8 = paired_outcomes(50, reference_correct=30, only_reference=3, only_candidate=3)
    for dtype, outcomes in (("auto", auto), ("fp8", fp8)):
        write_accuracy(write_cell(run, backend="FLASHINFER_MLA", kv_cache_dtype=dtype, arch="sm100"),
                       {"strict-match": outcomes, "flexible-extract": outcomes})
    check = only(judge(run), FP8, "fp8_accuracy", "strict-match")
    assert (check.status, check.detail) == ("error", "only 50 paired questions; the policy needs at least 200 to "
                                                     "resolve a 3.0-point margin")


@pytest.mark.parametrize("state", ["error", "timeout"])
def test_a_crashed_stage_fails_closed_and_says_why(tmp_path, state):
    run = write_seed_run(tmp_path / "run")
    write_status(run / FP8, {"accuracy": {"status": state, "reason": "engine died",
                                          "log_tail": "...\nRuntimeError: CUDA error: illegal memory access\n"}})
    verdict = judge(run)
    assert only(verdict, FP8, "accuracy").status == "error"
    # no log file: the first error of the tail status.json kept, and where it was read
    assert only(verdict, FP8, "accuracy").detail == (f"accuracy stage {state}: engine died | first error: RuntimeError: "
                                                     f"CUDA error: illegal memory access ({FP8}/status.json log_tail)")
    assert only(verdict, FP8, "fp8_accuracy").detail == f"cannot compare: this cell's accuracy stage is {state}"
    assert verdict.exit_status == 1


def test_a_requested_stage_without_outputs_is_missing(tmp_path):
    run = write_seed_run(tmp_path / "run")
    shutil.rmtree(run / AUTO / "throughput")
    (run / AUTO / "throughput").mkdir()
    verdict = judge(run)
    assert only(verdict, AUTO, "throughput").status == "missing"
    assert only(verdict, FP8, "fp8_throughput").status == "info"  # no expectation declared: reported, not judged
    assert verdict.exit_status == 1


def test_stages_never_requested_are_not_run_unless_required(tmp_path):
    run = write_seed_run(tmp_path / "run")
    assert only(judge(run), FP8, "probe").status == "not_run"
    assert judge(run).exit_status == 0
    required = judge(run, require=("probe",))
    assert only(required, FP8, "probe").detail == "probe stage never ran, but the gate requires it (--require)"
    assert required.exit_status == 1


def test_a_skipped_stage_reads_not_run_with_its_reason(tmp_path):
    run = write_seed_run(tmp_path / "run")
    write_status(run / FP8, {"probe": {"status": "skipped", "reason": "MLA fp8 is not supported on CPU"}})
    assert only(judge(run), FP8, "probe").detail == "probe stage skipped (MLA fp8 is not supported on CPU)"


def test_kernel_failures_fail_the_cell_naming_the_test(tmp_path):
    run = write_seed_run(tmp_path / "run")
    write_kernels(run / FP8, passed=3, failed=["test_fp8_decode[bs4]"])
    check = only(judge(run), FP8, "kernels")
    assert (check.status, check.detail) == ("fail", "1 failed, 0 errors of 4: tests.kernels.test_decode::"
                                                    "test_fp8_decode[bs4]: AssertionError: max abs error 0.31 > 0.05")


def test_kernel_tests_that_all_skipped_prove_nothing(tmp_path):
    run = write_seed_run(tmp_path / "run")
    write_kernels(run / FP8, passed=0, skipped=5)
    check = only(judge(run), FP8, "kernels")
    assert (check.status, check.detail) == ("fail", "0 kernel tests ran (5 skipped of 5); the policy needs at least 1")


def _flashinfer_sm120_run(tmp_path: Path) -> Path:
    run = write_seed_run(tmp_path / "run", backend="FLASHINFER", arch="sm120")
    write_kernels(run / "flashinfer-fp8-sm120", passed=2, failed=["test_fp8_cuda_graph"])
    return run


def test_a_live_waiver_reads_waived_and_does_not_fail_the_gate(tmp_path):
    verdict = judge(_flashinfer_sm120_run(tmp_path))
    kernels = only(verdict, "flashinfer-fp8-sm120", "kernels")
    assert kernels.status == "waived" and kernels.waiver.issue.endswith("/41651")
    assert "would be fail" in kernels.detail
    # a check the waiver covers reads WAIVED even when it passes
    assert only(verdict, "flashinfer-fp8-sm120", "fp8_accuracy", "strict-match").status == "waived"
    assert only(verdict, "flashinfer-auto-sm120", "kernels").status == "pass"  # auto is not waived
    assert verdict.exit_status == 0


def test_an_expired_waiver_no_longer_applies_and_the_report_says_so(tmp_path):
    verdict = judge(_flashinfer_sm120_run(tmp_path), today=dt.date(2027, 4, 1))
    kernels = only(verdict, "flashinfer-fp8-sm120", "kernels")
    assert kernels.status == "fail"
    assert kernels.notes[-1] == ("waiver waiver[0] expired on 2027-03-31 (https://github.com/vllm-project/vllm/"
                                 "issues/41651); it no longer applies")
    assert verdict.exit_status == 1


def test_against_a_baseline(tmp_path):
    baseline = write_seed_run(tmp_path / "base")
    run = write_seed_run(tmp_path / "run")
    shutil.rmtree(run / FP8 / "throughput")
    write_throughput(run / FP8, (3.0, 3.02, 3.01))  # 3.55 -> 3.01 req/s: -15 %
    write_cell(baseline, backend="FLASHINFER_MLA", kv_cache_dtype="fp8_e4m3", arch="sm100")
    verdict = judge(run, baseline)
    slow = only(verdict, FP8, "throughput")
    assert slow.status == "fail" and slow.figures["ratio"] == pytest.approx(3.01 / 3.55)
    assert only(verdict, AUTO, "throughput").status == "pass"
    same = only(verdict, FP8, "baseline_accuracy", "strict-match")
    assert same.status == "pass" and same.figures["drop_points"] == 0.0
    gone = only(verdict, "flashinfer_mla-fp8_e4m3-sm100", "cell")
    assert gone.status == "missing"
    assert verdict.multiplicity["throughput"]["family_size"] == 2
    assert verdict.exit_status == 1


def test_a_new_cell_has_no_baseline_to_compare_with(tmp_path):
    baseline = write_seed_run(tmp_path / "base")
    shutil.rmtree(baseline / FP8)
    verdict = judge(write_seed_run(tmp_path / "run"), baseline)
    assert only(verdict, FP8, "baseline_accuracy").status == "not_run"
    assert verdict.exit_status == 0


def test_multiplicity_when_the_policy_asks_for_one(tmp_path):
    """The policy's rule is none (margin tests; policy.toml says why); a policy that asks for bh adjusts the
    run's judged accuracy p-values together: one per cell (the primary filter)."""
    text = policy_module.default_policy_path().read_text().replace('multiplicity = "none"', 'multiplicity = "bh"', 1)
    (tmp_path / "policy.toml").write_text(text)
    policy = policy_module.load(tmp_path / "policy.toml", matrix=MATRIX)
    run = tmp_path / "run"
    for index, backend in enumerate(("FLASHINFER", "TRITON_ATTN", "FLASH_ATTN")):
        auto, fp8 = paired_outcomes(1319, reference_correct=850, only_reference=60 + 5 * index, only_candidate=50)
        for dtype, outcomes in (("auto", auto), ("fp8", fp8)):
            write_accuracy(write_cell(run, backend=backend, kv_cache_dtype=dtype, arch="sm90",
                                      model="meta-llama/Llama-3.1-8B-Instruct"),
                           {"strict-match": outcomes, "flexible-extract": outcomes},
                           model="meta-llama/Llama-3.1-8B-Instruct")
    verdict = gate.evaluate(load_run(run, KNOWN), policy=policy, waiver_for=MATRIX.waiver_for, today=TODAY)
    tests = [c for c in verdict.checks if c.kind == "fp8_accuracy" and c.status != "info"]
    assert verdict.multiplicity["accuracy"] == {"method": "bh", "alpha": 0.01, "family_size": 3}
    assert judge(run).multiplicity["accuracy"]["method"] == "none"
    assert all(c.adjusted_p_value >= c.p_value for c in tests)
    assert max(c.adjusted_p_value for c in tests) == pytest.approx(max(c.p_value for c in tests))  # BH keeps the largest


@pytest.mark.parametrize(("shift", "flip_every", "status"), [(0.02, 0, "pass"), (0.6, 2, "fail")])
def test_probe_agreement_of_fp8_against_auto(tmp_path, shift, flip_every, status):
    run = write_seed_run(tmp_path / "run")
    write_probe(run / AUTO)
    write_probe(run / FP8, shift=shift, flip_every=flip_every)
    check = only(judge(run), FP8, "probe")
    assert check.status == status
    assert check.figures["mean_abs_logprob_diff"] == pytest.approx(shift)
    if status == "fail":
        assert check.detail == ("mean_abs_logprob_diff 0.6 > 0.15; max_abs_logprob_diff 0.6 > 0.5; top1_agreement "
                                "0.5455 < 0.6 vs the auto cell")


def test_a_probe_that_scores_no_prompt_position_is_never_a_pass(tmp_path):
    """Prompts of one token have no prompt logprob to compare: the prompt figures were 0 difference and top-1
    agreement 1 of nothing, and the check passed; both probe.json files are the results folder's."""
    run = write_seed_run(tmp_path / "run")
    write_probe(run / AUTO, length=1, generated=0)
    write_probe(run / FP8, length=1, generated=0)
    check = only(judge(run), FP8, "probe")
    assert (check.status, check.figures["prompt_positions"]) == ("error", 0)
    assert check.detail == ("the probes score no prompt position (no prompt of more than one token), so "
                            "mean_abs_logprob_diff, max_abs_logprob_diff, top1_agreement measure nothing: cannot "
                            "compare logprobs with the auto cell")


def test_cells_of_one_id_with_several_models_are_named_with_their_model(tmp_path):
    run = tmp_path / "run"
    for model in ("org-a/Small-Model", "org-b/Large-Model"):
        auto, fp8 = paired_outcomes(300, reference_correct=200, only_reference=10, only_candidate=10)
        for dtype, outcomes in (("auto", auto), ("fp8", fp8)):
            write_accuracy(write_cell(run, backend="TRITON_ATTN", kv_cache_dtype=dtype, arch="sm90", model=model,
                                      folder=f"{dtype}-{model.split('/')[0]}"),
                           {"strict-match": outcomes, "flexible-extract": outcomes}, model=model)
    names = {c.cell for c in judge(run).checks if c.kind == "fp8_accuracy"}
    assert names == {"triton_attn-fp8-sm90 [Small-Model]", "triton_attn-fp8-sm90 [Large-Model]"}


# 1.2 passes now: 3.22 -> 3.55 (1.10) is 8 % short of it, within what the run-to-run SD (3 %, two cells of one run
# are not interleaved) leaves uncertain at alpha_unpaired 0.01; 1.3 is 15 % short and fails.
@pytest.mark.parametrize(("min_ratio", "status"), [(0.9, "pass"), (1.0, "pass"), (1.2, "pass"), (1.3, "fail")])
def test_fp8_throughput_is_judged_where_the_policy_declares_an_expectation(tmp_path, min_ratio, status):
    text = (policy_module.default_policy_path().read_text() + "\n[[throughput.fp8_over_auto]]\n"
            'match = { backend = "FLASHINFER_MLA", arch = "sm100" }\n'
            f'min_ratio = {min_ratio}\nreason = "the seed PR measured +10 % on B200"\n')
    (tmp_path / "policy.toml").write_text(text)
    policy = policy_module.load(tmp_path / "policy.toml", matrix=MATRIX)
    run = load_run(write_seed_run(tmp_path / "run"), KNOWN)
    verdict = gate.evaluate(run, policy=policy, waiver_for=MATRIX.waiver_for, today=TODAY)
    check = only(verdict, FP8, "fp8_throughput")
    print(check)
    assert check.status == status
    assert check.threshold["min_ratio"] == min_ratio
    shipped = len(policy_module.load(matrix=MATRIX).throughput.fp8_over_auto)  # the declared ones come first
    assert check.notes[0] == f"expectation throughput.fp8_over_auto[{shipped}]: the seed PR measured +10 % on B200"


def test_an_fp8_cell_that_ran_shorter_requests_is_no_fp8_speedup(tmp_path):
    """At min_ratio 1.3 the seed's FP8 cell (1.10x auto) fails; run with 512 output tokens a request instead of the
    workload's 1024 it answers 1.6x the requests a second (1.77x auto): its repeats hold fewer tokens than the auto
    cell's, so the ratio is not tested."""
    text = (policy_module.default_policy_path().read_text() + "\n[[throughput.fp8_over_auto]]\n"
            'match = { backend = "FLASHINFER_MLA", arch = "sm100" }\nmin_ratio = 1.3\nreason = "a test\'s"\n')
    (tmp_path / "policy.toml").write_text(text)
    policy = policy_module.load(tmp_path / "policy.toml", matrix=MATRIX)
    run = write_seed_run(tmp_path / "run")
    shutil.rmtree(run / FP8 / "throughput")
    write_throughput(run / FP8, [v * 1.6 for v in (3.53, 3.55, 3.56, 3.55, 3.54, 3.56, 3.55)], output_len=512)
    verdict = gate.evaluate(load_run(run, KNOWN), policy=policy, waiver_for=MATRIX.waiver_for, today=TODAY)
    check = only(verdict, FP8, "fp8_throughput")
    assert check.status == "error"
    assert check.detail == (
        f"cannot compare: the repeats ran different workloads: {run}/{AUTO}/throughput/repeat-1.json holds 100 "
        f"requests of 921600 tokens in all, {run}/{FP8}/throughput/repeat-1.json 100 of 870400 (the same prompts and "
        "input/output lengths were expected)")


def _ab_throughput(tmp_path: Path, base: list[float], head: list[float]):
    """Loaded head and base runs with these repeats (throughput/repeat-N.json, N = the round)."""
    runs = []
    for name, values in (("base", base), ("head", head)):
        cell = write_cell(tmp_path / name, backend="FLASHINFER_MLA", kv_cache_dtype="fp8", arch="sm100")
        write_throughput(cell, values)
        runs.append(load_run(tmp_path / name, KNOWN))
    return runs[1].cells[0], runs[0]


BASE_ROUNDS = [3.22, 3.10, 3.30, 3.18, 3.25, 3.15, 3.28]  # rounds drift by a few % together


def test_interleaved_repeats_are_paired_by_round(tmp_path):
    """A 9 % slowdown in every round: the paired test sees it through the round-to-round drift; the same
    figures without the pairing (the run-to-run SD added) cannot tell it from two runs 3 % apart."""
    head = [round(v * 0.91 * (1 + 0.003 * (-1) ** i), 4) for i, v in enumerate(BASE_ROUNDS)]
    cell, base = _ab_throughput(tmp_path, BASE_ROUNDS, head)
    _, waiting = throughput.throughput_check(cell, base, POLICY, (), ab=True, interleaved=True)
    paired = pending.decide(waiting, None)
    print(paired.detail)
    assert paired.status == "fail" and paired.method == "paired t over interleaved rounds, log throughput, " \
                                                       "against the tolerance"
    assert paired.interval[1] < 0.95 and paired.notes[0] == "interleaved A/B: paired by round (7 rounds)"
    _, waiting = throughput.throughput_check(cell, base, POLICY, (), ab=True, interleaved=False)
    assert pending.decide(waiting, None).status == "pass"


def test_interleaved_rounds_that_do_not_match_are_an_error(tmp_path):
    cell, base = _ab_throughput(tmp_path, BASE_ROUNDS, BASE_ROUNDS[:6])
    check, waiting = throughput.throughput_check(cell, base, POLICY, (), ab=True, interleaved=True)
    assert waiting is None
    assert (check.status, check.detail) == ("error", "cannot test: the interleaved rounds differ: round 7 only on the "
                                                     "baseline side, none only on the current side")
