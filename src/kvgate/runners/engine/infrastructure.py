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

ENGINE_UP_MARK = "kvgate: the engine's attention layers use"  # kvgate's accuracy worker, once the engine is up


def infrastructure_failure(log_text: str) -> str | None:
    """Why an engine start failed on the machine ("<what it means>: <root cause>"), or None: when its root cause
    is none of SIGNATURES, or when the log shows the engine came up (then the failure is the run's own)."""
    cause = failure_cause(log_text)
    if not cause or engine_came_up(log_text):
        return None
    for marker, meaning in SIGNATURES:
        if marker in cause:
            return f"{meaning}: {cause}"
    return None


def engine_came_up(log_text: str) -> bool:
    """The log shows an engine that allocated its KV cache or reported its attention layers."""
    return ENGINE_UP_MARK in log_text or bool(read_kv_cache_tokens(log_text))


def retry_header(reason: str) -> str:
    """The log's line before the second start."""
    return f"kvgate: once more (an infrastructure failure, not the cell's): {reason}"


def twice_failed_reason(reason: str) -> str:
    """The stage's reason when the second start failed on the machine too."""
    return (f"infrastructure: the engine failed to start twice on this machine, not because of the change "
            f"({reason})")
