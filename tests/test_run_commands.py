"""kvgate.runners.stages.commands: the argv each tool gets for a cell (built, not run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.matrix import cells as matrix
from kvgate.runners.stages.commands import (
    bench_throughput_argv,
    engine_flags,
    engine_model_args,
    lm_eval_arguments,
)


@pytest.fixture(scope="module")
def cells() -> dict[str, matrix.Cell]:
    return {cell.id: cell for cell in matrix.load().cells}


def test_model_args_select_the_backend_by_engine_argument(cells):
    args = engine_model_args(cells["flashinfer_mla-fp8-sm100"], "deepseek-ai/DeepSeek-V2-Lite-Chat")
    assert args == {
        "pretrained": "deepseek-ai/DeepSeek-V2-Lite-Chat",
        "kv_cache_dtype": "fp8",
        "attention_backend": "FLASHINFER_MLA",
        "trust_remote_code": True,
        "max_model_len": 32784,  # the 32k passkey documents
        "enforce_eager": False,  # CUDA graphs, as users run (matrix/workloads.toml)
    }


def test_lm_eval_arguments_for_the_cpu_default(cells):
    argv = lm_eval_arguments(cells["cpu_attn-fp8-cpu"], "/models/tiny-llama", Path("/out"),
                             include_path=Path("/tasks"))
    model_args = json.loads(argv[argv.index("--model_args") + 1])
    assert model_args["attention_backend"] == "CPU_ATTN"
    assert model_args["kv_cache_dtype"] == "fp8"
    assert argv[:3] == ["run", "--model", "vllm"]
    assert argv[argv.index("--tasks") + 1] == "kvgate_gsm8k_local"
    assert argv[argv.index("--num_fewshot") + 1] == "0"  # the trained tiny Llama answers 0-shot
    assert argv[argv.index("--gen_kwargs") + 1] == "max_gen_toks=128"
    assert argv[argv.index("--include_path") + 1] == "/tasks"
    assert "--log_samples" in argv
    assert "--limit" not in argv  # limit 0 = the whole test split


def test_lm_eval_arguments_without_a_generation_cap_leave_the_tasks(cells):
    argv = lm_eval_arguments(cells["flashinfer_mla-fp8-sm100"], "deepseek-ai/DeepSeek-V2-Lite-Chat", Path("/out"))
    assert "--gen_kwargs" not in argv
    assert argv[argv.index("--num_fewshot") + 1] == "5"  # vLLM CI's setting for the hub models


def test_passthrough_comes_last_so_it_overrides(cells):
    argv = lm_eval_arguments(cells["cpu_attn-auto-cpu"], "/m", Path("/out"), passthrough=["--limit", "250"])
    assert argv[-2:] == ["--limit", "250"]


def test_bench_throughput_argv(cells):
    argv = bench_throughput_argv("/py", cells["cpu_mla-auto-cpu"], "/models/tiny-deepseek", Path("/o/repeat-1.json"))
    assert argv[:5] == ["/py", "-m", "vllm.entrypoints.cli.main", "bench", "throughput"]
    text = " ".join(argv)
    for expected in ("--model /models/tiny-deepseek", "--dataset-name random", "--random-input-len 128",
                     "--random-output-len 32", "--num-prompts 20", "--kv-cache-dtype auto",
                     "--attention-backend CPU_MLA", "--max-model-len 1024", "--no-trust-remote-code",
                     "--no-enforce-eager", "--output-json /o/repeat-1.json"):
        assert expected in text, expected
    warmup = bench_throughput_argv("/py", cells["cpu_mla-auto-cpu"], "/m", None, ["--num-prompts", "4"])
    assert "--output-json" not in warmup
    assert warmup[-2:] == ["--num-prompts", "4"]


def test_engine_flags():
    assert engine_flags({"enforce_eager": True, "trust_remote_code": False, "max_num_seqs": 8, "x": None,
                         "hf_overrides": {"a": 1}}) == [
        "--enforce-eager", "--no-trust-remote-code", "--max-num-seqs", "8", "--hf-overrides", '{"a": 1}']
