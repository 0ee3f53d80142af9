"""A paged K/V cache as vLLM's non-MLA GPU backends keep it, written by the backend's own vLLM cache op.

The layout, read off vLLM 0.26.0 (FLASH_ATTN, FLASHINFER, TRITON_ATTN and FLEX_ATTENTION agree):
``get_kv_cache_shape`` is the logical ``(num_blocks, num_kv_heads, block_size, 2 * head_size)``; with the
default "NHD" cache layout (``get_kv_cache_layout()`` without a KV connector or VLLM_KV_CACHE_LAYOUT) the
stride order ``(0, 2, 1, 3)`` puts it in memory as ``(num_blocks, block_size, num_kv_heads, 2 * head_size)``:
per token and KV head, head_size key values then head_size value values. Every backend views it as
``kv_cache.transpose(1, 2).split(head_size, dim=-1)``, so ``key_cache`` and ``value_cache`` are
``[num_blocks, block_size, num_kv_heads, head_size]`` with a row stride of ``2 * head_size``. An FP8 cache
is allocated as uint8 (vLLM's STR_DTYPE_TO_TORCH_DTYPE) and viewed as the FP8 dtype where a kernel
reads it.

`build_cache` allocates that tensor (unused slots hold random finite values of the stored dtype, so a
kernel reading past a request's length gets a wrong answer), writes the case's keys and values through
the callable the adapter passes (vLLM's own cache op, with ``kv_cache_dtype`` and the K/V scales as vLLM
passes them), and `PagedCache.read_back` gathers what was stored, dequantised, for the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvgate.kernels import fp8
from kvgate.kernels.adapters import KernelUnavailable, import_vllm
from kvgate.kernels.cases import AttentionInputs, PagedLayout, paged_layout

# write(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale): one of vLLM's cache ops
CacheWrite = Callable[..., None]


@dataclass(frozen=True, kw_only=True)
class PagedCache:
    physical: torch.Tensor  # [num_blocks, block_size, num_kv_heads, 2 * head_dim], bf16 or uint8
    layout: PagedLayout  # block table, seq lens and slots (CPU tensors)
    block_table: torch.Tensor  # the layout's block table on the device, int32
    seq_lens: torch.Tensor  # on the device, int32
    slot_mapping: torch.Tensor  # on the device, int64
    head_dim: int
    read_dtype: torch.dtype  # the dtype the kernel reads the cache as
    k_scale: float
    v_scale: float

    @property
    def logical(self) -> torch.Tensor:
        """The tensor a vLLM backend's forward receives: (num_blocks, num_kv_heads, block_size, 2 * head_dim)."""
        return self.physical.permute(0, 2, 1, 3)

    def views(self, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(key_cache, value_cache) as ``kv_cache.transpose(1, 2).split(head_dim, -1)``, viewed as `dtype`."""
        key_cache, value_cache = self.logical.transpose(1, 2).split(self.head_dim, dim=-1)
        if dtype is not None and dtype != key_cache.dtype:
            key_cache, value_cache = key_cache.view(dtype), value_cache.view(dtype)
        return key_cache, value_cache

    def read_back(self, *, dequantize: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per request [seq_len, kv_heads, head_dim] keys and values as stored, float32 (times the scales)."""
        key_cache, value_cache = self.views()  # gathered as stored (bf16 or uint8), then viewed as read
        page = self.layout.page_size
        keys, values = [], []
        for request in range(self.layout.seq_lens.shape[0]):
            slots = self.layout.slots_of(request).to(self.physical.device)
            blocks, offsets = slots // page, slots % page
            k = key_cache[blocks, offsets].view(self.read_dtype).float()
            v = value_cache[blocks, offsets].view(self.read_dtype).float()
            keys.append(k * self.k_scale if dequantize else k)
            values.append(v * self.v_scale if dequantize else v)
        return keys, values


def current_device() -> torch.device:
    """The device the adapters build on: the current CUDA device (one place, so a CPU dry run can swap it)."""
    return torch.device("cuda", torch.cuda.current_device())


def storage_dtype(kv_cache_dtype: str) -> torch.dtype:
    """The tensor dtype vLLM allocates the cache as: the model dtype (bf16), or uint8 for FP8."""
    return torch.uint8 if fp8.is_fp8(fp8.kv_torch_dtype(kv_cache_dtype)) else torch.bfloat16


def build_cache(inputs: AttentionInputs, device: torch.device, write: CacheWrite, *,
                read_dtype: torch.dtype, garbage: bool = True) -> PagedCache:
    """Allocate the cache, fill it with finite noise, and write the case's keys and values with `write`."""
    case = inputs.case
    layout = paged_layout(case.spec.kv_lens, case.page_size, seed=case.seed)
    shape = (layout.num_blocks, layout.page_size, case.num_kv_heads, 2 * case.head_dim)
    storage = storage_dtype(case.kv_cache_dtype)
    if garbage:
        generator = torch.Generator(device=device).manual_seed(case.seed + 2)
        noise = torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16)
        physical = noise.to(read_dtype).view(storage) if storage == torch.uint8 else noise
    else:
        physical = torch.zeros(shape, device=device, dtype=storage)
    cache = PagedCache(physical=physical, layout=layout, block_table=layout.block_table.to(device),
                       seq_lens=layout.seq_lens.to(device), slot_mapping=layout.slot_mapping.to(device),
                       head_dim=case.head_dim, read_dtype=read_dtype, k_scale=inputs.k_scale,
                       v_scale=inputs.v_scale)
    key = torch.cat(inputs.keys).to(device).contiguous()
    value = torch.cat(inputs.values).to(device).contiguous()
    k_scale = torch.tensor(inputs.k_scale, dtype=torch.float32, device=device)
    v_scale = torch.tensor(inputs.v_scale, dtype=torch.float32, device=device)
    write(key, value, *cache.views(), cache.slot_mapping, k_scale, v_scale)
    return cache


@dataclass(frozen=True, kw_only=True)
class PreparedPagedDecode:
    run: Callable[[], torch.Tensor]  # one launch; returns [batch, heads, head_dim]
    cache: PagedCache
    query: torch.Tensor  # the query the kernel reads, dequantised, float32 [batch, heads, head_dim]
    query_element_size: int  # bytes per query element as the kernel reads it (1 for FP8, 2 for bf16)
    provenance: str

    def read_back(self) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """(query, keys, values) as the kernel reads them, dequantised: what the reference computes on."""
        return (self.query, *self.cache.read_back())


def vllm_ops():
    """vllm._custom_ops (the CUDA cache op and scaled_fp8_quant) of the vLLM under test (VllmImportError when it does
    not import), or KernelUnavailable for a vLLM build without the CUDA cache op."""
    [ops] = import_vllm("vllm._custom_ops")
    if not hasattr(torch.ops, "_C_cache_ops") or not hasattr(torch.ops._C_cache_ops, "reshape_and_cache_flash"):
        raise KernelUnavailable("this vLLM has no CUDA cache op torch.ops._C_cache_ops.reshape_and_cache_flash "
                                "(not a CUDA build)")
    return ops


def cuda_cache_write(ops, kv_cache_dtype: str) -> CacheWrite:
    """vLLM's CUDA reshape_and_cache_flash, as FLASH_ATTN, FLASHINFER and FLEX_ATTENTION call it."""

    def write(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> None:
        ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                    k_scale, v_scale)

    return write


def quantize_query(ops, query: torch.Tensor, q_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 query, its dequantised float32 values): vLLM's static per-tensor QuantFP8 on CUDA.

    Attention.forward quantises the query with ``QuantFP8(static=True, group_shape=PER_TENSOR)``, whose CUDA
    path is ``ops.scaled_fp8_quant(x_2d, scale, group_shape=(-1, -1))``: fp8(x / q_scale) in
    current_platform.fp8_dtype() (e4m3), saturating.
    """
    batch = query.shape[0]
    scale = torch.tensor([q_scale], dtype=torch.float32, device=query.device)
    quantised, _ = ops.scaled_fp8_quant(query.reshape(batch, -1).contiguous(), scale, group_shape=(-1, -1))
    quantised = quantised.view(query.shape)
    return quantised, quantised.float() * q_scale
