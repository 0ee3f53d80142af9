"""vLLM's FlashMLA dense decode (vllm._flashmla_C / _flashmla_extension_C), the kernel of vLLM's FLASHMLA.

Family ``vllm_flashmla``. Called as vllm/v1/attention/backends/mla/flashmla.py (vLLM 0.26.0) calls it, from
vllm/v1/attention/ops/flashmla.py:

- bf16 cache: ``get_mla_metadata(seq_lens, num_q_tokens_per_head_k=heads, 1, is_fp8_kvcache=False)`` (an
  empty ``FlashMLASchedMeta``, filled by the first call) and ``flash_mla_with_kvcache(q=[batch, 1, heads,
  576] bf16, k_cache=kv.unsqueeze(-2), block_table, cache_seqlens, head_dim_v=512,
  tile_scheduler_metadata, softmax_scale, causal=True, is_fp8_kvcache=False)``;
- FP8 cache: ``get_mla_metadata_dense_fp8(seq_lens, heads, 1)`` -> (tile_scheduler_metadata, num_splits)
  and ``flash_mla_with_kvcache_fp8(q, k_cache, block_table, cache_seqlens, head_dim_v=512,
  tile_scheduler_metadata, num_splits, softmax_scale, causal=True, descale_q=layer._q_scale.reshape(1),
  descale_k=layer._k_scale.reshape(1))``. The query is FP8 there: MLACommonImpl sets
  ``supports_quant_query_input = True`` and FlashMLAImpl keeps it, so MLAAttention quantises the decode
  query (``_DecodeConcatQuantFP8``: static per-tensor with ``_q_scale``) before ``forward_mqa``. The
  latent cache is vLLM's standard FP8 MLA format (576 e4m3 values per token, one scale; not fp8_ds_mla).

Page (block) size 64 only (``FlashMLABackend.get_supported_kernel_block_sizes``). Dense FlashMLA is
Hopper-only (``is_flashmla_dense_supported``); on an SM90 GPU whose vLLM lacks it, `KernelMismatch`.

What the FP8 kernel computes (vllm-project/FlashMLA csrc/extension/sm90/dense_fp8, last changed 2025-10-19,
FlashMLA PR 54; built into vLLM's ``_flashmla_extension_C``): it is instantiated for
``<cutlass::float_e4m3_t, cutlass::bfloat16_t, 576>`` (flash_fwd_mla_fp8_sm90.cu:9), so ``Element`` is e4m3
(flash_fwd_mla_kernel.h:55 ``Is_FP8``). Q.K is an e4m3 x e4m3 WGMMA into float (``TiledMma``, :76-79; the
gemm at :353); the softmax weights exp2(s*scale - running max) are converted to e4m3 (``tOrP =
make_tensor_like<Element>``, ``convert_type_out``, :383-385) and P.V is an e4m3 x e4m3 WGMMA (``TiledMmaO``,
:82-85; :398) while the row sum is taken on the unrounded float weights (softmax.h:157-176).
``descale_q * descale_k`` folds into the softmax scale (:569-572) and the output is multiplied by
``descale_k / row_sum`` (softmax.h:182-192). So the kernel reads the FP8 query (the reference takes it
dequantised: ``PreparedDecode.reference_query``) and the FP8 cache (the reference reads it dequantised),
and its own error is the e4m3 rounding of P: this family is ``fp8_pv`` and judged by tolerance.FP8_PV.
The CPU model of that rounding (reference.mla_decode(round_p_to=e4m3)) reproduces the H200's 2026-12-01
figures: max |err| 0.0421 / 0.0577 / 0.0332 / 0.062 and 21 / 343 / 8 / 333 elements outside
tolerance.FP8's 2e-2 (measured: the same maxima, 21 / 339 / 8 / 333) for ragged_short / ragged_long x
heads 16 / 128; rel-L2 0.0092-0.0123 modelled, 0.0088-0.0110 measured (the kernel's running max rounds
larger weights than the model's global max).
"""

from __future__ import annotations

import torch

from kvgate.kernels import fp8
from kvgate.kernels.adapters import (
    KernelMismatch,
    KernelUnavailable,
    PreparedDecode,
    import_vllm,
    require_capability,
)
from kvgate.kernels.adapters.paged_kv import quantize_query, vllm_ops
from kvgate.kernels.cases import DecodeInputs

PAGE_SIZES = (64,)


def _flashmla():
    vllm, ops = import_vllm("vllm", "vllm.v1.attention.ops.flashmla")
    return vllm, ops


def prepare(inputs: DecodeInputs, family: str) -> PreparedDecode:
    require_capability("vLLM's dense FlashMLA decode", (9,), "SM90")
    if inputs.cache.page_size not in PAGE_SIZES:
        raise KernelUnavailable(f"FLASHMLA takes block size {PAGE_SIZES}, not {inputs.cache.page_size}")
    if inputs.is_fp8 and inputs.kv_dtype != torch.float8_e4m3fn:
        raise KernelUnavailable(f"FLASHMLA takes fp8/fp8_e4m3 KV only, not {inputs.kv_dtype}")
    vllm, ops = _flashmla()
    supported, reason = ops.is_flashmla_dense_supported()
    if not supported:
        raise KernelMismatch(f"vLLM {vllm.__version__} says dense FlashMLA is not supported on this SM90 GPU: {reason}")
    query = inputs.query  # [batch, heads, 576] bf16
    batch, heads, _ = query.shape
    device = query.device
    cache = inputs.cache
    k_cache = cache.kv.unsqueeze(-2)  # [pages, 64, 1, 576]
    rank = cache.kv_lora_rank
    if inputs.is_fp8:
        q_scale = fp8.per_tensor_scale(query, dtype=torch.float8_e4m3fn)
        q_fp8, reference = quantize_query(vllm_ops(), query, q_scale)
        q = q_fp8.unsqueeze(1)  # [batch, 1, heads, 576]
        tile_scheduler_metadata, num_splits = ops.get_mla_metadata_dense_fp8(cache.seq_lens, heads, 1)
        descale_q = torch.tensor([q_scale], dtype=torch.float32, device=device)
        descale_k = torch.tensor([cache.scale], dtype=torch.float32, device=device)

        def run() -> torch.Tensor:
            out, _ = ops.flash_mla_with_kvcache_fp8(
                q=q, k_cache=k_cache, block_table=cache.block_table, cache_seqlens=cache.seq_lens, head_dim_v=rank,
                tile_scheduler_metadata=tile_scheduler_metadata, num_splits=num_splits,
                softmax_scale=inputs.sm_scale, causal=True, descale_q=descale_q, descale_k=descale_k)
            return out.view(batch, heads, rank)

        kernel = "flash_mla_with_kvcache_fp8"
    else:
        reference = None
        q = query.unsqueeze(1)
        sched_meta, _ = ops.get_mla_metadata(cache.seq_lens, heads, 1, is_fp8_kvcache=False)

        def run() -> torch.Tensor:
            out, _ = ops.flash_mla_with_kvcache(
                q=q, k_cache=k_cache, block_table=cache.block_table, cache_seqlens=cache.seq_lens, head_dim_v=rank,
                tile_scheduler_metadata=sched_meta, softmax_scale=inputs.sm_scale, causal=True,
                is_fp8_kvcache=False)
            return out.view(batch, heads, rank)

        kernel = "flash_mla_with_kvcache"
    return PreparedDecode(run=run, provenance=f"vllm {vllm.__version__} v1.attention.ops.flashmla.{kernel}",
                          reference_query=reference)
