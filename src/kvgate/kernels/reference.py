"""The PyTorch reference for MLA decode over a paged latent cache, in float32.

MLA decode (DeepSeek-V2/V3 with weights absorbed) is multi-query attention over one latent cache:
each cached token is one row of ``kv_lora_rank`` (512) compressed-KV features ``ckv`` followed by
``rope_dim`` (64) RoPE key features ``kpe``. A decode query row has the same 576 features. Per request
and head::

    scores = sm_scale * (q_nope . ckv^T + q_pe . kpe^T)      over the request's seq_len tokens
    out    = softmax(scores) . ckv                          -> kv_lora_rank features

The cache is paged as vLLM stores it: ``kv[num_pages, page_size, kv_lora_rank + rope_dim]`` with a
block table ``[batch, max_pages]`` (int32) and ``seq_lens[batch]`` (int32). An FP8 cache carries its
dequantisation scale (kvgate.kernels.fp8). The reference works on the dequantised float32 cache, so it
measures the kernel's own error, not the quantisation error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvgate.kernels import fp8


@dataclass(frozen=True, kw_only=True)
class PagedLatentCache:
    """vLLM's MLA cache layout: one packed latent row per token, pages shuffled through a block table."""

    kv: torch.Tensor  # [num_pages, page_size, kv_lora_rank + rope_dim], storage dtype (bf16 or fp8)
    block_table: torch.Tensor  # [batch, max_pages] int32; unused entries point at page 0
    seq_lens: torch.Tensor  # [batch] int32, each >= 1
    kv_lora_rank: int
    scale: float = 1.0  # dequantisation scale (vLLM's k_scale); 1.0 for a bf16 cache

    @property
    def page_size(self) -> int:
        return int(self.kv.shape[1])

    @property
    def rope_dim(self) -> int:
        return int(self.kv.shape[2]) - self.kv_lora_rank

    @property
    def batch(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def ckv(self) -> torch.Tensor:
        return self.kv[..., : self.kv_lora_rank]

    @property
    def kpe(self) -> torch.Tensor:
        return self.kv[..., self.kv_lora_rank:]

    def pages_of(self, request: int) -> torch.Tensor:
        count = -(-int(self.seq_lens[request]) // self.page_size)
        return self.block_table[request, :count]

    def csr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kv_indptr, kv_indices, kv_lens) in int32: FlashInfer's CSR page layout of the same cache."""
        counts = [-(-int(n) // self.page_size) for n in self.seq_lens.tolist()]
        indices = torch.cat([self.block_table[b, :c] for b, c in enumerate(counts)]).to(torch.int32)
        indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
        return indptr.to(self.kv.device), indices.contiguous(), self.seq_lens.to(torch.int32)

    def rows(self, request: int, *, dequantize: bool = True) -> torch.Tensor:
        """The request's seq_len cached rows in token order, float32 (times the scale unless told not)."""
        pages = self.pages_of(request).long()
        rows = self.kv[pages].reshape(-1, self.kv.shape[-1])[: int(self.seq_lens[request])].float()
        return rows * self.scale if dequantize else rows

    def dequantized(self) -> PagedLatentCache:
        """The same cache with float32 storage and scale 1 (what the reference computes on)."""
        return PagedLatentCache(kv=self.kv.float() * self.scale, block_table=self.block_table,
                                seq_lens=self.seq_lens, kv_lora_rank=self.kv_lora_rank, scale=1.0)

    def quantized(self, dtype: torch.dtype, scale: float | None = None) -> PagedLatentCache:
        """This cache's values stored as `dtype` (bf16, or FP8 with a per-tensor scale, amax/max by default)."""
        values = self.kv.float() * self.scale
        if not fp8.is_fp8(dtype):
            return PagedLatentCache(kv=values.to(dtype), block_table=self.block_table, seq_lens=self.seq_lens,
                                    kv_lora_rank=self.kv_lora_rank, scale=1.0)
        scale = fp8.per_tensor_scale(values, dtype=dtype) if scale is None else scale
        return PagedLatentCache(kv=fp8.quantize(values, scale, dtype), block_table=self.block_table,
                                seq_lens=self.seq_lens, kv_lora_rank=self.kv_lora_rank, scale=scale)


def page_requests(rows: list[torch.Tensor], *, page_size: int, kv_lora_rank: int,
                  generator: torch.Generator, spare_pages: int = 3) -> PagedLatentCache:
    """Lay per-request float rows [seq_len, D] into shuffled pages (float32 storage, scale 1).

    Slots past a request's seq_len hold random values of the same magnitude: a kernel that reads
    beyond seq_len gets a different answer from the reference.
    """
    if any(r.shape[0] < 1 for r in rows):
        raise ValueError("every request needs at least one cached token")
    width = rows[0].shape[1]
    counts = [-(-r.shape[0] // page_size) for r in rows]
    num_pages = sum(counts) + spare_pages
    kv = torch.randn(num_pages, page_size, width, generator=generator)
    order = torch.randperm(num_pages, generator=generator)
    block_table = torch.zeros(len(rows), max(counts), dtype=torch.int32)
    used = 0
    for b, (request_rows, count) in enumerate(zip(rows, counts, strict=True)):
        pages = order[used: used + count]
        used += count
        block_table[b, :count] = pages.to(torch.int32)
        padded = torch.randn(count * page_size, width, generator=generator)
        padded[: request_rows.shape[0]] = request_rows
        kv[pages] = padded.view(count, page_size, width)
    seq_lens = torch.tensor([r.shape[0] for r in rows], dtype=torch.int32)
    return PagedLatentCache(kv=kv, block_table=block_table, seq_lens=seq_lens, kv_lora_rank=kv_lora_rank)


def mla_decode(q: torch.Tensor, cache: PagedLatentCache, sm_scale: float, *,
               round_p_to: torch.dtype | None = None, bf16_scores: bool = False) -> torch.Tensor:
    """Reference decode on the dequantised cache: q [batch, heads, D] -> float32 [batch, heads, kv_lora_rank].

    `round_p_to` is not part of the reference: it models a kernel that multiplies P.V in FP8 (vLLM's
    FlashMLA FP8 decode), exactly as `gqa_decode`'s does: exp(s - max) rounded to that dtype before P.V,
    the normaliser summed unrounded.
    `bf16_scores` is not part of it either: it models a kernel that takes each score Q.K as bf16 products
    summed in bf16 (vLLM's Triton decode kernel for one query head a KV head, `tl.sum(q[None, :] * k, 1)`):
    every product rounded to bf16, then summed pairwise with a bf16 rounding at each level.
    """
    return _decode(q, cache, lambda b: cache.rows(b), qk_scale=sm_scale, v_scale=1.0, round_p_to=round_p_to,
                   bf16_scores=bf16_scores)


def mla_decode_bmm_scales(q: torch.Tensor, cache: PagedLatentCache, bmm1_scale: float,
                          bmm2_scale: float) -> torch.Tensor:
    """The same decode as trtllm-gen is asked for it: raw cache values, bmm1 on Q.K^T, bmm2 on P.V."""
    return _decode(q, cache, lambda b: cache.rows(b, dequantize=False), qk_scale=bmm1_scale, v_scale=bmm2_scale)


def _decode(q: torch.Tensor, cache: PagedLatentCache, rows_of, *, qk_scale: float, v_scale: float,
            round_p_to: torch.dtype | None = None, bf16_scores: bool = False) -> torch.Tensor:
    batch, heads, width = q.shape
    if batch != cache.batch or width != cache.kv.shape[-1]:
        raise ValueError(f"query {tuple(q.shape)} does not match the cache (batch {cache.batch}, "
                         f"row width {cache.kv.shape[-1]})")
    out = torch.empty(batch, heads, cache.kv_lora_rank, dtype=torch.float32, device=q.device)
    for b in range(batch):
        rows = rows_of(b).to(q.device)  # [seq_len, D]
        scores = (_bf16_dot(q[b], rows) if bf16_scores else q[b].float() @ rows.T) * qk_scale  # [heads, seq_len]
        values = rows[:, : cache.kv_lora_rank]
        if round_p_to is None:
            out[b] = (torch.softmax(scores, dim=-1) @ values) * v_scale
        else:
            weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
            out[b] = (weights.to(round_p_to).float() @ values) / weights.sum(dim=-1, keepdim=True) * v_scale
    return out


def _bf16_dot(q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """q [heads, D] . rows [seq_len, D] -> float32 [heads, seq_len], as bf16 products summed pairwise in bf16."""
    x = q.to(torch.bfloat16)[:, None, :] * rows.to(torch.bfloat16)[None, :, :]  # each product rounded to bf16
    width = 1 << (x.shape[-1] - 1).bit_length()
    x = torch.nn.functional.pad(x, (0, width - x.shape[-1]))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = (x[..., :half].float() + x[..., half:].float()).to(torch.bfloat16)
    return x[..., 0].float()


def gqa_decode(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], scale: float,
               *, round_p_to: torch.dtype | None = None) -> torch.Tensor:
    """Reference for a non-MLA decode: q [batch, heads, D]; keys/values per request [seq_len, kv_heads, D].

    Query head h reads kv head h // (heads // kv_heads) (grouped-query attention). float32 out
    [batch, heads, D].

    `round_p_to` is not part of the reference: it models a kernel that multiplies P.V in FP8. The
    unnormalised weights exp(s - max) are rounded to that dtype before P.V, the normaliser is not
    (as FA3 FP8 and vLLM's Triton attention with an FP8 query do). kvgate.kernels.tolerance derives
    the FP8_PV bound from the error this model makes against the plain reference.
    """
    if round_p_to is not None:
        return _gqa_decode_rounded_p(q, keys, values, scale, round_p_to)
    batch, heads, _ = q.shape
    out = torch.empty(batch, heads, values[0].shape[-1], dtype=torch.float32, device=q.device)
    for b in range(batch):
        kv_heads = keys[b].shape[1]
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads do not group onto {kv_heads} kv heads")
        group = heads // kv_heads
        k = keys[b].float().repeat_interleave(group, dim=1)  # [seq_len, heads, D]
        v = values[b].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[b].float(), k) * scale
        out[b] = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), v)
    return out


def _gqa_decode_rounded_p(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], scale: float,
                          dtype: torch.dtype) -> torch.Tensor:
    batch, heads, _ = q.shape
    out = torch.empty(batch, heads, values[0].shape[-1], dtype=torch.float32, device=q.device)
    for b in range(batch):
        group = heads // keys[b].shape[1]
        k = keys[b].float().repeat_interleave(group, dim=1)
        v = values[b].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[b].float(), k) * scale
        weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        rounded = weights.to(dtype).float()
        out[b] = torch.einsum("ht,thd->hd", rounded, v) / weights.sum(dim=-1, keepdim=True)
    return out
