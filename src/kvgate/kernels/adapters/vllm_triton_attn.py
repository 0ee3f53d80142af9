"""vLLM's unified Triton attention, the decode kernel of vLLM's TRITON_ATTN.

Family ``vllm_triton_attn``. Called as vllm/v1/attention/backends/triton_attn.py (vLLM 0.26.0) calls it for
a pure-decode batch with a per-tensor FP8 or bf16 cache:

- cache write ``triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
  kv_cache_dtype, k_scale, v_scale)`` (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py), the
  caches viewed as ``current_platform.fp8_dtype()`` for any FP8 kv_cache_dtype
  (``TritonAttentionImpl.do_kv_cache_update``);
- with an FP8 cache the layer quantises the query (``supports_quant_query_input`` is True on CUDA;
  ``QuantFP8`` static per-tensor with ``_q_scale``), so the kernel multiplies Q.K and P.V in FP8
  (``acc += tl.dot(P.to(V.dtype), V)``; family flag ``fp8_pv``);
- ``unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale,
  causal=True, window_size=(-1, -1), block_table, softcap=0, q_descale=layer._q_scale (FP8 query only),
  k_descale, v_descale (``layer._{k,v}_scale.expand((num_seqs, num_kv_heads))``), seq_threshold_3D,
  num_par_softmax_segments, softmax_segm_output, softmax_segm_max, softmax_segm_expsum,
  kv_quant_mode=get_kv_quant_mode(kv_cache_dtype))`` with the metadata builder's buffers
  (``seq_threshold_3D = MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads`` without full CUDA graphs,
  ``NUM_PAR_SOFTMAX_SEGMENTS`` segments of ``next_power_of_2(head_dim)``), so a small batch takes the 3D
  (split-softmax) kernel and a large one the 2D kernel.

FP8 needs SM89+ (``TritonAttentionImpl.__init__`` raises below). For ``fp8_e5m2`` this adapter does what the
backend's code does, which stores e4m3 bytes (test_attention_decode.py pins it).
"""

from __future__ import annotations

import torch

from kvgate.kernels.adapters import KernelUnavailable, import_vllm, paged_kv, require_capability
from kvgate.kernels.adapters.paged_kv import PreparedPagedDecode, build_cache, quantize_query, vllm_ops
from kvgate.kernels.cases import AttentionInputs


def _triton_attention():
    vllm, backend, unified, writer, interface, platforms = import_vllm(
        "vllm", "vllm.v1.attention.backends.triton_attn", "vllm.v1.attention.ops.triton_unified_attention",
        "vllm.v1.attention.ops.triton_reshape_and_cache_flash", "vllm.v1.kv_cache_interface", "vllm.platforms")
    return vllm, backend, unified, writer, interface, platforms.current_platform


def prepare(inputs: AttentionInputs, family: str, *, k_scale_error: float = 1.0) -> PreparedPagedDecode:
    """`k_scale_error` (negative controls only): the kernel is handed k_scale times this; the cache is not."""
    major, minor = require_capability("vLLM's Triton attention", (8, 9, 10, 11, 12), "SM80 and newer")
    case = inputs.case
    is_fp8 = case.kv_cache_dtype != "auto"
    if is_fp8 and (major, minor) < (8, 9):
        raise KernelUnavailable(f"FP8 KV in vLLM's Triton attention needs SM89+; this GPU is SM{major}{minor}")
    ops = vllm_ops()
    vllm, backend, unified, writer, interface, platform = _triton_attention()
    device = paged_kv.current_device()
    read_dtype = platform.fp8_dtype() if is_fp8 else torch.bfloat16

    def write(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> None:
        if is_fp8:
            key_cache, value_cache = key_cache.view(read_dtype), value_cache.view(read_dtype)
        writer.triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, case.kv_cache_dtype,
                                              k_scale, v_scale)

    cache = build_cache(inputs, device, write, read_dtype=read_dtype)
    key_cache, value_cache = cache.views(read_dtype)
    query = inputs.query.to(device)
    if is_fp8:
        query, reference_query = quantize_query(ops, query, inputs.q_scale)
    else:
        reference_query = query.float()
    batch = query.shape[0]
    descale_shape = (batch, case.num_kv_heads)
    q_descale = (torch.tensor(inputs.q_scale, dtype=torch.float32, device=device)
                 if is_fp8 and query.dtype == read_dtype else None)
    k_descale = torch.tensor(inputs.k_scale * k_scale_error, dtype=torch.float32, device=device).expand(descale_shape)
    v_descale = torch.tensor(inputs.v_scale, dtype=torch.float32, device=device).expand(descale_shape)
    seq_threshold_3d = backend.MIN_LAUNCH_GRID_SIZE_2D // case.num_kv_heads
    segments = backend.NUM_PAR_SOFTMAX_SEGMENTS
    padded = 1 << (case.head_dim - 1).bit_length()
    segm_output = torch.empty(seq_threshold_3d, case.num_heads, segments, padded, dtype=torch.float32, device=device)
    segm_max = torch.empty(seq_threshold_3d, case.num_heads, segments, dtype=torch.float32, device=device)
    segm_expsum = torch.empty(seq_threshold_3d, case.num_heads, segments, dtype=torch.float32, device=device)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device)
    max_seqlen_k = max(case.spec.kv_lens)
    quant_mode = interface.get_kv_quant_mode(case.kv_cache_dtype)
    out = torch.empty(batch, case.num_heads, case.head_dim, dtype=torch.bfloat16, device=device)

    def run() -> torch.Tensor:
        unified.unified_attention(
            q=query, k=key_cache, v=value_cache, out=out, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=1,
            seqused_k=cache.seq_lens, max_seqlen_k=max_seqlen_k, softmax_scale=inputs.scale, causal=True,
            alibi_slopes=None, window_size=(-1, -1), block_table=cache.block_table, softcap=0,
            q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, seq_threshold_3D=seq_threshold_3d,
            num_par_softmax_segments=segments, softmax_segm_output=segm_output, softmax_segm_max=segm_max,
            softmax_segm_expsum=segm_expsum, sinks=None, kv_quant_mode=quant_mode)
        return out

    kernel = "3D (split softmax)" if batch <= seq_threshold_3d else "2D"
    return PreparedPagedDecode(run=run, cache=cache, query=reference_query, query_element_size=query.element_size(),
                               provenance=f"vllm {vllm.__version__} triton_unified_attention.unified_attention "
                                          f"{kernel} kernel, kv_quant_mode={quant_mode.name}")
