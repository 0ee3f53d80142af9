"""vLLM's FlashAttention 3 build (vllm.vllm_flash_attn), the decode kernel of vLLM's FLASH_ATTN on SM90.

Family ``vllm_flash_attn``. Called as vllm/v1/attention/backends/flash_attn.py (vLLM 0.26.0) calls it for a
pure-decode batch (no cascade, no DCP, no sliding window, no sinks):

- the cache is written by ``vllm._custom_ops.reshape_and_cache_flash(key, value, key_cache, value_cache,
  slot_mapping, kv_cache_dtype, k_scale, v_scale)`` on the uint8 (FP8) or bf16 cache
  (``FlashAttentionImpl.do_kv_cache_update``);
- with an FP8 cache the layer quantises the query first (``Attention.forward``: ``QuantFP8`` static
  per-tensor with ``_q_scale``; ``FlashAttentionImpl.supports_quant_query_input`` is True on CUDA), and the
  forward views key/value caches as ``current_platform.fp8_dtype()``;
- the metadata builder plans with ``get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k,
  num_heads_q, num_heads_kv, headdim, cache_seqlens, qkv_dtype, cu_seqlens_q, page_size, causal,
  window_size, num_splits)`` when the FA version is 3 (``aot_schedule``), ``qkv_dtype`` fp8 for an FP8 cache;
- the forward calls ``flash_attn_varlen_func(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k,
  max_seqlen_k, softmax_scale, causal=True, alibi_slopes=None, window_size=[-1, -1], block_table,
  softcap=0, scheduler_metadata, fa_version, q_descale, k_descale, v_descale, num_splits=0)`` with the
  descales ``layer._{q,k,v}_scale.expand((num_seqs, num_kv_heads))`` (passed for a bf16 cache too, all 1.0).

The FA version comes from vLLM's own ``fa_utils.get_flash_attn_version(head_size=...)``; on SM90 it must
be 3 (FP8 KV needs FA3, ``FlashAttentionBackend.supports_kv_cache_dtype``), otherwise `KernelMismatch`.
FA3 FP8 multiplies P.V in FP8 (family flag ``fp8_pv``; tolerance.FP8_PV).
"""

from __future__ import annotations

import torch

from kvgate.kernels import fp8
from kvgate.kernels.adapters import (
    KernelMismatch,
    KernelUnavailable,
    import_vllm,
    paged_kv,
    require_capability,
)
from kvgate.kernels.adapters.paged_kv import (
    PreparedPagedDecode,
    build_cache,
    cuda_cache_write,
    quantize_query,
    vllm_ops,
)
from kvgate.kernels.cases import AttentionInputs

FA_VERSION = 3


def _flash_attn():
    vllm, fa_utils, interface = import_vllm("vllm", "vllm.v1.attention.backends.fa_utils", "vllm.vllm_flash_attn")
    return vllm, fa_utils, interface


def prepare(inputs: AttentionInputs, family: str, *, k_scale_error: float = 1.0) -> PreparedPagedDecode:
    """`k_scale_error` (negative controls only): the kernel is handed k_scale times this; the cache is not."""
    require_capability("vLLM's FlashAttention 3 (vllm.vllm_flash_attn)", (9,), "SM90")
    ops = vllm_ops()
    vllm, fa_utils, interface = _flash_attn()
    case = inputs.case
    version = fa_utils.get_flash_attn_version(head_size=case.head_dim)
    if version != FA_VERSION:
        reason = interface.fa_version_unsupported_reason(FA_VERSION)
        raise KernelMismatch(f"vLLM {vllm.__version__} resolves FlashAttention version {version} for head size "
                             f"{case.head_dim} on this SM90 GPU; FLASH_ATTN runs FA3 here (FA3: {reason or 'ok'})")
    device = paged_kv.current_device()
    kv_dtype = fp8.kv_torch_dtype(case.kv_cache_dtype)
    is_fp8 = fp8.is_fp8(kv_dtype)
    if is_fp8 and kv_dtype != torch.float8_e4m3fn:
        raise KernelUnavailable(f"vLLM's FLASH_ATTN takes fp8/fp8_e4m3 KV only, not {case.kv_cache_dtype}")
    cache = build_cache(inputs, device, cuda_cache_write(ops, case.kv_cache_dtype), read_dtype=kv_dtype)
    key_cache, value_cache = cache.views(kv_dtype)
    query = inputs.query.to(device)
    if is_fp8:
        query, reference_query = quantize_query(ops, query, inputs.q_scale)
    else:
        reference_query = query.float()
    batch = query.shape[0]
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device)
    max_seqlen_k = max(case.spec.kv_lens)
    scheduler_metadata = interface.get_scheduler_metadata(
        batch_size=batch, max_seqlen_q=1, max_seqlen_k=max_seqlen_k, num_heads_q=case.num_heads,
        num_heads_kv=case.num_kv_heads, headdim=case.head_dim, cache_seqlens=cache.seq_lens,
        qkv_dtype=kv_dtype, cu_seqlens_q=cu_seqlens_q, page_size=case.page_size, causal=True,
        window_size=(-1, -1), num_splits=0)
    descale_shape = (batch, case.num_kv_heads)
    q_descale = torch.tensor(inputs.q_scale, dtype=torch.float32, device=device).expand(descale_shape)
    k_descale = torch.tensor(inputs.k_scale * k_scale_error, dtype=torch.float32, device=device).expand(descale_shape)
    v_descale = torch.tensor(inputs.v_scale, dtype=torch.float32, device=device).expand(descale_shape)
    out = torch.empty(batch, case.num_heads, case.head_dim, dtype=torch.bfloat16, device=device)

    def run() -> torch.Tensor:
        interface.flash_attn_varlen_func(
            q=query, k=key_cache, v=value_cache, out=out, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=1,
            seqused_k=cache.seq_lens, max_seqlen_k=max_seqlen_k, softmax_scale=inputs.scale, causal=True,
            alibi_slopes=None, window_size=[-1, -1], block_table=cache.block_table, softcap=0,
            scheduler_metadata=scheduler_metadata, fa_version=version, q_descale=q_descale,
            k_descale=k_descale, v_descale=v_descale, num_splits=0)
        return out

    return PreparedPagedDecode(run=run, cache=cache, query=reference_query, query_element_size=query.element_size(),
                               provenance=f"vllm {vllm.__version__} vllm_flash_attn.flash_attn_varlen_func "
                                          f"fa_version={version}")
