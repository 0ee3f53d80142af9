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


def test_user_settings_win_and_gpu_runs_stay_online():
    env, _ = engine_environment({"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CACHE_ROOT": "/c"}, arch="cpu",
                                local_model=False, home=HOME)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["VLLM_CACHE_ROOT"] == "/c"
    assert "HF_HUB_OFFLINE" not in env
    gpu, _ = engine_environment({}, arch="sm100", local_model=False, home=HOME)
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu
    assert "VLLM_CACHE_ROOT" not in gpu


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
