"""The trusted side decides (kvgate.gate.trusted): every key of cell.json and status.json that the matrix or the
policy determines is held against them, through `kvgate gate`. A folder that says otherwise is that cell's ERROR
(check `cell`), naming the file, the key, what the folder said and what the matrix or the policy says, and nothing of
the cell is judged. The throughput design is played in tests/test_gate_ab.py, the question plan in
tests/test_sequential.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpu_run_fixture import copy_of_the_matrix
from kvgate.cli import main
from synthetic_run import (
    paired_outcomes,
    planned_questions,
    write_accuracy,
    write_cell,
    write_kernels,
    write_status,
    write_throughput,
)

BACKEND, ARCH = "FLASHINFER_MLA", "sm100"
AUTO, FP8 = "flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"
FILTERS = ("strict-match", "flexible-extract")
TODAY = "2026-12-02"


def write_pair(run: Path, n: int, *, only_auto: int, only_fp8: int, edits: dict[str, dict] | None = None,
               removed: dict[str, tuple[str, ...]] | None = None) -> Path:
    """The matrix's FLASHINFER_MLA auto and FP8 cells as kvgate's runners write them, on n questions (the FP8 cell
    losing only_auto and gaining only_fp8 against auto); `edits`/`removed`: cell id -> cell.json keys to set/drop."""
    auto_outcomes, fp8_outcomes = paired_outcomes(n, reference_correct=round(0.644 * n), only_reference=only_auto,
                                                  only_candidate=only_fp8, seed=3)
    for dtype, outcomes in (("auto", auto_outcomes), ("fp8", fp8_outcomes)):
        cell_id = f"flashinfer_mla-{dtype}-sm100"
        cell = write_cell(run, backend=BACKEND, kv_cache_dtype=dtype, arch=ARCH,
                          extra={"contract_version": "1.6", **(edits or {}).get(cell_id, {})})
        if (removed or {}).get(cell_id):
            record = json.loads((cell / "cell.json").read_text())
            for key in removed[cell_id]:
                record.pop(key)
            (cell / "cell.json").write_text(json.dumps(record))
        write_accuracy(cell, {name: outcomes for name in FILTERS})
        write_kernels(cell)
        write_throughput(cell, [3.2, 3.22, 3.21, 3.19, 3.2, 3.23, 3.21])
        write_status(cell, {"accuracy": {"status": "ok", "kv_cache": {
            "element_bytes": [1 if dtype == "fp8" else 2], "layer_kv_cache_dtypes": [dtype]}}})
    return run


def gate(run: Path, *extra: str) -> tuple[int, dict]:
    code = main(["gate", str(run), "--today", TODAY, *extra])
    return code, json.loads((run / "gate" / "verdict.json").read_text())


def refused(verdict: dict, cell: str) -> dict:
    return next(c for c in verdict["checks"] if c["cell"] == cell and c["kind"] == "cell")


def judged_kinds(verdict: dict, cell: str) -> set[str]:
    return {c["kind"] for c in verdict["checks"] if c["cell"] == cell and c["kind"] != "cell"}


def test_attack_a_relabelled_task_cannot_pass_a_five_point_drop(tmp_path):
    """The fp8 cell's cell.json says lm-eval's own gsm8k and carries its 1,319 answers; the matrix runs DeepSeek-V2-Lite
    on gsm8k's test and train splits, where the policy plans 3,226 questions. Planned from the folder's task (gsm8k:
    1,319, the whole pool), the 5-point drop passes at p 0.018 against alpha 0.01; the trusted side refuses it."""
    relabelled = {AUTO: {"task": "gsm8k"}, FP8: {"task": "gsm8k"}}
    run = write_pair(tmp_path / "run", 1319, only_auto=112, only_fp8=46, edits=relabelled)
    # what the same data buys under a matrix that does run this model on gsm8k: a pass
    matrix = copy_of_the_matrix(tmp_path / "matrix-on-gsm8k")
    workloads = (matrix / "workloads.toml").read_text()
    (matrix / "workloads.toml").write_text(workloads.replace('task = "kvgate_gsm8k_test_train"', 'task = "gsm8k"', 1))
    code, verdict = gate(run, "--matrix-dir", str(matrix), "--policy", str(matrix / "policy.toml"))
    strict = next(c for c in verdict["checks"] if c["kind"] == "fp8_accuracy" and c["subject"] == "strict-match")
    assert (code, strict["status"], round(strict["figures"]["drop_points"], 1)) == (0, "pass", 5.0)
    assert 0.01 < strict["p_value"] < 0.02
    # the shipped matrix: both cells are refused, named; no accuracy comparison is judged
    code, verdict = gate(run)
    assert code == 1
    for cell in (AUTO, FP8):
        check = refused(verdict, cell)
        assert check["status"] == "error"
        assert (f"{run}/{cell}/cell.json task is 'gsm8k', but the matrix says 'kvgate_gsm8k_test_train' for {cell} "
                "(matrix/workloads.toml workloads.deepseek-v2-lite)") in check["detail"]
        assert judged_kinds(verdict, cell) == set()
    assert planned_questions(BACKEND, "fp8", ARCH) == 3226


@pytest.mark.parametrize(("cell", "edit", "removed", "said"), [
    (FP8, {}, ("task",), "task is 'gsm8k', but the matrix says 'kvgate_gsm8k_test_train'"),  # absent means gsm8k
    (FP8, {"model": "meta-llama/Llama-3.1-8B-Instruct"}, (),
     "model is 'meta-llama/Llama-3.1-8B-Instruct', but the matrix says 'deepseek-ai/DeepSeek-V2-Lite-Chat'"),
    (AUTO, {"workload": "llama-3_1-8b"}, (), "workload is 'llama-3_1-8b', but the matrix says 'deepseek-v2-lite'"),
    (FP8, {"cell_id": "flashmla-fp8-sm90"}, (), "cell_id is 'flashmla-fp8-sm90', but the matrix says "
                                                "'flashinfer_mla-fp8-sm100'"),
    (FP8, {"checkpoint_kv_scales": True}, (), "checkpoint_kv_scales is True, but the matrix says False"),
    (AUTO, {"checkpoint_kv_scales": True}, (), "checkpoint_kv_scales is True, but the matrix says False"),
    (FP8, {"calculate_kv_scales": True}, (), "calculate_kv_scales is True, but the matrix says False"),
])
def test_attack_each_key_the_matrix_decides_is_the_matrixs(tmp_path, cell, edit, removed, said):
    n = planned_questions(BACKEND, "fp8", ARCH)
    run = write_pair(tmp_path / "run", n, only_auto=20, only_fp8=20, edits={cell: edit}, removed={cell: removed})
    code, verdict = gate(run)
    assert code == 1
    check = refused(verdict, cell)
    assert check["status"] == "error"
    assert check["detail"].startswith(f"not judged: the results folder disagrees with the trusted side: "
                                      f"{run}/{cell}/cell.json {said} for flashinfer_mla-")
    assert check["headline"].startswith("disagrees with the trusted side: ")
    assert judged_kinds(verdict, cell) == set()
    if cell == AUTO:  # its FP8 cell has no auto cell to be compared with: missing, never a pass
        fp8 = next(c for c in verdict["checks"] if c["cell"] == FP8 and c["kind"] == "fp8_accuracy")
        assert fp8["status"] == "missing"


@pytest.mark.parametrize("what", ["shots", "no shots", "prompts"])
def test_attack_the_tools_outputs_cannot_run_another_workload(tmp_path, what):
    """lm-eval's n-shot and vllm bench's num_requests say what ran: the matrix's gsm8k shots and prompts, or the
    cell's ERROR naming the file, the key and both values."""
    run = write_pair(tmp_path / "run", planned_questions(BACKEND, "fp8", ARCH), only_auto=20, only_fp8=20)
    fp8 = run / FP8
    if what in ("shots", "no shots"):
        [results] = fp8.rglob("results_*.json")
        data = json.loads(results.read_text())
        if what == "shots":
            data["n-shot"]["kvgate_gsm8k_test_train"] = 0
        else:
            del data["n-shot"]
        results.write_text(json.dumps(data))
        said = (f"{results.relative_to(tmp_path.parent)} n-shot is {0 if what == 'shots' else 'absent'}, but the matrix "
                "says 5")
    else:
        write_throughput(fp8, [3.2] * 7, num_requests=10)
        said = f"{(fp8 / 'throughput' / 'repeat-1.json').relative_to(tmp_path.parent)} num_requests is 10, but the " \
               "matrix says 100 prompts (num_prompts)"
    code, verdict = gate(run)
    assert code == 1
    detail = refused(verdict, FP8)["detail"]
    assert said in detail and detail.endswith("(matrix/workloads.toml workloads.deepseek-v2-lite); a results folder "
                                              "cannot choose what the matrix and the policy decide (rerun the cell "
                                              "with this matrix and policy)")


def test_the_matrixs_own_record_is_judged(tmp_path):
    """What kvgate's runners write for the matrix's cells passes the trusted side."""
    run = write_pair(tmp_path / "run", planned_questions(BACKEND, "fp8", ARCH), only_auto=20, only_fp8=20)
    code, verdict = gate(run)
    assert code == 0 and not [c for c in verdict["checks"] if c["kind"] == "cell"]
    assert "fp8_accuracy" in judged_kinds(verdict, FP8)


def test_attack_leaving_out_checkpoint_kv_scales_does_not_turn_the_scale_check_off(tmp_path):
    """The CPU default's FP8 cell loads its checkpoint's k/v scales; a cell.json without the key says false (the
    contract's default), which the matrix contradicts: refused, so the scales are never left unchecked."""
    run = tmp_path / "run"
    for dtype in ("auto", "fp8"):
        cell = write_cell(run, backend="CPU_ATTN", kv_cache_dtype=dtype, arch="cpu", extra={"contract_version": "1.6"})
        if dtype == "fp8":
            record = json.loads((cell / "cell.json").read_text())
            assert record.pop("checkpoint_kv_scales") is True  # what the runner writes for it
            (cell / "cell.json").write_text(json.dumps(record))
        write_accuracy(cell, {name: [True, False] * 120 for name in FILTERS})
        write_status(cell, {"accuracy": {"status": "ok", "kv_cache": {"element_bytes": [1 if dtype == "fp8" else 2],
                                                                        "k_scales": [1.0], "v_scales": [1.0]}}})
    code, verdict = gate(run)
    assert code == 1
    assert (f"{run}/cpu_attn-fp8-cpu/cell.json checkpoint_kv_scales is absent (false), but the matrix says True for "
            "cpu_attn-fp8-cpu (matrix/workloads.toml workloads.tiny-llama)") in refused(verdict, "cpu_attn-fp8-cpu")[
        "detail"]
    assert judged_kinds(verdict, "cpu_attn-fp8-cpu") == set()


def test_a_cell_the_matrix_does_not_have_is_refused(tmp_path):
    """fp8_e4m3 on CUDA archs is excluded (vLLM maps fp8 to e4m3 there): a folder of it was planned for nothing."""
    run = tmp_path / "run"
    cell = write_cell(run, backend=BACKEND, kv_cache_dtype="fp8_e4m3", arch=ARCH)
    write_kernels(cell)
    code, verdict = gate(run)
    assert code == 1
    assert refused(verdict, "flashinfer_mla-fp8_e4m3-sm100")["detail"] == (
        f"not judged: the results folder disagrees with the trusted side: {run}/flashinfer_mla-fp8_e4m3-sm100/cell.json "
        "names cell flashinfer_mla-fp8_e4m3-sm100, which is no cell of the matrix (the backend does not support that "
        "dtype on that arch, or matrix/exclusions.toml leaves it out): nothing was planned for it; a results folder "
        "cannot choose what the matrix and the policy decide (rerun the cell with this matrix and policy)")


def test_attack_the_base_side_of_an_ab_run_is_held_to_the_matrix_too(tmp_path):
    run = tmp_path / "run"
    n = planned_questions(BACKEND, "fp8", ARCH)
    write_pair(run, n, only_auto=20, only_fp8=20)
    for dtype in ("auto", "fp8"):
        head = run / f"flashinfer_mla-{dtype}-sm100"
        base = run / f"flashinfer_mla-{dtype}-sm100--base"
        base.mkdir()
        for path in head.rglob("*"):
            if path.is_file():
                (base / path.relative_to(head)).parent.mkdir(parents=True, exist_ok=True)
                (base / path.relative_to(head)).write_bytes(path.read_bytes())
        record = json.loads((base / "cell.json").read_text())
        record.update(side="base", **({"task": "gsm8k"} if dtype == "fp8" else {}))
        (base / "cell.json").write_text(json.dumps(record))
        for folder in (head, base):
            status = json.loads((folder / "status.json").read_text())
            status["throughput"] = {"status": "ok", "interleaved": {"order": ["base", "head"], "rounds": 7}}
            (folder / "status.json").write_text(json.dumps(status))
    code, verdict = gate(run, "--require-baseline")
    assert code == 1
    check = next(c for c in verdict["checks"] if c["kind"] == "cell" and c["reference"] == "base")
    assert (check["cell"], check["status"]) == (FP8, "error")
    assert f"{run}/{FP8}--base/cell.json task is 'gsm8k'" in check["detail"]
    baseline = next(c for c in verdict["checks"] if c["cell"] == FP8 and c["kind"] == "baseline_accuracy")
    assert baseline["status"] == "missing"  # the head has no base side to be compared with


def test_every_measured_workload_design_catches_a_ten_percent_slowdown():
    """The trusted side holds each folder to its workload's throughput design (engines and repeats a side). A design
    of fewer engines than the policy's rounds cannot pair its A/B engines, so it rests on the engine-to-engine SD
    measured for its cells: every measured cell of the shipped matrix must then catch a 10 % slowdown at least 90 % of
    the time at that noise (the unmeasured ones state their weak power in every check)."""
    from kvgate.statistics import power
    from synthetic_run import shipped_matrix, shipped_policy

    tput, workloads = shipped_policy().throughput, shipped_matrix().workloads
    measured = [n for n in tput.measured_noise if n.workload in workloads and n.engine_sd is not None]
    assert {n.cell for n in measured} == {"flashmla-fp8-sm90", "flashmla-auto-sm90", "flash_attn-fp8-sm90",
                                          "flash_attn-auto-sm90"}
    for noise in measured:
        design = workloads[noise.workload].throughput
        caught = power.engine_ab_power(int(design.get("engines", 1)), int(design["repeats"]), repeat_sd=noise.repeat_sd,
                                       engine_sd=noise.engine_sd, tolerance=tput.tolerance, slowdown=0.10,
                                       alpha=tput.alpha)
        assert caught >= 0.9, (noise.cell, caught)
