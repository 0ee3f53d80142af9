"""The float32 reference itself, on CPU: against a naive per-element loop, and its paging."""

from __future__ import annotations

import math

import pytest
import torch

from kvgate.kernels import reference
from kvgate.kernels.cases import BATCH_SPECS, DecodeCase, make_inputs


def naive_mla_decode(q, per_request_rows, kv_lora_rank, sm_scale):
    """Plain Python loops over requests, heads, tokens and features: no torch arithmetic at all."""
    out = []
    for b, rows in enumerate(per_request_rows):
        heads = []
        for h in range(len(q[b])):
            scores = [sm_scale * sum(qi * ki for qi, ki in zip(q[b][h], row, strict=True)) for row in rows]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            heads.append([sum(w * row[d] for w, row in zip(weights, rows, strict=True)) / total
                          for d in range(kv_lora_rank)])
        out.append(heads)
    return out


@pytest.mark.parametrize("page_size", [1, 3, 4])
def test_reference_equals_naive_loop(page_size: int) -> None:
    generator = torch.Generator().manual_seed(7)
    rank, rope, heads = 6, 3, 2
    lens = [1, 5, 9]
    rows = [torch.randn(n, rank + rope, generator=generator, dtype=torch.float64).float() for n in lens]
    cache = reference.page_requests(rows, page_size=page_size, kv_lora_rank=rank, generator=generator)
    q = torch.randn(len(lens), heads, rank + rope, generator=generator)
    got = reference.mla_decode(q, cache, sm_scale=0.37)
    want = naive_mla_decode(q.tolist(), [r.tolist() for r in rows], rank, 0.37)
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_pages_are_shuffled_and_padding_is_not_read() -> None:
    generator = torch.Generator().manual_seed(3)
    rows = [torch.randn(n, 5, generator=generator) for n in (2, 7)]
    cache = reference.page_requests(rows, page_size=4, kv_lora_rank=3, generator=generator)
    assert cache.block_table.dtype == torch.int32 and cache.seq_lens.tolist() == [2, 7]
    for b, expected in enumerate(rows):
        torch.testing.assert_close(cache.rows(b), expected)
    # the slot after request 0's two tokens holds other values: a kernel reading it would be caught
    page = int(cache.block_table[0, 0])
    assert not torch.equal(cache.kv[page, 2], torch.zeros(5))
    used = [int(cache.block_table[0, 0]), *cache.block_table[1, :2].tolist()]
    assert used != sorted(used) or used[0] != 0, f"pages {used} are laid out in order; the block table is not exercised"


def test_csr_matches_block_table() -> None:
    case = DecodeCase(spec=BATCH_SPECS["ragged_short"], num_heads=2, page_size=32, kv_cache_dtype="auto")
    cache = make_inputs(case).cache
    indptr, indices, lens = cache.csr()
    counts = [-(-n // 32) for n in BATCH_SPECS["ragged_short"].kv_lens]
    assert indptr.tolist() == [0, *torch.tensor(counts).cumsum(0).tolist()]
    for b, count in enumerate(counts):
        assert indices[indptr[b]: indptr[b + 1]].tolist() == cache.block_table[b, :count].tolist()
    assert lens.tolist() == list(BATCH_SPECS["ragged_short"].kv_lens)


def test_query_and_cache_shapes_must_agree() -> None:
    case = DecodeCase(spec=BATCH_SPECS["one_token"], num_heads=2, page_size=1, kv_cache_dtype="auto")
    inputs = make_inputs(case)
    with pytest.raises(ValueError, match=r"query \(1, 2, 575\) does not match the cache \(batch 1, row width 576\)"):
        reference.mla_decode(inputs.query[..., :575], inputs.cache, 0.1)


def test_inputs_are_seeded_and_device_independent() -> None:
    case = DecodeCase(spec=BATCH_SPECS["ragged_short"], num_heads=16, page_size=64, kv_cache_dtype="fp8")
    first, second = make_inputs(case), make_inputs(case)
    assert torch.equal(first.query, second.query)
    assert torch.equal(first.cache.kv.view(torch.uint8), second.cache.kv.view(torch.uint8))
    assert first.cache.kv.dtype == torch.float8_e4m3fn and first.cache.scale == second.cache.scale
