"""The gate's long-context comparisons (contract 1.10): kvgate's passkey task in long_context/, FP8 vs auto and head vs
base, paired like gsm8k, its power stated; a cell without the task, or whose model's positions held none of its
lengths (skipped), gets no such check; a partner without it is a missing comparison, never a pass."""

from __future__ import annotations

import json
import shutil

from kvgate.cli import main
from kvgate.results.records import LONG_CONTEXT_TASK
from synthetic_run import paired_outcomes, write_accuracy, write_seed_run

AUTO, FP8 = "flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"
N = 200  # 4 lengths x 5 depths x 10 keys, as matrix/workloads.toml declares for the hub models


def with_long_context(run, *, auto_right: int, only_auto: int, only_fp8: int):
    auto, fp8 = paired_outcomes(N, reference_correct=auto_right, only_reference=only_auto, only_candidate=only_fp8)
    for cell, outcomes in ((AUTO, auto), (FP8, fp8)):
        write_accuracy(run / cell, {"strict-match": outcomes, "flexible-extract": outcomes}, task=LONG_CONTEXT_TASK,
                       stage="long_context")
    return run


def checks(run, kind):
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    return [c for c in verdict["checks"] if c["kind"] == kind]


def test_a_long_context_break_fails_while_gsm8k_passes(tmp_path):
    # vllm #23813's size: needle retrieval 91 % -> 13 % with FP8, gsm8k-length prompts unaffected
    run = with_long_context(write_seed_run(tmp_path / "run"), auto_right=182, only_auto=160, only_fp8=4)
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    strict = next(c for c in checks(run, "fp8_long_context") if c["subject"] == "strict-match")
    assert strict["status"] == "fail" and strict["cell"] == FP8
    assert (strict["figures"]["reference"], strict["figures"]["candidate"], strict["figures"]["n"]) == (0.91, 0.13, N)
    assert any("200 passkey documents" in note and "power" in note for note in strict["notes"])
    gsm8k = next(c for c in checks(run, "fp8_accuracy") if c["subject"] == "strict-match")
    assert gsm8k["status"] == "pass"
    assert "fp8_long_context" in (run / "gate" / "report.md").read_text()


def test_equal_long_context_passes_with_its_power_stated(tmp_path):
    run = with_long_context(write_seed_run(tmp_path / "run"), auto_right=180, only_auto=2, only_fp8=2)
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    strict, flexible = sorted(checks(run, "fp8_long_context"), key=lambda c: c["subject"] != "strict-match")
    assert (strict["status"], flexible["status"]) == ("pass", "info")
    note = next(n for n in strict["notes"] if "passkey documents" in n)
    assert "one of 20 pts with power" in note and "--n 200" in note


def test_an_auto_cell_without_the_task_is_a_missing_comparison(tmp_path):
    run = with_long_context(write_seed_run(tmp_path / "run"), auto_right=180, only_auto=2, only_fp8=2)
    shutil.rmtree(run / AUTO / "long_context")
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    [strict] = checks(run, "fp8_long_context")
    assert strict["status"] == "missing" and "no auto cell" in strict["detail"]


def test_a_skipped_task_and_a_run_without_it_have_no_long_context_checks(tmp_path):
    plain = write_seed_run(tmp_path / "plain")
    assert main(["gate", str(plain), "--today", "2026-11-30"]) == 0
    assert checks(plain, "fp8_long_context") == []
    skipped = write_seed_run(tmp_path / "skipped")
    for cell in (AUTO, FP8):
        (skipped / cell / "status.json").write_text(json.dumps({"long_context": {
            "status": "skipped", "reason": "planned out: the passkey lengths 4096 do not fit max_model_len 1024"}}))
    assert main(["gate", str(skipped), "--today", "2026-11-30"]) == 0
    assert checks(skipped, "fp8_long_context") == []


def test_a_broken_long_context_stage_is_an_error_not_a_pass(tmp_path):
    run = with_long_context(write_seed_run(tmp_path / "run"), auto_right=180, only_auto=2, only_fp8=2)
    (run / FP8 / "status.json").write_text(json.dumps({"long_context": {
        "status": "error", "reason": "the long-context task failed: RuntimeError: boom"}}))
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    [check] = checks(run, "fp8_long_context")
    assert check["status"] == "error" and "long-context stage is error" in check["detail"]


def test_a_folder_of_contract_1_10_must_hold_the_task_the_matrix_declares(tmp_path):
    """The matrix's DeepSeek-V2-Lite workload declares the passkey task at 4k-32k: a 1.10 folder whose accuracy stage
    ran without it is a missing comparison (a runner cannot skip it by writing less); a 1.9 folder predates it."""
    bare = write_seed_run(tmp_path / "bare", contract="1.10", long_context=False)
    assert main(["gate", str(bare), "--today", "2026-11-30"]) == 1
    [check] = checks(bare, "fp8_long_context")
    assert check["status"] == "missing"
    assert "declares the passkey task at 4096, 8192, 16384, 32768 tokens" in check["detail"]
    held = write_seed_run(tmp_path / "held", contract="1.10")  # as a 1.10 runner writes it
    assert main(["gate", str(held), "--today", "2026-11-30"]) == 0
    older = write_seed_run(tmp_path / "older", contract="1.9")
    assert main(["gate", str(older), "--today", "2026-11-30"]) == 0
    assert checks(older, "fp8_long_context") == []


def test_the_probe_check_reports_decode_divergence_by_context_length(tmp_path):
    run = write_seed_run(tmp_path / "run", probes=True)
    main(["gate", str(run), "--today", "2026-11-30"])
    [probe] = [c for c in checks(run, "probe") if c["cell"] == FP8]
    [note] = [n for n in probe["notes"] if n.startswith("decode divergence from the auto cell by context length")]
    assert "<=1k tokens: " in note and "greedy prefix" in note


def test_a_passkey_task_answered_by_another_model_than_the_matrix_declares_is_an_error(tmp_path):
    """Contract 1.12: status.json long_context.model names the model of the engine of its own that answered it. The
    matrix's DeepSeek-V2-Lite workload names none (its gsm8k engine answers it), so a cell that says another model
    answered is not compared, whatever its figures: a PR side cannot swap in a model that passes."""
    run = write_seed_run(tmp_path / "run", contract="1.12")
    status_path = run / FP8 / "status.json"
    status = json.loads(status_path.read_text())
    assert status["long_context"]["status"] == "ok"
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    status["long_context"]["model"] = "kvgate:tiny-llama-long"
    status_path.write_text(json.dumps(status))
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    [check] = checks(run, "fp8_long_context")
    assert check["status"] == "error"
    assert ("this cell's passkey task was answered by 'kvgate:tiny-llama-long', but the matrix declares "
            "'deepseek-ai/DeepSeek-V2-Lite-Chat'") in check["detail"]


def test_sides_answered_by_different_models_are_not_compared_without_a_matrix(tmp_path):
    from kvgate.gate import policy
    from kvgate.gate.checks.long_context import fp8_long_context_checks
    from kvgate.matrix import cells as matrix_cells
    from kvgate.results.run_loader import KnownNames, load_run

    run = write_seed_run(tmp_path / "run", contract="1.12")
    for cell, model in ((AUTO, "kvgate:tiny-llama-long"), (FP8, "./my-long-model")):
        status = json.loads((run / cell / "status.json").read_text())
        status["long_context"]["model"] = model
        (run / cell / "status.json").write_text(json.dumps(status))
    loaded = load_run(run, KnownNames.from_matrix(matrix_cells.load()))
    fp8, auto = (next(c for c in loaded.cells if c.identity.id == cell) for cell in (FP8, AUTO))
    [check] = fp8_long_context_checks(fp8, auto, policy.load())
    assert check.status == "error" and "'./my-long-model'" in check.detail and "'kvgate:tiny-llama-long'" in check.detail
