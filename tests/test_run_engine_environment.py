"""kvgate.runners.engine_environment, including the VLLM_ATTENTION_BACKEND guard."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.runners.engine_environment import engine_environment

HOME = Path("/home/u")


def test_ignored_backend_variable_is_unset_with_a_warning():
    env, warnings = engine_environment({"VLLM_ATTENTION_BACKEND": "FLASHINFER", "PATH": "/bin"}, arch="sm90",
                                       local_model=False, home=HOME)
    assert "VLLM_ATTENTION_BACKEND" not in env
    assert env["PATH"] == "/bin"
    assert warnings == [
        "VLLM_ATTENTION_BACKEND=FLASHINFER is set, but vLLM >= 0.26 ignores it silently (vllm issue 50292): "
        "kvgate unsets it for the run and selects each cell's backend with the engine argument attention_backend"]


def test_no_warning_without_the_variable():
    _, warnings = engine_environment({}, arch="sm90", local_model=False, home=HOME)
    assert warnings == []


def test_cpu_defaults_and_offline_local_models():
    env, _ = engine_environment({}, arch="cpu", local_model=True, home=HOME)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == "/home/u/.cache/kvgate/vllm"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_DATASETS_OFFLINE"] == "1"


def test_user_settings_win_and_gpu_runs_keep_vllms_own_cache_and_kv_sizing():
    env, _ = engine_environment({"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CACHE_ROOT": "/c"}, arch="cpu",
                                local_model=False, home=HOME)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["VLLM_CACHE_ROOT"] == "/c"
    gpu, _ = engine_environment({}, arch="sm100", local_model=False, home=HOME)
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu
    assert "VLLM_CACHE_ROOT" not in gpu


def test_hub_models_run_with_the_hub_offline_unless_told_otherwise():
    gpu, warnings = engine_environment({}, arch="sm90", local_model=False, home=HOME)
    assert (gpu["HF_HUB_OFFLINE"], gpu["HF_DATASETS_OFFLINE"]) == ("1", "1")
    assert warnings == []
    online, _ = engine_environment({"HF_HUB_OFFLINE": "0"}, arch="sm90", local_model=False, home=HOME)
    assert (online["HF_HUB_OFFLINE"], online["HF_DATASETS_OFFLINE"]) == ("0", "0")  # a developer's explicit choice
    local, _ = engine_environment({"HF_HUB_OFFLINE": "0"}, arch="cpu", local_model=True, home=HOME)
    assert local["HF_HUB_OFFLINE"] == "1"  # kvgate's own models never need the hub


def test_tokens_never_reach_an_offline_engine():
    env, warnings = engine_environment({"HF_TOKEN": "hf_x", "HUGGING_FACE_HUB_TOKEN": "hf_y"}, arch="sm90",
                                       local_model=False, home=HOME)
    assert "HF_TOKEN" not in env and "HUGGING_FACE_HUB_TOKEN" not in env
    assert warnings == [
        "HF_TOKEN and HUGGING_FACE_HUB_TOKEN are set, but the engines run with the hub offline and need no token: "
        "kvgate keeps them from the engine processes, which run the vLLM under test (a token belongs where the "
        "cache is filled: README, \"Offline operation\")"]
    online, warnings = engine_environment({"HF_TOKEN": "hf_x", "HF_HUB_OFFLINE": "0"}, arch="sm90",
                                          local_model=False, home=HOME)
    assert online["HF_TOKEN"] == "hf_x" and warnings == []


def test_pytorch_benchmark_format_is_switched_off():
    env, _ = engine_environment({"SAVE_TO_PYTORCH_BENCHMARK_FORMAT": "1"}, arch="cpu", local_model=True, home=HOME)
    assert "SAVE_TO_PYTORCH_BENCHMARK_FORMAT" not in env


# ------------------------------------------------------------------------------------------- logging at INFO

def test_engines_log_at_info_without_a_warning_when_nothing_is_set():
    env, warnings = engine_environment({}, arch="sm90", local_model=False, home=HOME)
    assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert "VLLM_CONFIGURE_LOGGING" not in env  # vLLM's default (1) configures its loggers
    assert warnings == []


def test_a_quieter_level_is_raised_to_info_with_a_warning():
    env, warnings = engine_environment({"VLLM_LOGGING_LEVEL": "WARNING"}, arch="sm90", local_model=False,
                                       home=HOME)
    assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert warnings == [
        "VLLM_LOGGING_LEVEL=WARNING is set, but kvgate reads the attention backend from the engine's INFO lines "
        "(\"Using ... backend.\"): kvgate sets VLLM_LOGGING_LEVEL=INFO for the engine processes"]


@pytest.mark.parametrize("level", ["INFO", "info", "DEBUG"])
def test_levels_that_write_the_info_lines_are_kept(level):
    env, warnings = engine_environment({"VLLM_LOGGING_LEVEL": level}, arch="cpu", local_model=True, home=HOME)
    assert env["VLLM_LOGGING_LEVEL"] == level
    assert warnings == []


def test_vllm_logging_switched_off_is_switched_back_on_with_a_warning():
    env, warnings = engine_environment({"VLLM_CONFIGURE_LOGGING": "0", "VLLM_LOGGING_LEVEL": "ERROR"},
                                       arch="sm90", local_model=False, home=HOME)
    assert (env["VLLM_CONFIGURE_LOGGING"], env["VLLM_LOGGING_LEVEL"]) == ("1", "INFO")
    assert warnings[1] == (
        "VLLM_CONFIGURE_LOGGING=0 is set, which turns vLLM's log lines off, but kvgate reads the attention backend "
        "from them: kvgate sets VLLM_CONFIGURE_LOGGING=1 for the engine processes")
