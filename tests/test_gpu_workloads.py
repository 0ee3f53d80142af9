"""The GPU cells' workloads: models that fit each arch's smallest card, lm-eval settings as vLLM's CI has them,
and stage timeouts sized from vLLM CI's engine start-up budgets, used by the runners unless --timeout says."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fake_vllm import read_calls, write_fake_hf_cache, write_fake_vllm
from kvgate import InputErrors
from kvgate.matrix import cells as kvmatrix
from kvgate.runners.matrix_run import DEFAULT_TIMEOUT_SECONDS, RunOptions, run_cells, stage_timeout
from kvgate.runners.stages.commands import bench_throughput_argv, lm_eval_arguments

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30

# The smallest card each runner label stands for (axes.toml) and the hub models' weights in bf16.
SMALLEST_GPU_GIB = {"sm80": 39.4, "sm89": 22.0, "sm90": 79.1, "sm100": 178.4, "sm120": 31.4}
WEIGHTS_GIB = {"deepseek-ai/DeepSeek-V2-Lite-Chat": 15.71e9 * 2 / GIB, "meta-llama/Llama-3.1-8B-Instruct": 8.03e9 * 2 / GIB}
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of the GPU
MIN_KV_GIB = 2.0  # room for a max_model_len sequence of Llama (16k x 128 KiB) and the activations' peak
START_UP_BUDGET_S = {"deepseek-ai/DeepSeek-V2-Lite-Chat": 2400}  # vLLM CI's; every other hub model 1200


@pytest.fixture(scope="module")
def real_matrix() -> kvmatrix.Matrix:
    return kvmatrix.load(ROOT / "matrix")


def test_every_gpu_cells_model_fits_its_archs_smallest_card(real_matrix):
    for cell in real_matrix.cells:
        if cell.arch == "cpu" or cell.workload.is_local_model:
            continue
        room = SMALLEST_GPU_GIB[cell.arch] * GPU_MEMORY_UTILIZATION - WEIGHTS_GIB[cell.model]
        assert room >= MIN_KV_GIB, f"{cell.id}: {cell.model} leaves {room:.1f} GiB on a {SMALLEST_GPU_GIB[cell.arch]} GiB card"


def test_sm89_and_sm120_run_mla_on_the_tiny_deepseek_and_llama_with_smaller_inputs(real_matrix):
    for arch in ("sm89", "sm120"):
        cells = real_matrix.select(archs=[arch])
        assert {c.model for c in cells if c.mla} == {"kvgate:tiny-deepseek-v2"}
        assert {c.backend for c in cells if c.mla} == {"TRITON_MLA"}
        llama = {c.workload.name for c in cells if not c.mla}
        assert llama == {"llama-3_1-8b-24gb"}
        throughput = real_matrix.workloads["llama-3_1-8b-24gb"].throughput
        assert (throughput["random_input_len"], throughput["random_output_len"]) == (1024, 256)
    assert not real_matrix.select(archs=["sm89", "sm120"], kv_cache_dtypes=["auto"], backends=["FLASHMLA"])


def test_the_gpu_mla_workloads_tiny_model_has_dims_gpu_mla_backends_accept(real_matrix):
    from kvgate.workloads.tiny_models import MODELS

    for workload in real_matrix.workloads.values():
        if workload.mla and workload.is_local_model and set(workload.archs) - {"cpu"}:
            config = MODELS[workload.model.removeprefix("kvgate:")].config
            assert (config["kv_lora_rank"], config["qk_rope_head_dim"]) == (512, 64)
            assert config["qk_nope_head_dim"] == config["v_head_dim"] == 128


# ------------------------------------------------------------------------------------------------ lm-eval

def model_args_of(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--model_args") + 1])


@pytest.mark.parametrize("cell_id", ["triton_mla-fp8-sm90", "flashinfer-fp8-sm90", "triton_attn-fp8-sm89"])
def test_hub_models_get_vllm_cis_lm_eval_settings(real_matrix, cell_id):
    cell = real_matrix.cell(cell_id)
    argv = lm_eval_arguments(cell, cell.model, Path("/out"))
    assert model_args_of(argv)["add_bos_token"] is True
    assert argv[argv.index("--num_fewshot") + 1] == "5"
    assert argv[argv.index("--batch_size") + 1] == "auto"
    assert argv[argv.index("--tasks") + 1] == "kvgate_gsm8k_test_train"  # gsm8k's test split, then its train split
    assert "--limit" not in argv  # the plan's questions: the gate's power needs them (vLLM's CI scores 1000/250)
    assert "--apply_chat_template" not in argv


@pytest.mark.parametrize("cell_id", ["cpu_attn-fp8-cpu", "cpu_mla-auto-cpu", "triton_mla-fp8-sm120"])
def test_kvgates_own_models_keep_their_tokenizers_default(real_matrix, cell_id):
    cell = real_matrix.cell(cell_id)
    assert "add_bos_token" not in model_args_of(lm_eval_arguments(cell, "/m", Path("/out")))


def test_add_bos_token_is_lm_evals_not_an_engine_flag(real_matrix):
    cell = real_matrix.cell("triton_mla-fp8-sm90")
    assert not [a for a in bench_throughput_argv("/py", cell, "/m", None) if "bos" in a]


# ----------------------------------------------------------------------------------------------- timeouts

def test_workload_timeouts_follow_the_start_up_budgets(real_matrix):
    for workload in real_matrix.workloads.values():
        if "cpu" in workload.archs:
            assert workload.timeouts == {"accuracy": 3600, "throughput": 3600}  # the CPU default as it was
            continue
        budget = 1200 if workload.is_local_model else START_UP_BUDGET_S.get(workload.model, 1200)
        engines = workload.throughput.get("engines", 1)
        assert workload.timeouts == {"accuracy": budget + 5900,
                                     "throughput": engines * (budget + 300 * (1 + workload.throughput["repeats"]))
                                     }, workload.name


def test_stage_timeouts_come_from_the_workload_unless_overridden(real_matrix):
    deepseek, llama = real_matrix.cell("flashmla-fp8-sm90"), real_matrix.cell("flash_attn-fp8-sm90")
    assert [stage_timeout(deepseek, stage, None) for stage in ("kernels", "accuracy", "throughput")] == [
        DEFAULT_TIMEOUT_SECONDS, 8300, 3600]
    assert [stage_timeout(llama, stage, None) for stage in ("kernels", "accuracy", "throughput")] == [
        DEFAULT_TIMEOUT_SECONDS, 7100, 2400]
    assert stage_timeout(deepseek, "throughput", 90.0) == 90.0


def matrix_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "matrix"
    shutil.copytree(ROOT / "matrix", folder)
    return folder


@pytest.mark.parametrize(("old", "new", "error"), [
    ('timeouts = { accuracy = 8300, throughput = 3600 }', 'timeouts = { accuracy = 0, throughput = 3600 }',
     "expected an integer >= 1, got the number 0 in workloads.deepseek-v2-lite.timeouts.accuracy"),
    ('timeouts = { accuracy = 8300, throughput = 3600 }', 'timeouts = { kernels = 60 }',
     "unknown key 'kernels' in workloads.deepseek-v2-lite.timeouts. Known: accuracy, throughput"),
    ('gsm8k = { add_bos_token = true }\ntimeouts', 'gsm8k = { add_bos_token = "yes" }\ntimeouts',
     "expected true or false, got the string 'yes' in workloads.deepseek-v2-lite.gsm8k.add_bos_token"),
])
def test_bad_workload_settings_are_one_line_each(tmp_path, old, new, error):
    folder = matrix_copy(tmp_path)
    path = folder / "workloads.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(InputErrors) as info:
        kvmatrix.load(folder)
    assert [str(e) for e in info.value.errors] == [f"{path}: {error}"]


def test_the_throughput_stage_is_killed_at_its_workloads_timeout(tmp_path, monkeypatch):
    """The runners use the workload's timeout: a hanging engine of a cell whose workload allows 12 s is killed (time for the engine process to start and hang)."""
    folder = matrix_copy(tmp_path)
    path = folder / "workloads.toml"
    path.write_text(path.read_text().replace("timeouts = { accuracy = 8300, throughput = 3600 }",
                                             "timeouts = { accuracy = 8300, throughput = 12 }", 1))
    fake = write_fake_vllm(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"{fake}:{ROOT / 'src'}")
    monkeypatch.setenv("FAKE_VLLM_SLEEP", "120")
    monkeypatch.setenv("HF_HOME", str(write_fake_hf_cache(tmp_path / "hf", models=("deepseek-ai/DeepSeek-V2-Lite-Chat",))))
    cell = kvmatrix.load(folder).cell("triton_mla-fp8-sm90")
    options = RunOptions(run_dir=tmp_path / "run", stages=["throughput"], local_arch="sm90", echo=False,
                         say=lambda line: None, matrix_dir=folder)

    status, outcomes = run_cells([cell], options)

    assert status == 1
    assert [(o.status, o.reason) for o in outcomes] == [
        ("timeout", "engine 1/1 killed at the stage timeout of 12 s")]
    assert len(read_calls(fake)) == 1
