"""vLLM's FlashAttention 3 MLA decode (vllm.vllm_flash_attn with q_v), the kernel of vLLM's FLASH_ATTN_MLA.

Family ``vllm_flash_attn_mla``, bf16 cache only: vLLM 0.26.0's FlashAttnMLAImpl raises "FlashAttnMLA V1
with FP8 KV cache not yet supported" and the backend declares auto/float16/bfloat16. Called as
vllm/v1/attention/backends/mla/flashattn_mla.py calls it:

- ``get_scheduler_metadata(batch_size, max_seqlen_q=1, max_seqlen_k, num_heads_q=heads, num_heads_kv=1,
  headdim=qk_rope_head_dim (64), cache_seqlens, qkv_dtype=bf16, headdim_v=kv_lora_rank (512), page_size,
  cu_seqlens_q, causal=True, num_splits=0)`` (``_schedule_decode``, when the FA version is 3);
- ``flash_attn_varlen_func(q=q_pe, k=k_pe_cache.unsqueeze(-2), v=kv_c_cache.unsqueeze(-2), q_v=q_nope,
  max_seqlen_q=1, cu_seqlens_q, max_seqlen_k, seqused_k, block_table, softmax_scale, causal=True,
  return_softmax_lse=False, fa_version=3, scheduler_metadata, num_splits=0)`` (``forward_mqa``), the
  caches being the last-dim slices ``[..., :512]`` and ``[..., 512:]`` of the latent cache.

FA3 MLA needs SM90 (``flash_attn_supports_mla``); on an SM90 GPU where vLLM says no, `KernelMismatch`.
"""

from __future__ import annotations

import torch

from kvgate.kernels.adapters import (
    KernelMismatch,
    KernelUnavailable,
    PreparedDecode,
    import_vllm,
    require_capability,
)
from kvgate.kernels.cases import DecodeInputs


def _flash_attn():
    vllm, fa_utils, interface = import_vllm("vllm", "vllm.v1.attention.backends.fa_utils", "vllm.vllm_flash_attn")
    return vllm, fa_utils, interface


def prepare(inputs: DecodeInputs, family: str) -> PreparedDecode:
    require_capability("vLLM's FlashAttention 3 MLA decode", (9,), "SM90")
    if inputs.is_fp8:
        raise KernelUnavailable("vLLM's FLASH_ATTN_MLA has no FP8 KV path (FlashAttnMLAImpl raises)")
    if inputs.cache.page_size % 16:
        raise KernelUnavailable(f"FLASH_ATTN_MLA takes block sizes that are multiples of 16, not "
                                f"{inputs.cache.page_size}")
    vllm, fa_utils, interface = _flash_attn()
    if not fa_utils.flash_attn_supports_mla():
        raise KernelMismatch(f"vLLM {vllm.__version__}: flash_attn_supports_mla() is False on this SM90 GPU "
                             f"(FA3: {interface.fa_version_unsupported_reason(3) or 'ok'})")
    cache = inputs.cache
    rank = cache.kv_lora_rank
    query = inputs.query
    batch, heads, _ = query.shape
    device = query.device
    q_nope, q_pe = query[..., :rank], query[..., rank:]
    kv_c_cache = cache.kv[..., :rank].unsqueeze(-2)
    k_pe_cache = cache.kv[..., rank:].unsqueeze(-2)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device)
    max_seqlen_k = inputs.max_seq_len()
    scheduler_metadata = None
    if fa_utils.get_flash_attn_version() == 3:  # FlashAttnMLAMetadataBuilder.fa_aot_schedule
        scheduler_metadata = interface.get_scheduler_metadata(
            batch_size=batch, max_seqlen_q=1, max_seqlen_k=max_seqlen_k, num_heads_q=heads, num_heads_kv=1,
            headdim=cache.rope_dim, cache_seqlens=cache.seq_lens, qkv_dtype=cache.kv.dtype, headdim_v=rank,
            page_size=cache.page_size, cu_seqlens_q=cu_seqlens_q, causal=True, num_splits=0)

    def run() -> torch.Tensor:
        return interface.flash_attn_varlen_func(
            q=q_pe, k=k_pe_cache, v=kv_c_cache, q_v=q_nope, max_seqlen_q=1, cu_seqlens_q=cu_seqlens_q,
            max_seqlen_k=max_seqlen_k, seqused_k=cache.seq_lens, block_table=cache.block_table,
            softmax_scale=inputs.sm_scale, causal=True, return_softmax_lse=False, fa_version=3,
            scheduler_metadata=scheduler_metadata, num_splits=0)

    return PreparedDecode(run=run, provenance=f"vllm {vllm.__version__} vllm_flash_attn.flash_attn_varlen_func "
                                              "fa_version=3 (q_v, MLA)")
