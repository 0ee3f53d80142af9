"""The environment an engine subprocess runs in. Pure: a base environment in, (environment, warnings) out."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

IGNORED_BACKEND_VARIABLE = "VLLM_ATTENTION_BACKEND"
MODEL_DIR_VARIABLE = "KVGATE_MODEL_DIR"
CPU_KV_CACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE: the tiny models need little; the machine is shared


def default_cache_root(home: Path) -> Path:
    """Where vLLM keeps its torch.compile cache between runs (engine start ~50 s -> ~25 s on CPU)."""
    return home / ".cache" / "kvgate" / "vllm"


def engine_environment(base: Mapping[str, str], *, arch: str, local_model: bool,
                       home: Path) -> tuple[dict[str, str], list[str]]:
    env = dict(base)
    warnings: list[str] = []
    if IGNORED_BACKEND_VARIABLE in env:
        value = env.pop(IGNORED_BACKEND_VARIABLE)
        warnings.append(
            f"{IGNORED_BACKEND_VARIABLE}={value} is set, but vLLM >= 0.26 ignores it silently (vllm issue "
            f"50292): kvgate unsets it for the run and selects each cell's backend with the engine "
            f"argument attention_backend")
    # vLLM writes a second, PyTorch-benchmark-format *.json beside --output-json when this is set; the
    # results contract wants exactly one *.json per throughput repeat.
    env.pop("SAVE_TO_PYTORCH_BENCHMARK_FORMAT", None)
    if arch == "cpu":  # the embedded default; GPU runners keep vLLM's own cache place and KV sizing
        env.setdefault("VLLM_CACHE_ROOT", str(default_cache_root(home)))
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
    if local_model:  # kvgate's own models and data: nothing to fetch, so never wait on the hub
        env["HF_HUB_OFFLINE"] = "1"
        env["HF_DATASETS_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"  # the engine's output reaches the terminal and the log as it happens
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env, warnings
