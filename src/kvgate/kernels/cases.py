"""Named decode shapes and the inputs built from them (seeded, identical on every device).

A `DecodeCase` is one accuracy test: a batch spec (ragged KV lengths), a head count, a page size and
a kv_cache_dtype. `make_inputs` builds the bf16 query, the paged latent cache in the cell's storage
dtype (bf16, or FP8 with a per-tensor scale) and the float32 values it was made from.
`BENCH_SPECS` are the speed shapes of docs/facts/h200.md#fp8-mla-decode-is-slower-than-bf16-on-sm90 (batch x heads
x kv len, page 64).

The non-MLA (grouped-query) cases: an `AttentionCase` gives bf16 keys and values per request (what the
model would write), per-tensor K/V scales and the scale of an FP8 query; `paged_layout` places the
requests' tokens in shuffled cache blocks as vLLM's block table does (block 0, vLLM's null block, is
never handed out), and the adapters write them with the backend's own vLLM cache op.
`ATTENTION_BENCH_SPECS` are the grouped-query speed shapes (Llama-3.1-8B heads: 32 query, 8 KV, 128).
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
HEAD_COUNTS = (16, 128)  # DeepSeek-V3's 128 heads on one GPU, and on each of 8 tensor-parallel ranks
PAGE_SIZES = (1, 32, 64)


@dataclass(frozen=True, kw_only=True, slots=True)
class RankHeads:
    """The attention heads one rank of a tensor-parallel engine runs its decode kernel with.

    vLLM splits a model's query heads evenly over the ranks. A grouped-query model's KV heads are split too, and
    each rank keeps at least one (a KV head is copied when there are more ranks than KV heads). MLA's latent cache
    is one KV head on every rank. So at TP n the kernels run shapes that no TP 1 test reaches: 1 head a rank, or 12,
    a count that does not divide 16 (the per-rank head counts FP8 MLA decode broke on, issue 31), while the
    model's own head count is untouched. A GPU of one host runs them; no second GPU is needed for the kernel.
    """

    model: str
    heads: int
    kv_heads: int
    tensor_parallel_size: int
    head_dim: int = 128

    @property
    def num_heads(self) -> int:
        return self.heads // self.tensor_parallel_size

    @property
    def num_kv_heads(self) -> int:
        return max(self.kv_heads // self.tensor_parallel_size, 1)

    @property
    def label(self) -> str:
        return f"{self.model} ({self.heads} heads) at TP {self.tensor_parallel_size}"


# MLA models at the tensor-parallel sizes their users run, each leaving a rank a head count HEAD_COUNTS lacks
MLA_RANK_HEADS = (
    RankHeads(model="kvgate:tiny-deepseek-v2", heads=2, kv_heads=1, tensor_parallel_size=2),  # the tp2 cells
    RankHeads(model="DeepSeek-V2-Lite", heads=16, kv_heads=1, tensor_parallel_size=8),
    RankHeads(model="DeepSeek-V2-Lite", heads=16, kv_heads=1, tensor_parallel_size=2),
    RankHeads(model="Kimi-K3", heads=96, kv_heads=1, tensor_parallel_size=8),  # 12: does not divide 16
    RankHeads(model="Kimi-K2", heads=64, kv_heads=1, tensor_parallel_size=2),
)
MLA_HEAD_COUNTS = tuple(sorted({*HEAD_COUNTS, *(rank.num_heads for rank in MLA_RANK_HEADS)}))


def rank_heads_of(num_heads: int, num_kv_heads: int | None = None, head_dim: int | None = None) -> str:
    """The models and tensor-parallel sizes that leave a rank these heads: MLA query heads alone, or a grouped-query
    case's (query heads, KV heads, head dim); "" for the TP 1 shapes alone (HEAD_COUNTS, GQA_HEADS)."""
    if num_kv_heads is None:
        return "; ".join(rank.label for rank in MLA_RANK_HEADS if rank.num_heads == num_heads)
    return "; ".join(rank.label for rank in GQA_RANK_HEADS
                     if (rank.num_heads, rank.num_kv_heads, rank.head_dim) == (num_heads, num_kv_heads, head_dim))


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
    """A non-MLA (grouped-query) decode case: CPU_ATTN, and the GPU families of test_attention_decode.py."""

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
    q_scale: float = 1.0  # an FP8 query's per-tensor scale (amax / 448, e4m3) where the kernel quantises it

    @property
    def kv_dtype(self) -> torch.dtype:
        return fp8.kv_torch_dtype(self.case.kv_cache_dtype)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.case.head_dim)


def make_attention_inputs(case: AttentionCase) -> AttentionInputs:
    """Seeded bf16 query, keys and values on the CPU; per-tensor scales amax/fp8_max for an FP8 cache.

    The K/V scales map each tensor's amax onto the cache dtype's max; the query scale maps the query's
    amax onto e4m3's (vLLM quantises a query to current_platform.fp8_dtype(), e4m3 on CUDA, whatever the
    cache's FP8 kind). All three are 1.0 for a bf16 cache.
    """
    generator = torch.Generator().manual_seed(case.seed)
    shape = (case.num_kv_heads, case.head_dim)
    keys = [torch.randn(n, *shape, generator=generator).to(torch.bfloat16) for n in case.spec.kv_lens]
    values = [torch.randn(n, *shape, generator=generator).to(torch.bfloat16) for n in case.spec.kv_lens]
    query = torch.randn(len(keys), case.num_heads, case.head_dim, generator=generator).to(torch.bfloat16)
    return _attention_inputs(case, query, keys, values)


def _attention_inputs(case: AttentionCase, query: torch.Tensor, keys: list[torch.Tensor],
                      values: list[torch.Tensor]) -> AttentionInputs:
    dtype = fp8.kv_torch_dtype(case.kv_cache_dtype)
    if not fp8.is_fp8(dtype):
        return AttentionInputs(case=case, query=query, keys=keys, values=values, k_scale=1.0, v_scale=1.0)
    return AttentionInputs(case=case, query=query, keys=keys, values=values,
                           k_scale=fp8.per_tensor_scale(*keys, dtype=dtype),
                           v_scale=fp8.per_tensor_scale(*values, dtype=dtype),
                           q_scale=fp8.per_tensor_scale(query, dtype=torch.float8_e4m3fn))


GQA_HEADS = (32, 8)  # (query heads, KV heads) of Llama-3.1-8B, the matrix's non-MLA model
GQA_HEAD_DIM = 128
# grouped-query models at tensor-parallel sizes: the (query, KV) heads a rank holds, beside GQA_HEADS (TP 1)
GQA_RANK_HEADS = (
    RankHeads(model="kvgate:tiny-llama", heads=4, kv_heads=4, head_dim=64, tensor_parallel_size=2),  # the tp2 cells
    RankHeads(model="Llama-3.1-8B", heads=32, kv_heads=8, tensor_parallel_size=2),
    RankHeads(model="Llama-3.1-8B", heads=32, kv_heads=8, tensor_parallel_size=8),  # one KV head a rank
    RankHeads(model="Llama-3.1-70B", heads=64, kv_heads=8, tensor_parallel_size=8),
)
NULL_BLOCK = 0  # vLLM keeps KV cache block 0 as its null block: no request's tokens are ever written there


@dataclass(frozen=True, kw_only=True)
class PagedLayout:
    """Where each request's tokens live in a paged K/V cache of `num_blocks` blocks of `page_size` slots."""

    block_table: torch.Tensor  # [batch, max_blocks] int32; entries past a request's blocks are NULL_BLOCK
    slot_mapping: torch.Tensor  # [total tokens] int64, request after request: block * page_size + offset
    seq_lens: torch.Tensor  # [batch] int32
    num_blocks: int
    page_size: int

    def slots_of(self, request: int) -> torch.Tensor:
        start = int(self.seq_lens[:request].sum())
        return self.slot_mapping[start: start + int(self.seq_lens[request])]


def paged_layout(kv_lens: tuple[int, ...], page_size: int, *, seed: int = 0, spare_blocks: int = 2) -> PagedLayout:
    """Shuffled blocks 1..num_blocks-1 handed out request by request (block 0 is vLLM's null block)."""
    if any(n < 1 for n in kv_lens):
        raise ValueError("every request needs at least one cached token")
    counts = [-(-n // page_size) for n in kv_lens]
    num_blocks = 1 + sum(counts) + spare_blocks
    order = torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(seed + 1)) + 1
    block_table = torch.full((len(kv_lens), max(counts)), NULL_BLOCK, dtype=torch.int32)
    slots, used = [], 0
    for b, (n, count) in enumerate(zip(kv_lens, counts, strict=True)):
        blocks = order[used: used + count]
        used += count
        block_table[b, :count] = blocks.to(torch.int32)
        token = torch.arange(n)
        slots.append(blocks[token // page_size] * page_size + token % page_size)
    return PagedLayout(block_table=block_table, slot_mapping=torch.cat(slots).to(torch.int64),
                       seq_lens=torch.tensor(kv_lens, dtype=torch.int32), num_blocks=num_blocks,
                       page_size=page_size)


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionBenchSpec:
    name: str
    batch: int
    kv_len: int
    num_heads: int = GQA_HEADS[0]
    num_kv_heads: int = GQA_HEADS[1]
    head_dim: int = GQA_HEAD_DIM
    page_size: int = 16


ATTENTION_BENCH_SPECS = {
    spec.name: spec
    for spec in (
        AttentionBenchSpec(name="b32-h32kv8-d128-kv8192", batch=32, kv_len=8192),
        AttentionBenchSpec(name="b128-h32kv8-d128-kv2048", batch=128, kv_len=2048),
    )
}


def make_attention_bench_inputs(spec: AttentionBenchSpec, kv_cache_dtype: str,
                                device: torch.device | str) -> AttentionInputs:
    """Uniform lengths, values drawn on the device (big shapes; accuracy is not checked)."""
    generator = torch.Generator(device=device).manual_seed(1)
    tokens = spec.batch * spec.kv_len
    shape = (tokens, spec.num_kv_heads, spec.head_dim)
    keys = torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16)
    values = torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16)
    query = torch.randn(spec.batch, spec.num_heads, spec.head_dim, generator=generator, device=device,
                        dtype=torch.bfloat16)
    case = AttentionCase(spec=BatchSpec(name=spec.name, kv_lens=(spec.kv_len,) * spec.batch, gpu_only=True),
                         num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                         page_size=spec.page_size, kv_cache_dtype=kv_cache_dtype)
    return _attention_inputs(case, query, list(keys.split(spec.kv_len)), list(values.split(spec.kv_len)))


def attention_bytes_moved(inputs: AttentionInputs, *, query_element_size: int) -> int:
    """The least HBM traffic of one grouped-query decode: cached K and V once, the query, a bf16 output."""
    case = inputs.case
    kv_element_size = fp8.kv_torch_dtype(case.kv_cache_dtype).itemsize
    cached = sum(case.spec.kv_lens) * case.num_kv_heads * case.head_dim * 2 * kv_element_size
    rows = len(case.spec.kv_lens) * case.num_heads * case.head_dim
    return cached + rows * query_element_size + rows * 2
