"""Reading a run folder: nesting lm-eval chose, stage requests, and the same result from parallel workers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cpu_run_fixture import copy_of_the_matrix, without_checkpoint_kv_scales
from kvgate import InputErrors
from kvgate.cli import main
from kvgate.matrix import cells as matrix_module
from kvgate.results.records import UnreadableCell
from kvgate.results.run_loader import KnownNames, load_run
from synthetic_run import write_seed_run, write_status

KNOWN = KnownNames.from_matrix(matrix_module.load())
FIXTURES = Path(__file__).parent / "fixtures"
FP8 = "flashinfer_mla-fp8-sm100"


def real_tools_run(run: Path, fp8_junit: str = "pytest-pass.xml") -> Path:
    """The real tools' files (tests/fixtures), laid out as the contract says."""
    for dtype in ("auto", "fp8"):
        cell = run / f"cpu_attn-{dtype}-cpu"
        cell.mkdir(parents=True)
        (cell / "cell.json").write_text(json.dumps({"backend": "CPU_ATTN", "kv_cache_dtype": dtype, "arch": "cpu",
                                                    "model": "/tmp/kvg4/tiny-llama"}))
        shutil.copytree(FIXTURES / "lm_eval" / dtype, cell / "accuracy")  # results one folder deeper
        shutil.copytree(FIXTURES / "vllm_bench", cell / "throughput")
        (cell / "kernels").mkdir()
        shutil.copy(FIXTURES / "junit" / (fp8_junit if dtype == "fp8" else "pytest-pass.xml"), cell / "kernels" / "junit.xml")
    return run


def test_real_lm_eval_and_bench_outputs_in_a_cell_folder(tmp_path):
    results = load_run(real_tools_run(tmp_path / "run"), KNOWN)
    fp8 = results.cells[1]
    assert fp8.identity.id == "cpu_attn-fp8-cpu" and fp8.identity.task == "gsm8k"
    assert fp8.stage("accuracy").data.samples["strict-match"].n == 10
    assert [r.output_tokens_per_second for r in fp8.stage("throughput").data.repeats] == [6417.46, 5172.10]
    assert fp8.stage("kernels").data.count("passed") == 2
    assert fp8.stage("probe").requested is False


def test_status_json_alone_requests_a_stage(tmp_path):
    run = write_seed_run(tmp_path / "run")
    write_status(run / FP8, {"probe": {"status": "ok"}})
    stage = load_run(run, KNOWN).cells[1].stage("probe")
    assert (stage.requested, stage.health, stage.missing) == (
        True, "missing", "status.json says probe ran, but there is no probe/ folder")


def test_the_gate_output_folder_is_not_a_cell(tmp_path):
    run = write_seed_run(tmp_path / "run")
    (run / "gate").mkdir()
    (run / "gate" / "verdict.json").write_text("{}")
    assert len(load_run(run, KNOWN).cells) == 2


@pytest.mark.parametrize("workers", [1, 2])
def test_parallel_workers_read_the_same_and_report_the_same_problems(tmp_path, workers):
    run = tmp_path / "run"
    for backend, arch in (("FLASHINFER_MLA", "sm100"), ("CUTLASS_MLA", "sm100"), ("FLASHMLA", "sm90")):
        write_seed_run(run, backend=backend, arch=arch)
    assert load_run(run, KNOWN, workers=workers) == load_run(run, KNOWN, workers=1)
    (run / "flashmla-fp8-sm90" / "cell.json").write_text("{")
    loaded = load_run(run, KNOWN, workers=workers)
    assert loaded.unreadable == (UnreadableCell(
        folder=f"{run}/flashmla-fp8-sm90", cell="flashmla-fp8-sm90", side="head",
        problems=(f"{run}/flashmla-fp8-sm90/cell.json: truncated JSON in line 1 column 2",)),)
    assert len(loaded.cells) == 5  # the other cells are read as usual
    (run / "flashmla-fp8-sm90" / "cell.json").unlink()
    (run / "flashmla-auto-sm90" / "cell.json").write_text("[1, 2")  # one problem of the run as a whole beside it
    (run / "copy").mkdir()
    (run / "copy" / "cell.json").write_text((run / "flashinfer_mla-fp8-sm100" / "cell.json").read_text())
    with pytest.raises(InputErrors) as errors:
        load_run(run, KNOWN, workers=workers)
    assert [str(e) for e in errors.value.errors] == [
        f"{run}/flashinfer_mla-fp8-sm100/cell.json: duplicate cell flashinfer_mla-fp8-sm100 (model "
        f"deepseek-ai/DeepSeek-V2-Lite-Chat, task kvgate_gsm8k_test_train) in the top level. {run}/copy/cell.json is the same "
        "cell; "
        "keep one of them"]


def matrix_of_the_outputs(folder: Path) -> Path:
    """The repository's matrix as the real outputs were made (tests/fixtures/README.md): the CPU cells' tiny Llama at
    /tmp/kvg4/tiny-llama on lm-eval's own gsm8k 5-shot, its FP8 cell loading no checkpoint scales (what the gate holds a
    cell.json to: kvgate.gate.trusted)."""
    matrix = without_checkpoint_kv_scales(copy_of_the_matrix(folder))
    workloads = (matrix / "workloads.toml").read_text(encoding="utf-8")
    head, llama = workloads.split("[workloads.tiny-llama]\n", 1)
    llama = llama.replace('model = "kvgate:tiny-llama"', 'model = "/tmp/kvg4/tiny-llama"', 1)
    llama = llama.replace('task = "kvgate_gsm8k_local"', 'task = "gsm8k"', 1).replace("num_fewshot = 0", "num_fewshot = 5", 1)
    (matrix / "workloads.toml").write_text(head + "[workloads.tiny-llama]\n" + llama, encoding="utf-8")
    return matrix


def test_the_gate_end_to_end_on_real_tool_outputs(tmp_path, capsys):
    run = real_tools_run(tmp_path / "run", fp8_junit="pytest-mixed.xml")
    matrix = matrix_of_the_outputs(tmp_path / "matrix")
    assert main(["gate", str(run), "--today", "2026-11-30", "--matrix-dir", str(matrix), "--policy",
                 str(matrix / "policy.toml")]) == 1
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    by_name = {(c["cell"], c["kind"], c["subject"]): c for c in verdict["checks"]}
    kernels = by_name[("cpu_attn-fp8-cpu", "kernels", None)]
    assert (kernels["status"], kernels["figures"]) == ("fail", {"tests": 5, "passed": 2, "failed": 1, "errors": 1,
                                                                "skipped": 1})
    strict = by_name[("cpu_attn-fp8-cpu", "fp8_accuracy", "strict-match")]
    assert (strict["status"], strict["detail"]) == ("error", "only 10 paired questions; the policy needs at least 200 "
                                                              "to resolve a 3.0-point margin")
    ratio = by_name[("cpu_attn-fp8-cpu", "fp8_throughput", "requests_per_second")]
    assert ratio["status"] == "info" and ratio["figures"]["ratio"] == 1.0  # both cells read the same two repeats
    assert by_name[("cpu_attn-auto-cpu", "accuracy", None)]["detail"] == (
        "gsm8k strict-match 0.0000 ± 0.0000, flexible-extract 0.0000 ± 0.0000 (n=10)")
