"""The float32 references themselves, on CPU: against naive loops, and the paging of both cache kinds."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from kvgate.kernels import reference
from kvgate.kernels.cases import (
    BATCH_SPECS,
    NULL_BLOCK,
    AttentionCase,
    BatchSpec,
    DecodeCase,
    attention_bytes_moved,
    make_attention_inputs,
    make_inputs,
    paged_layout,
)


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


def test_gqa_reference_equals_a_naive_loop() -> None:
    generator = torch.Generator().manual_seed(11)
    heads, kv_heads, dim = 4, 2, 3
    keys = [torch.randn(n, kv_heads, dim, generator=generator) for n in (1, 5)]
    values = [torch.randn(n, kv_heads, dim, generator=generator) for n in (1, 5)]
    q = torch.randn(2, heads, dim, generator=generator)
    got = reference.gqa_decode(q, keys, values, scale=0.4)
    for b in range(2):
        for h in range(heads):
            kv = h // (heads // kv_heads)
            scores = [0.4 * float(q[b, h] @ keys[b][t, kv]) for t in range(keys[b].shape[0])]
            weights = [math.exp(s - max(scores)) for s in scores]
            want = sum(w * values[b][t, kv] for t, w in enumerate(weights)) / sum(weights)
            torch.testing.assert_close(got[b, h], want, rtol=1e-5, atol=1e-6)


def test_rounding_p_to_bf16_is_close_and_to_fp8_is_not() -> None:
    """The FP8 P.V model: rounding the softmax weights to bf16 barely moves the output, to e4m3 it does."""
    inputs = make_attention_inputs(AttentionCase(spec=BATCH_SPECS["ragged_short"], num_heads=8, num_kv_heads=2,
                                                 head_dim=64, page_size=16, kv_cache_dtype="auto"))
    plain = reference.gqa_decode(inputs.query, inputs.keys, inputs.values, inputs.scale)
    bf16 = reference.gqa_decode(inputs.query, inputs.keys, inputs.values, inputs.scale, round_p_to=torch.bfloat16)
    e4m3 = reference.gqa_decode(inputs.query, inputs.keys, inputs.values, inputs.scale,
                                round_p_to=torch.float8_e4m3fn)
    rel = lambda x: float((x - plain).norm() / plain.norm())  # noqa: E731
    assert rel(bf16) < 0.004 < rel(e4m3) < 0.05, (rel(bf16), rel(e4m3))


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_paged_layout_never_uses_the_null_block(page_size: int) -> None:
    lens = BATCH_SPECS["ragged_short"].kv_lens
    layout = paged_layout(lens, page_size, seed=3)
    assert layout.block_table.dtype == torch.int32 and layout.slot_mapping.dtype == torch.int64
    assert layout.seq_lens.tolist() == list(lens)
    assert layout.slot_mapping.unique().numel() == sum(lens), "two tokens share a cache slot"
    assert not bool((layout.slot_mapping // page_size == NULL_BLOCK).any()), "a token landed in vLLM's null block"
    assert int(layout.slot_mapping.max()) < layout.num_blocks * page_size
    for request, n in enumerate(lens):
        slots = layout.slots_of(request)
        blocks = layout.block_table[request, : -(-n // page_size)]
        assert slots.tolist() == [int(blocks[t // page_size]) * page_size + t % page_size for t in range(n)]
        assert not bool((layout.block_table[request, -(-n // page_size):] != NULL_BLOCK).any())
    used = layout.block_table[layout.block_table != NULL_BLOCK].tolist()
    assert used != sorted(used), "blocks are handed out in order; the block table is not exercised"
    assert paged_layout(lens, page_size, seed=3).slot_mapping.equal(layout.slot_mapping)


def test_attention_inputs_scales() -> None:
    case = AttentionCase(spec=BATCH_SPECS["one_token"], num_heads=4, num_kv_heads=2, head_dim=8, page_size=16,
                         kv_cache_dtype="fp8_e5m2")
    inputs = make_attention_inputs(case)
    assert inputs.k_scale == pytest.approx(float(inputs.keys[0].abs().max()) / 57344.0)
    assert inputs.q_scale == pytest.approx(float(inputs.query.abs().max()) / 448.0)  # queries are quantised to e4m3
    bf16 = make_attention_inputs(dataclasses.replace(case, kv_cache_dtype="auto"))
    assert (bf16.k_scale, bf16.v_scale, bf16.q_scale) == (1.0, 1.0, 1.0)


def test_attention_bytes_moved() -> None:
    case = AttentionCase(spec=BatchSpec(name="x", kv_lens=(10, 6)), num_heads=4, num_kv_heads=2, head_dim=8,
                         page_size=16, kv_cache_dtype="fp8_e4m3")
    inputs = make_attention_inputs(case)
    # 16 tokens x 2 kv heads x 8 x (K and V) x 1 byte, + query 2x4x8 x 1 byte, + bf16 output 2x4x8 x 2 bytes
    assert attention_bytes_moved(inputs, query_element_size=1) == 16 * 2 * 8 * 2 + 64 + 128
