"""What a running vLLM engine's attention layers really hold, read from the engine itself: the backends they
use, the KV cache they write (an FP8 cell whose cache holds 2-byte elements ran without FP8) and the k/v scales
they write and read it with (1.0 unless the checkpoint shipped scales or the engine computed them).

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


def layer_kv_cache_facts(model: Any) -> dict[str, Any]:
    """The attention layers' KV cache: the dtype they were built for and the tensors bound to them.

    vLLM keeps an FP8 cache in 1-byte tensors (torch.uint8, or a float8 dtype), a bf16/fp16 one in 2-byte tensors;
    `kv_cache` is a tensor or, in older releases, a list of them (one per virtual engine).
    """
    layer_dtypes: set[str] = set()
    tensor_dtypes: set[str] = set()
    element_bytes: set[int] = set()
    scales: dict[str, set[float]] = {"k_scales": set(), "v_scales": set()}
    layers = 0
    for module in model.modules():
        if getattr(module, "attn_backend", None) is None:
            continue
        layers += 1
        dtype = getattr(module, "kv_cache_dtype", None)
        if dtype is not None:
            layer_dtypes.add(str(dtype))
        for key, attribute in (("k_scales", "_k_scale_float"), ("v_scales", "_v_scale_float")):
            value = getattr(module, attribute, None)  # the scale the backend passes to its cache write and read
            if isinstance(value, (int, float)):
                scales[key].add(float(f"{float(value):.6g}"))
        caches = getattr(module, "kv_cache", None)
        for tensor in caches if isinstance(caches, (list, tuple)) else [caches]:
            if tensor is None or not hasattr(tensor, "element_size") or tensor.numel() == 0:
                continue
            tensor_dtypes.add(str(tensor.dtype).removeprefix("torch."))
            element_bytes.add(int(tensor.element_size()))
    return {"layers": layers, "layer_kv_cache_dtypes": sorted(layer_dtypes),
            "tensor_dtypes": sorted(tensor_dtypes), "element_bytes": sorted(element_bytes),
            **{key: sorted(values) for key, values in scales.items()}}


def worker_kv_cache_spec_facts(worker: Any) -> dict[str, Any]:
    """The KV cache the worker's engine laid out, from its own KV cache spec (`Worker.get_kv_cache_spec()`, vLLM's
    v1/kv_cache_interface.py: one spec per attention layer, `page_size_bytes` for `block_size` tokens): the bytes one
    token takes over all the attention layers, and the dtypes the specs hold. Unlike the cache's size in tokens,
    which is what the free memory at engine start allows, this depends only on the cache's layout: an FP8 cache
    takes about half the bytes of a bf16 one (vLLM's fp8_ds_mla 656 of 1,152 a layer). Runs in the worker
    (`LLM.collective_rpc`)."""
    from vllm.v1.kv_cache_interface import AttentionSpec

    per_token = 0.0
    dtypes: set[str] = set()
    layers = 0
    for spec in worker.get_kv_cache_spec().values():
        if not isinstance(spec, AttentionSpec) or not spec.block_size:
            continue  # e.g. a Mamba layer's state: per request, not per token
        layers += 1
        per_token += spec.page_size_bytes / spec.block_size
        dtypes.add(str(spec.dtype).removeprefix("torch."))
    return {"spec_layers": layers, "bytes_per_token": per_token, "spec_dtypes": sorted(dtypes)}


def engine_kv_cache_facts(llm: Any) -> dict[str, Any]:
    """Every worker's layer KV cache facts, merged; with the bytes per token of its KV cache spec (the largest of
    the workers': tensor-parallel ranks each hold their share) where the engine can say it."""
    listed = ("layer_kv_cache_dtypes", "tensor_dtypes", "element_bytes", "k_scales", "v_scales")
    merged: dict[str, Any] = {"layers": 0, **{key: set() for key in listed}}
    for per_worker in llm.apply_model(layer_kv_cache_facts):
        merged["layers"] += per_worker["layers"]
        for key in listed:
            merged[key].update(per_worker.get(key, ()))
    facts = {key: sorted(value) if isinstance(value, set) else value for key, value in merged.items()}
    try:
        specs = [s for s in llm.collective_rpc(worker_kv_cache_spec_facts) if s.get("spec_layers")]
    except Exception as error:  # an engine whose workers cannot say it: the gate then has no figure to judge
        print(f"kvgate: cannot ask the engine for its KV cache spec ({type(error).__name__}: {error})", flush=True)
        specs = []
    if specs:
        per_token = max(s["bytes_per_token"] for s in specs)
        facts["bytes_per_token"] = int(per_token) if float(per_token).is_integer() else round(per_token, 3)
        facts["spec_dtypes"] = sorted({d for s in specs for d in s["spec_dtypes"]})
    return facts
