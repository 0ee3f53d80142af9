"""The gate's decisions, check by check, on results folders written in the contract's format."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest

from kvgate.gate import checks as gate
from kvgate.gate import policy as policy_module
from kvgate.gate import probe_agreement
from kvgate.gate.stats import UNPAIRED_METHOD
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
    flexible = only(verdict, FP8, "fp8_accuracy", "flexible-extract")
    assert (flexible.status, flexible.figures["reference"], flexible.figures["candidate"]) == (
        "pass", pytest.approx(0.6520, abs=5e-5), pytest.approx(0.6384, abs=5e-5))
    ratio = only(verdict, FP8, "fp8_throughput")
    assert ratio.status == "info" and ratio.figures["ratio"] == pytest.approx(3.55 / 3.22)
    assert verdict.exit_status == 0
    assert verdict.multiplicity["accuracy"]["family_size"] == 2


def test_a_seven_point_fp8_drop_fails(tmp_path):
    verdict = judge(write_seed_run(tmp_path / "run", fp8_drop_points=7.1))
    for name in ("strict-match", "flexible-extract"):
        check = only(verdict, FP8, "fp8_accuracy", name)
        assert check.status == "fail"
        assert check.headline == "drop 7.1 pts > 3.0 (p<0.001)"
    assert verdict.exit_status == 1


@pytest.mark.parametrize(("drop", "status"), [(None, "pass"), (7.1, "fail")])
def test_without_sample_logs_the_unpaired_fallback_decides_and_says_it_is_weaker(tmp_path, drop, status):
    verdict = judge(write_seed_run(tmp_path / "run", fp8_drop_points=drop, samples=False))
    check = only(verdict, FP8, "fp8_accuracy", "strict-match")
    assert (check.status, check.method) == (status, UNPAIRED_METHOD)
    assert any("weaker" in note for note in check.notes)


def test_different_prompts_fall_back_to_the_unpaired_test(tmp_path):
    run = write_seed_run(tmp_path / "run")
    cell = run / FP8
    shutil.rmtree(cell / "accuracy")
    _, fp8 = paired_outcomes(1319, reference_correct=850, only_reference=78, only_candidate=54)
    write_accuracy(cell, {"strict-match": fp8, "flexible-extract": fp8}, prompt_salt="other few-shot")
    check = only(judge(run), FP8, "fp8_accuracy", "strict-match")
    assert check.method == UNPAIRED_METHOD
    assert check.notes[0].startswith("prompt_hash differs on 1319 of 1319 questions")


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
    assert only(verdict, FP8, "accuracy").detail == (f"accuracy stage {state}: engine died | RuntimeError: CUDA error: "
                                                     "illegal memory access")
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
    assert only(required, FP8, "probe").detail == "probe stage never requested, but the gate requires it"
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


def test_multiplicity_adjusts_every_accuracy_p_value_of_the_run_together(tmp_path):
    run = tmp_path / "run"
    for index, backend in enumerate(("FLASHINFER", "TRITON_ATTN", "FLASH_ATTN")):
        auto, fp8 = paired_outcomes(1319, reference_correct=850, only_reference=60 + 5 * index, only_candidate=50)
        for dtype, outcomes in (("auto", auto), ("fp8", fp8)):
            write_accuracy(write_cell(run, backend=backend, kv_cache_dtype=dtype, arch="sm90",
                                      model="meta-llama/Llama-3.1-8B-Instruct"),
                           {"strict-match": outcomes, "flexible-extract": outcomes},
                           model="meta-llama/Llama-3.1-8B-Instruct")
    verdict = judge(run)
    tests = [c for c in verdict.checks if c.kind == "fp8_accuracy"]
    assert verdict.multiplicity["accuracy"] == {"method": "bh", "alpha": 0.01, "family_size": 6}
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


@pytest.mark.parametrize(("min_ratio", "status"), [(0.9, "pass"), (1.0, "pass"), (1.2, "fail")])
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
    assert check.notes[0] == "expectation throughput.fp8_over_auto[0]: the seed PR measured +10 % on B200"
