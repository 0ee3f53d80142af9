"""Named decode shapes and the inputs built from them (seeded, identical on every device).

A `DecodeCase` is one accuracy test: a batch spec (ragged KV lengths), a head count, a page size and
a kv_cache_dtype. `make_inputs` builds the bf16 query, the paged latent cache in the cell's storage
dtype (bf16, or FP8 with a per-tensor scale) and the float32 values it was made from.
`BENCH_SPECS` are the speed shapes of ../shared/facts/h200.md (batch x heads x kv len, page 64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvgate.kernels import fp8
from kvgate.kernels.reference import PagedLatentCache, page_requests

KV_LORA_RANK = 512
ROPE_DIM = 64
QK_NOPE_HEAD_DIM = 128  # DeepSeek-V2/V3: the softmax scale is 1/sqrt(qk_nope + rope) = 1/sqrt(192)
SM_SCALE = 1.0 / math.sqrt(QK_NOPE_HEAD_DIM + ROPE_DIM)


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchSpec:
    name: str
    kv_lens: tuple[int, ...]
    gpu_only: bool = False  # too long for the CPU kernels and the CPU reference in CI


BATCH_SPECS = {
    spec.name: spec
    for spec in (
        BatchSpec(name="one_token", kv_lens=(1,)),
        BatchSpec(name="ragged_short", kv_lens=(1, 7, 33, 64, 65, 130, 257)),
        BatchSpec(name="ragged_long", kv_lens=(1024, 8192, 3001, 4113, 5, 6000, 2048, 7777), gpu_only=True),
    )
}
HEAD_COUNTS = (16, 128)
PAGE_SIZES = (1, 32, 64)


@dataclass(frozen=True, kw_only=True, slots=True)
class DecodeCase:
    spec: BatchSpec
    num_heads: int
    page_size: int
    kv_cache_dtype: str  # vLLM's name: auto | fp8 | fp8_e4m3 | fp8_e5m2
    seed: int = 0

    @property
    def id(self) -> str:
        return f"{self.spec.name}-h{self.num_heads}-p{self.page_size}-{self.kv_cache_dtype}"


@dataclass(frozen=True, kw_only=True)
class DecodeInputs:
    case: DecodeCase
    query: torch.Tensor  # [batch, heads, kv_lora_rank + rope_dim], bf16
    cache: PagedLatentCache  # storage dtype of the case (bf16 or fp8 + scale)
    exact_cache: PagedLatentCache  # float32 values before any rounding to the storage dtype
    sm_scale: float = SM_SCALE

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.cache.kv.dtype

    @property
    def is_fp8(self) -> bool:
        return fp8.is_fp8(self.kv_dtype)

    @property
    def scales(self) -> fp8.VllmMlaScales:
        return fp8.VllmMlaScales(sm_scale=self.sm_scale, k_scale=self.cache.scale)

    def max_seq_len(self) -> int:
        return int(self.cache.seq_lens.max())


def make_inputs(case: DecodeCase, device: torch.device | str = "cpu") -> DecodeInputs:
    """Seeded on the CPU, then moved: the same case gives the same values on any device."""
    generator = torch.Generator().manual_seed(case.seed)
    rows = [torch.randn(n, KV_LORA_RANK + ROPE_DIM, generator=generator) for n in case.spec.kv_lens]
    exact = page_requests(rows, page_size=case.page_size, kv_lora_rank=KV_LORA_RANK, generator=generator)
    query = torch.randn(len(rows), case.num_heads, KV_LORA_RANK + ROPE_DIM, generator=generator)
    stored = exact.quantized(fp8.kv_torch_dtype(case.kv_cache_dtype))
    return DecodeInputs(case=case, query=query.to(torch.bfloat16).to(device),
                        cache=_to(stored, device), exact_cache=_to(exact, device))


def _to(cache: PagedLatentCache, device: torch.device | str) -> PagedLatentCache:
    return PagedLatentCache(kv=cache.kv.to(device), block_table=cache.block_table.to(device),
                            seq_lens=cache.seq_lens.to(device), kv_lora_rank=cache.kv_lora_rank, scale=cache.scale)


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchSpec:
    name: str
    batch: int
    num_heads: int
    kv_len: int
    page_size: int = 64


BENCH_SPECS = {
    spec.name: spec
    for spec in (
        BenchSpec(name="b32-h128-kv8192", batch=32, num_heads=128, kv_len=8192),
        BenchSpec(name="b128-h16-kv4096", batch=128, num_heads=16, kv_len=4096),
        BenchSpec(name="b64-h128-kv2048", batch=64, num_heads=128, kv_len=2048),
    )
}


def make_bench_inputs(spec: BenchSpec, kv_cache_dtype: str, device: torch.device | str) -> DecodeInputs:
    """Uniform lengths, pages in order, values drawn on the device (big shapes; accuracy is not checked)."""
    generator = torch.Generator(device=device).manual_seed(1)
    pages_per_request = -(-spec.kv_len // spec.page_size)
    num_pages = spec.batch * pages_per_request
    width = KV_LORA_RANK + ROPE_DIM
    values = torch.randn(num_pages, spec.page_size, width, generator=generator, device=device)
    dtype = fp8.kv_torch_dtype(kv_cache_dtype)
    scale = fp8.per_tensor_scale(values, dtype=dtype) if fp8.is_fp8(dtype) else 1.0
    kv = fp8.quantize(values, scale, dtype) if fp8.is_fp8(dtype) else values.to(dtype)
    del values
    block_table = torch.arange(num_pages, dtype=torch.int32, device=device).view(spec.batch, pages_per_request)
    seq_lens = torch.full((spec.batch,), spec.kv_len, dtype=torch.int32, device=device)
    cache = PagedLatentCache(kv=kv, block_table=block_table, seq_lens=seq_lens, kv_lora_rank=KV_LORA_RANK,
                             scale=scale)
    query = torch.randn(spec.batch, spec.num_heads, width, generator=generator, device=device).to(torch.bfloat16)
    case = DecodeCase(spec=BatchSpec(name=spec.name, kv_lens=(spec.kv_len,) * spec.batch, gpu_only=True),
                      num_heads=spec.num_heads, page_size=spec.page_size, kv_cache_dtype=kv_cache_dtype)
    return DecodeInputs(case=case, query=query, cache=cache, exact_cache=cache)


def bytes_moved(inputs: DecodeInputs) -> int:
    """The least HBM traffic of one decode: each request's cached rows once, the query, the output."""
    row_bytes = inputs.cache.kv.shape[-1] * inputs.cache.kv.element_size()
    cached = int(inputs.cache.seq_lens.sum()) * row_bytes
    batch, heads, width = inputs.query.shape
    return cached + batch * heads * width * inputs.query.element_size() + batch * heads * KV_LORA_RANK * 2


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionCase:
    """A non-MLA (grouped-query) decode case: the CPU_ATTN family."""

    spec: BatchSpec
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    kv_cache_dtype: str
    seed: int = 0

    @property
    def id(self) -> str:
        return (f"{self.spec.name}-h{self.num_heads}kv{self.num_kv_heads}-d{self.head_dim}-p{self.page_size}"
                f"-{self.kv_cache_dtype}")


@dataclass(frozen=True, kw_only=True)
class AttentionInputs:
    case: AttentionCase
    query: torch.Tensor  # [batch, heads, head_dim], bf16
    keys: list[torch.Tensor]  # per request [seq_len, kv_heads, head_dim], bf16 (what the model would write)
    values: list[torch.Tensor]
    k_scale: float
    v_scale: float

    @property
    def kv_dtype(self) -> torch.dtype:
        return fp8.kv_torch_dtype(self.case.kv_cache_dtype)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.case.head_dim)


def make_attention_inputs(case: AttentionCase) -> AttentionInputs:
    """Seeded bf16 query, keys and values; per-tensor scales amax/fp8_max for an FP8 cache (1.0 for bf16)."""
    generator = torch.Generator().manual_seed(case.seed)
    shape = (case.num_kv_heads, case.head_dim)
    keys = [torch.randn(n, *shape, generator=generator).to(torch.bfloat16) for n in case.spec.kv_lens]
    values = [torch.randn(n, *shape, generator=generator).to(torch.bfloat16) for n in case.spec.kv_lens]
    query = torch.randn(len(keys), case.num_heads, case.head_dim, generator=generator).to(torch.bfloat16)
    dtype = fp8.kv_torch_dtype(case.kv_cache_dtype)
    k_scale = fp8.per_tensor_scale(*keys, dtype=dtype) if fp8.is_fp8(dtype) else 1.0
    v_scale = fp8.per_tensor_scale(*values, dtype=dtype) if fp8.is_fp8(dtype) else 1.0
    return AttentionInputs(case=case, query=query, keys=keys, values=values, k_scale=k_scale, v_scale=v_scale)
