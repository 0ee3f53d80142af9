"""vLLM's FLEX_ATTENTION decode: FlexAttentionImpl.forward over torch's flex_attention, bf16 cache only.

Family ``vllm_flex_attn``. vLLM 0.26.0's backend (vllm/v1/attention/backends/flex_attention.py) refuses a
quantised cache (``FlexAttentionImpl.__init__``: "FlexAttention does not support quantized kv-cache"), so
only ``auto`` is tested. This adapter runs vLLM's own code, not a re-implementation of it:

- ``FlexAttentionImpl(num_heads, head_size, scale, num_kv_heads, alibi_slopes=None, sliding_window=None,
  kv_cache_dtype="auto")``, its cache written as ``do_kv_cache_update`` does
  (``torch.ops._C_cache_ops.reshape_and_cache_flash`` through vllm._custom_ops);
- a ``FlexAttentionMetadata`` filled as ``FlexAttentionMetadataBuilder.build`` fills it for a decode batch
  (causal, ``physical_to_logical_mapping(block_table, seq_lens, block_size, num_gpu_blocks)``,
  ``decode_offset = seq_lens - query_lens``, direct build with q_block_size 16 and kv_block_size equal to
  the cache block size on torch >= 2.9, persistent index buffers sized for this batch) and its block mask
  built with ``_build_block_mask_direct()`` as the builder does before CUDA-graph capture;
- ``impl.forward(layer, query, key, value, kv_cache, attn_metadata, output)``, which calls
  ``torch.compile(flex_attention, fullgraph=True)`` with ``kernel_options`` from ``get_kernel_options``.

The first forward compiles (Inductor + Triton, tens of seconds); `prepare` runs it once and keeps the
warnings that compilation raises in the provenance rather than failing on them.
"""

from __future__ import annotations

import warnings

import torch

from kvgate.kernels.adapters import KernelUnavailable, import_vllm, paged_kv, require_capability
from kvgate.kernels.adapters.paged_kv import PreparedPagedDecode, build_cache, cuda_cache_write, vllm_ops
from kvgate.kernels.cases import AttentionInputs

Q_BLOCK_SIZE = 16  # FlexAttentionMetadataBuilder._get_block_sizes with small blocks supported (torch >= 2.9)


class _Layer(torch.nn.Module):
    """Stands in for the Attention layer: forward only reads optional mask hooks from it (none here)."""


def _flex():
    vllm, flex = import_vllm("vllm", "vllm.v1.attention.backends.flex_attention")
    return vllm, flex


def prepare(inputs: AttentionInputs, family: str) -> PreparedPagedDecode:
    require_capability("vLLM's FlexAttention", (8, 9, 10, 11, 12), "SM80 and newer")
    case = inputs.case
    if case.kv_cache_dtype != "auto":
        raise KernelUnavailable(f"vLLM's FLEX_ATTENTION refuses a quantised cache ({case.kv_cache_dtype})")
    ops = vllm_ops()
    vllm, flex = _flex()
    if not flex.is_torch_equal_or_newer("2.9.0.dev0"):
        raise KernelUnavailable(f"torch {torch.__version__}: vLLM's FlexAttention direct block-mask build needs "
                                "torch >= 2.9")
    device = paged_kv.current_device()
    cache = build_cache(inputs, device, cuda_cache_write(ops, "auto"), read_dtype=torch.bfloat16)
    layout = cache.layout
    batch, page = len(case.spec.kv_lens), layout.page_size
    max_seq_len = max(case.spec.kv_lens)
    impl = flex.FlexAttentionImpl(num_heads=case.num_heads, head_size=case.head_dim, scale=inputs.scale,
                                  num_kv_heads=case.num_kv_heads, alibi_slopes=None, sliding_window=None,
                                  kv_cache_dtype="auto")
    query_start_loc_cpu = torch.arange(batch + 1, dtype=torch.int32)
    query_start_loc = query_start_loc_cpu.to(device)
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    query_groups = -(-batch // Q_BLOCK_SIZE)
    metadata = flex.FlexAttentionMetadata(
        causal=True, logical_mask_mod=flex.causal_mask_mod, sliding_window=None, num_actual_tokens=batch,
        max_query_len=1, query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc_cpu,
        max_seq_len=max_seq_len, seq_lens=cache.seq_lens, block_table=cache.block_table,
        slot_mapping=cache.slot_mapping, use_cascade=False, common_prefix_len=0, cu_prefix_query_lens=None,
        prefix_kv_lens=None, suffix_kv_lens=None, block_size=page, max_possible_sequence_length=max_seq_len,
        num_reqs=batch,
        physical_to_logical=flex.physical_to_logical_mapping(cache.block_table, cache.seq_lens, page,
                                                             layout.num_blocks),
        total_cache_tokens=layout.num_blocks * page, decode_offset=cache.seq_lens - query_lens,
        num_blocks_per_seq=(cache.seq_lens + page - 1) // page, uses_paged_kv=True, direct_build=True,
        q_block_size=Q_BLOCK_SIZE, kv_block_size=page,
        persistent_kv_indices=torch.empty(query_groups, Q_BLOCK_SIZE * -(-max_seq_len // page), dtype=torch.int32,
                                          device=device),
        persistent_kv_num_blocks=torch.empty(query_groups, dtype=torch.int32, device=device),
        persistent_doc_ids=torch.empty(batch, dtype=torch.int32, device=device),
        mm_prefix_range=None, rswa_prefix_lens=None, rswa_window=None)
    metadata.block_mask = metadata._build_block_mask_direct()
    query = inputs.query.to(device)
    out = torch.empty(query.shape, dtype=torch.bfloat16, device=device)
    layer = _Layer()

    def run() -> torch.Tensor:
        return impl.forward(layer, query, None, None, cache.logical, metadata, out)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()  # compiles
    provenance = f"vllm {vllm.__version__} FlexAttentionImpl.forward (torch {torch.__version__} flex_attention)"
    compiled = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    if compiled:
        provenance += f" (compile warnings: {'; '.join(compiled)})"
    return PreparedPagedDecode(run=run, cache=cache, query=query.float(), query_element_size=2,
                               provenance=provenance)
