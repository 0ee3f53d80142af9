"""The non-MLA GPU decode kernels (FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION) against the reference.

Each family's adapter writes the case's bf16 keys and values with the backend's own vLLM cache op
(quantising to FP8 with per-tensor K/V scales), quantises the query where the backend does, and launches
the kernel as the backend calls it (kvgate.kernels.adapters). The reference (reference.gqa_decode, float32)
runs on what the kernel read: the stored cache read back and dequantised, and the (dequantised) query.
So the bound is the kernel's own error: tolerance.BF16, FP8, or FP8_PV for the families that multiply P.V
in FP8. The cache write's layout is checked on every bf16 case (the read-back equals the input bit for
bit); the quantisation itself is a sanity bound against the unquantised values (FP8_QUANTISATION).

Cases: Llama-3.1-8B heads (32 query, 8 KV, head dim 128), and the heads a tensor-parallel rank holds
(GQA_RANK_HEADS: 16/4 and 4/1 of Llama-3.1-8B at TP 2 and 8, 8/1 of Llama-3.1-70B at TP 8, 2/2 of kvgate's
tiny Llama at TP 2, head dim 64), the ragged batches `ragged_short` (1-257 tokens, the 3D Triton kernel) and
`ragged_long` (5-8192), block size 16, bf16 and each FP8 kind the family has.
Speed: ATTENTION_BENCH_SPECS per family and kv dtype, into timings.json. Negative controls: the kernel is
handed a k_scale 10 % off while the cache was written with the right one; the check must fail.

Pinned (`PINNED`): a family x kv dtype whose vLLM path cannot run as declared. Its cell selects only the
strict xfail that documents why, so the cell reads "skipped" with the reason and the gate fails it
(no executed kernel test), and a vLLM that fixes it turns the xfail into a failure to update.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os

import pytest
import torch

from kvgate.kernels import benchmark, fp8, reference, timings, tolerance
from kvgate.kernels.adapters import KernelUnavailable
from kvgate.kernels.cases import (
    ATTENTION_BENCH_SPECS,
    BATCH_SPECS,
    GQA_HEAD_DIM,
    GQA_HEADS,
    GQA_RANK_HEADS,
    AttentionCase,
    RankHeads,
    attention_bytes_moved,
    make_attention_bench_inputs,
    make_attention_inputs,
    rank_heads_of,
)
from kvgate.kernels.families import FAMILIES, KernelFamily, storage_kinds

GPU_FAMILIES = tuple(f for f in FAMILIES.values() if not f.mla and f.archs != ("cpu",))
SPECS = ("ragged_short", "ragged_long")
PAGE_SIZE = 16
TRITON_E5M2_REASON = (
    "vLLM 0.26.0's TRITON_ATTN has no fp8_e5m2 cache: triton_reshape_and_cache_flash stores any FP8 "
    "kv_cache_dtype as current_platform.fp8_dtype() (e4m3) and TritonAttentionImpl.forward views the cache as "
    "e4m3 (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py, backends/triton_attn.py); and since "
    "TritonAttentionImpl.supports_quant_query_input is True on CUDA, Attention.forward quantises the query and "
    "asserts kv_cache_dtype in {fp8, fp8_e4m3, nvfp4} (model_executor/layers/attention/attention.py), so an "
    "engine with --kv-cache-dtype fp8_e5m2 fails its first forward. Read from the source; this xfail checks "
    "the stored bytes on the GPU")
FLASHINFER_E5M2_REASON = (
    "vLLM 0.26.0's FLASHINFER has no working fp8_e5m2 path on SM90. The engine cannot start: "
    "FlashInferMetadataBuilder.get_q_data_type plans prefill with q_data_type = the cache dtype e5m2 "
    "(vllm/v1/attention/backends/flashinfer.py:866-875, get_dtype_for_flashinfer 435-439) but "
    "FlashInferImpl.maybe_quant_query quantises the query with custom_ops.scaled_fp8_quant (flashinfer.py:1672, "
    "called for prefill at 1862-1866), whose output is current_platform.fp8_dtype() = e4m3 "
    "(vllm/_custom_ops.py:1877), and FlashInfer 0.6.14's run check raises (flashinfer/utils.py:319-322 via "
    "prefill.py:2344): 'ValueError: The dtype of q torch.float8_e4m3fn does not match the q_data_type "
    "torch.float8_e5m2 specified in plan function.' (the H200 engine run, 2026-12-01). The decode kernel "
    "itself, as vLLM calls it on SM90 (bf16 query: get_q_data_type 857-863; "
    "BatchDecodeWithPagedKVCacheWrapper.run at flashinfer.py:2108 with the e5m2-viewed cache, which FlashInfer "
    "0.6.14 resolves to its fa2 tensor-core kernel: decode.py:1186-1200, utils.py:423-428), returned garbage "
    "on the H200 against the reference on the same e5m2 bytes: rel-L2 0.8652 (ragged_short) and 0.8217 "
    "(ragged_long), cosine 0.55 / 0.83, where e4m3 passes. This xfail runs that decode")
PINNED = {("vllm_triton_attn", "fp8_e5m2"): TRITON_E5M2_REASON,
          ("flashinfer_decode", "fp8_e5m2"): FLASHINFER_E5M2_REASON}


def _marks(family: KernelFamily, kv: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.kvgate_kernel(family=family.name, kv=kv), pytest.mark.gpu]


def _case(spec: str, kv: str, seed: int = 0, rank: RankHeads | None = None) -> AttentionCase:
    heads, kv_heads, dim = (rank.num_heads, rank.num_kv_heads, rank.head_dim) if rank else (*GQA_HEADS, GQA_HEAD_DIM)
    return AttentionCase(spec=BATCH_SPECS[spec], num_heads=heads, num_kv_heads=kv_heads, head_dim=dim,
                         page_size=PAGE_SIZE, kv_cache_dtype=kv, seed=seed)



def _accuracy_params():
    for family in GPU_FAMILIES:
        for kv in storage_kinds(family):
            if (family.name, kv) in PINNED:
                continue
            for spec in SPECS:
                for rank in (None, *GQA_RANK_HEADS):
                    case = _case(spec, kv, rank=rank)
                    yield pytest.param(family, case, id=f"{family.name}-{case.id}", marks=_marks(family, kv))


def _speed_params():
    for family in GPU_FAMILIES:
        for kv in storage_kinds(family):
            if (family.name, kv) in PINNED:
                continue
            for spec in ATTENTION_BENCH_SPECS.values():
                yield pytest.param(family, kv, spec, id=f"{family.name}-{spec.name}-{kv}", marks=_marks(family, kv))


def _negative_control_params():
    for family in GPU_FAMILIES:
        if "fp8_e4m3" in storage_kinds(family):
            case = _case("ragged_short", "fp8_e4m3")
            yield pytest.param(family, case, id=f"{family.name}-{case.id}", marks=_marks(family, "fp8_e4m3"))


def _prepare(family: KernelFamily, inputs, **kwargs):
    adapter = importlib.import_module(family.module)
    try:
        return adapter.prepare(inputs, family.name, **kwargs)
    except KernelUnavailable as error:
        pytest.skip(f"{family.name}: {error}")


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize(("family", "case"), list(_accuracy_params()))
def test_paged_decode_matches_reference(family: KernelFamily, case: AttentionCase, record_figures) -> None:
    inputs = make_attention_inputs(case)
    prepared = _prepare(family, inputs)
    out = prepared.run()
    torch.cuda.synchronize(_device())
    query, keys, values = prepared.read_back()
    if case.kv_cache_dtype == "auto":  # the cache layout kvgate reads back is the one the op wrote
        for got, want in zip(keys + values, inputs.keys + inputs.values, strict=True):
            assert torch.equal(got.cpu(), want.float()), f"{family.name}: the K/V cache read back differs from the input"
    ref = reference.gqa_decode(query, keys, values, inputs.scale)
    bound = tolerance.for_kernel(inputs.kv_dtype, fp8_pv=family.fp8_pv)
    figures = tolerance.error_figures(out, ref, bound)
    record_figures("provenance", prepared.provenance)
    record_figures("cuda_visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    if of_a_rank := rank_heads_of(case.num_heads, case.num_kv_heads, case.head_dim):
        record_figures("heads_of_a_rank", of_a_rank)
    record_figures("tolerance", f"{bound.name}: rel_l2<={bound.max_rel_l2} cos_diff<{bound.max_cos_diff} "
                                f"atol={bound.atol} rtol={bound.rtol}")
    for name, value in figures.as_dict().items():
        record_figures(name, value)
    found = tolerance.problems(figures, bound)
    if case.kv_cache_dtype != "auto":
        exact = reference.gqa_decode(inputs.query.to(out.device), [k.to(out.device) for k in inputs.keys],
                                     [v.to(out.device) for v in inputs.values], inputs.scale)
        quantisation = tolerance.error_figures(out, exact, tolerance.FP8_QUANTISATION)
        for name, value in quantisation.as_dict().items():
            record_figures(f"vs_unquantised_{name}", value)
        found += tolerance.problems(quantisation, tolerance.FP8_QUANTISATION)
    assert not found, f"{family.name} {case.id}: " + "; ".join(found) + f" [{figures.summary()}]"


@pytest.mark.parametrize(("family", "case"), list(_negative_control_params()))
def test_a_wrong_k_scale_is_caught(family: KernelFamily, case: AttentionCase, record_figures) -> None:
    """Negative control: the kernel is handed a k_scale 10 % off; the accuracy check must notice."""
    inputs = make_attention_inputs(case)
    prepared = _prepare(family, inputs, k_scale_error=1.1)
    out = prepared.run()
    torch.cuda.synchronize(_device())
    query, keys, values = prepared.read_back()
    bound = tolerance.for_kernel(inputs.kv_dtype, fp8_pv=family.fp8_pv)
    figures = tolerance.error_figures(out, reference.gqa_decode(query, keys, values, inputs.scale), bound)
    record_figures("rel_l2", figures.rel_l2)
    assert tolerance.problems(figures, bound), f"a 10 % k_scale error went unnoticed: {figures.summary()}"


@pytest.mark.parametrize(("family", "kv", "spec"), list(_speed_params()))
def test_paged_decode_speed(family: KernelFamily, kv: str, spec, record_figures, timings_dir,
                            worker_id_or_main) -> None:
    device = _device()
    inputs = make_attention_bench_inputs(spec, kv, device)
    prepared = _prepare(family, inputs)
    out = prepared.run()
    assert bool(torch.isfinite(out).all()), f"{family.name} produced non-finite output on {spec.name}"
    repeats = benchmark.repeats_from_env()
    measured = benchmark.time_launch(prepared.run, device, repeats)
    moved = attention_bytes_moved(inputs, query_element_size=prepared.query_element_size)
    achieved = moved / (measured.median_us * 1e-6) / 1e9
    copy = benchmark.copy_bandwidth_gbps(device)
    entry = timings.TimingEntry(
        family=family.name, kv_cache_dtype=kv, spec=spec.name, batch=spec.batch, num_heads=spec.num_heads,
        kv_len=spec.kv_len, page_size=spec.page_size, median_us=round(measured.median_us, 2),
        min_us=round(measured.min_us, 2), max_us=round(measured.max_us, 2), repeats=measured.repeats,
        bytes=moved, achieved_gbps=round(achieved, 1), fraction_of_copy=round(achieved / copy, 4),
        cuda_graph=measured.cuda_graph, provenance=prepared.provenance)
    for name in ("median_us", "min_us", "max_us", "achieved_gbps", "fraction_of_copy", "cuda_graph", "bytes"):
        record_figures(name, getattr(entry, name))
    record_figures("copy_bandwidth_gbps", round(copy, 1))
    if timings_dir:
        props = torch.cuda.get_device_properties(device)
        timings.write_fragment(timings_dir, worker_id_or_main, entry)
        timings.write_device_fragment(
            timings_dir, worker_id_or_main,
            {"name": props.name, "capability": f"{props.major}.{props.minor}", "copy_bandwidth_gbps": round(copy, 1),
             "torch": torch.__version__},
            {"cuda_graph": measured.cuda_graph, "l2_flush_bytes": benchmark.l2_flush_bytes(device),
             "repeats": repeats, "statistic": "median of repeats; each repeat flushes L2, then replays one launch"})
    assert math.isfinite(measured.median_us) and measured.median_us > 0
    assert achieved <= 1.25 * copy, f"{achieved:.0f} GB/s is above the device's copy bandwidth {copy:.0f} GB/s"


@pytest.mark.gpu
@pytest.mark.kvgate_kernel(family="vllm_triton_attn", kv="fp8_e5m2")
@pytest.mark.xfail(strict=True, reason=TRITON_E5M2_REASON)
def test_triton_attn_stores_fp8_e5m2_as_e5m2() -> None:
    """TRITON_ATTN's cache write for kv_cache_dtype fp8_e5m2 (k_scale 1.0, vLLM's default): are the bytes e5m2?"""
    family = FAMILIES["vllm_triton_attn"]
    inputs = dataclasses.replace(make_attention_inputs(_case("ragged_short", "fp8_e5m2")), k_scale=1.0, v_scale=1.0)
    prepared = _prepare(family, inputs)
    stored = prepared.cache.views()[0]  # the key cache as allocated: uint8
    for request, key in enumerate(inputs.keys):
        slots = prepared.cache.layout.slots_of(request).to(stored.device)
        got = stored[slots // PAGE_SIZE, slots % PAGE_SIZE].cpu()
        as_e4m3 = key.float().to(torch.float8_e4m3fn).view(torch.uint8)
        print(f"request {request}: stored bytes equal the e4m3 encoding: {torch.equal(got, as_e4m3)}")
        decoded = got.view(torch.float8_e5m2).float()  # e5m2 keeps 2 mantissa bits: within 2^-2 relative
        assert torch.allclose(decoded, key.float(), rtol=2**-2, atol=2**-15), (
            f"request {request}: the fp8_e5m2 cache does not hold e5m2 values")


@pytest.mark.gpu
@pytest.mark.kvgate_kernel(family="flashinfer_decode", kv="fp8_e4m3")
@pytest.mark.xfail(strict=True, reason=(
    "vLLM 0.26.0's FLASHINFER on SM90 without XQA (no NVIDIA artifactory, no flashinfer-cubin: the lent H200) "
    "decodes with a bf16 query (FlashInferMetadataBuilder.get_q_data_type) yet passes q_scale=layer._q_scale_float "
    "to BatchDecodeWithPagedKVCacheWrapper.run (backends/flashinfer.py, the non-DCP decode call), and FlashInfer "
    "multiplies sm_scale by q_scale (flashinfer/decode.py run). A checkpoint q_scale or calculate_kv_scales "
    "(q_scale = amax/Q_SCALE_CONSTANT) then scales every decode logit by q_scale. Read from the source; this "
    "xfail runs the call with a calibrated q_scale"))
def test_flashinfer_sm90_decode_with_a_calibrated_q_scale(record_figures) -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the bf16-query FP8 decode with a q_scale is vLLM's SM90 path; this GPU is not SM90")
    family = FAMILIES["flashinfer_decode"]
    inputs = make_attention_inputs(_case("ragged_short", "fp8_e4m3"))
    q_scale = inputs.q_scale  # amax/448; calculate_kv_scales would give amax/200
    assert not math.isclose(q_scale, 1.0)
    prepared = _prepare(family, inputs, q_scale=q_scale)
    out = prepared.run()
    torch.cuda.synchronize(_device())
    query, keys, values = prepared.read_back()
    figures = tolerance.error_figures(out, reference.gqa_decode(query, keys, values, inputs.scale), tolerance.FP8)
    record_figures("q_scale", q_scale)
    record_figures("rel_l2", figures.rel_l2)
    assert not tolerance.problems(figures, tolerance.FP8), figures.summary()


@pytest.mark.gpu
@pytest.mark.kvgate_kernel(family="flashinfer_decode", kv="fp8_e5m2")
@pytest.mark.xfail(strict=True, reason=FLASHINFER_E5M2_REASON)
def test_flashinfer_sm90_decode_of_an_fp8_e5m2_cache(record_figures) -> None:
    """FLASHINFER's SM90 decode (bf16 query, fa2) over an fp8_e5m2 cache: does it match the reference?"""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("pins vLLM's SM90 FLASHINFER fp8_e5m2 path; this GPU is not SM90")
    family = FAMILIES["flashinfer_decode"]
    inputs = make_attention_inputs(_case("ragged_short", "fp8_e5m2"))
    prepared = _prepare(family, inputs)
    out = prepared.run()
    torch.cuda.synchronize(_device())
    query, keys, values = prepared.read_back()
    figures = tolerance.error_figures(out, reference.gqa_decode(query, keys, values, inputs.scale), tolerance.FP8)
    record_figures("provenance", prepared.provenance)
    for name, value in figures.as_dict().items():
        record_figures(name, value)
    assert not tolerance.problems(figures, tolerance.FP8), figures.summary()


def test_every_gpu_attention_family_has_cases_or_a_pin() -> None:
    """On CPU: each (family, storage kind) of the non-MLA GPU families is tested or pinned, never neither."""
    accuracy = {(p.values[0].name, p.values[1].kv_cache_dtype) for p in _accuracy_params()}
    speed = {(p.values[0].name, p.values[1]) for p in _speed_params()}
    for family in GPU_FAMILIES:
        for kv in storage_kinds(family):
            key = (family.name, kv)
            assert (key in accuracy and key in speed) != (key in PINNED), key
    negative = {p.values[0].name for p in _negative_control_params()}
    assert negative == {f.name for f in GPU_FAMILIES if "fp8_e4m3" in storage_kinds(f)}
    assert {f.name for f in GPU_FAMILIES} == {"vllm_flash_attn", "flashinfer_decode", "vllm_triton_attn",
                                              "vllm_flex_attn"}
    assert fp8.kv_torch_dtype("fp8_e5m2") == torch.float8_e5m2
    assert set(PINNED) == {("vllm_triton_attn", "fp8_e5m2"), ("flashinfer_decode", "fp8_e5m2")}


def test_each_pin_has_its_strict_xfail_marked_for_its_cell() -> None:
    """On CPU: a pinned (family, kv) selects exactly one test in its cell, a strict xfail carrying the reason."""
    import sys

    module = sys.modules[__name__]
    for (family, kv), reason in PINNED.items():
        found = []
        for name in dir(module):
            test = getattr(module, name)
            if not name.startswith("test_") or not hasattr(test, "pytestmark"):
                continue
            marks = {mark.name: mark for mark in test.pytestmark}
            kernel = marks.get("kvgate_kernel")
            if kernel and kernel.kwargs == {"family": family, "kv": kv}:
                found.append((name, marks))
        assert len(found) == 1, (family, kv, [name for name, _ in found])
        xfail = found[0][1]["xfail"]
        assert xfail.kwargs == {"strict": True, "reason": reason}, found[0][0]
