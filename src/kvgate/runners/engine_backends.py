"""The attention backends a running vLLM engine's layers really use, read from the engine itself.

`vllm.LLM.apply_model(fn)` runs fn on the model inside each worker process; vLLM pickles fn there, which
its V1 multiprocess engine allows only with VLLM_ALLOW_INSECURE_SERIALIZATION=1 (set by the accuracy
worker for its own engine; the function is imported by reference, from this module).
"""

from __future__ import annotations

from typing import Any

INSECURE_SERIALIZATION_VARIABLE = "VLLM_ALLOW_INSECURE_SERIALIZATION"


def layer_backend_names(model: Any) -> list[str]:
    """Names (`get_name()`) of the backend classes the model's attention layers hold (`.attn_backend`)."""
    names = set()
    for module in model.modules():
        backend = getattr(module, "attn_backend", None)
        if backend is not None and hasattr(backend, "get_name"):
            names.add(str(backend.get_name()))
    return sorted(names)


def engine_backend_names(llm: Any) -> list[str]:
    """Every worker's layer backends, merged (one worker on CPU; tensor-parallel ranks on GPUs)."""
    names: set[str] = set()
    for per_worker in llm.apply_model(layer_backend_names):
        names.update(per_worker)
    return sorted(names)
