"""Each MLA decode kernel family against the float32 reference, bf16 and FP8 e4m3 KV; and its speed.

Accuracy: ragged batches (BATCH_SPECS) x heads (MLA_HEAD_COUNTS: 16 and 128, and the heads a tensor-parallel rank
runs with, MLA_RANK_HEADS: 1, 2, 8, 12, 32) x the family's page sizes x kv dtype. FP8 is
compared with the reference on the *dequantised* cache (the kernel's own error; tolerance.FP8, or
tolerance.FP8_PV for a family that multiplies P.V in FP8: FLASHMLA) and,
as figures plus a sanity bound, with the unquantised values (the quantisation error; FP8_QUANTISATION).
Where the kernel reads a quantised query (FLASHMLA FP8), the reference takes that query dequantised.
Every figure is printed and recorded as a JUnit property before anything is asserted.
Speed: BENCH_SPECS per family and kv dtype (kvgate.kernels.benchmark), into timings.json via
--kvgate-timings-dir.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os

import pytest
import torch

from kvgate.kernels import benchmark, reference, timings, tolerance
from kvgate.kernels.adapters import KernelUnavailable
from kvgate.kernels.cases import (
    BATCH_SPECS,
    BENCH_SPECS,
    MLA_HEAD_COUNTS,
    DecodeCase,
    bytes_moved,
    make_bench_inputs,
    make_inputs,
    rank_heads_of,
)
from kvgate.kernels.families import FAMILIES, KernelFamily

STORAGE_KV = ("auto", "fp8_e4m3")  # the storage kinds under test; cells fp8 and fp8_e4m3 both map to e4m3


def _on_cpu(family: KernelFamily) -> bool:
    return family.archs == ("cpu",)


def _marks(family: KernelFamily, kv: str) -> list[pytest.MarkDecorator]:
    marks = [pytest.mark.kvgate_kernel(family=family.name, kv=kv)]
    if not _on_cpu(family):
        marks.append(pytest.mark.gpu)
    return marks


def _accuracy_params():
    for family in FAMILIES.values():
        if not family.mla:
            continue
        for kv in STORAGE_KV:
            if kv not in family.kv_cache_dtypes:
                continue
            for spec in BATCH_SPECS.values():
                if spec.gpu_only and _on_cpu(family):
                    continue
                for heads in MLA_HEAD_COUNTS:
                    for page_size in family.page_sizes:
                        case = DecodeCase(spec=spec, num_heads=heads, page_size=page_size, kv_cache_dtype=kv)
                        yield pytest.param(family, case, id=f"{family.name}-{case.id}", marks=_marks(family, kv))


def _speed_params():
    for family in FAMILIES.values():
        if _on_cpu(family) or not family.mla:
            continue
        for kv in STORAGE_KV:
            if kv not in family.kv_cache_dtypes:
                continue
            for spec in BENCH_SPECS.values():
                yield pytest.param(family, kv, spec, id=f"{family.name}-{spec.name}-{kv}", marks=_marks(family, kv))


def _prepare(family: KernelFamily, inputs):
    adapter = importlib.import_module(family.module)
    try:
        return adapter.prepare(inputs, family.name)
    except KernelUnavailable as error:
        pytest.skip(f"{family.name}: {error}")


def _device(family: KernelFamily) -> torch.device:
    return torch.device("cpu") if _on_cpu(family) else torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize(("family", "case"), list(_accuracy_params()))
def test_decode_matches_reference(family: KernelFamily, case: DecodeCase, record_figures) -> None:
    device = _device(family)
    inputs = make_inputs(case, device)
    prepared = _prepare(family, inputs)
    out = prepared.run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    query = prepared.reference_query if prepared.reference_query is not None else inputs.query
    ref = reference.mla_decode(query, inputs.cache, inputs.sm_scale)
    bound = tolerance.for_kernel(inputs.kv_dtype, fp8_pv=family.fp8_pv,
                                 bf16_scores=case.num_heads in family.bf16_scores_heads)
    figures = tolerance.error_figures(out, ref, bound)
    record_figures("provenance", prepared.provenance)
    record_figures("cuda_visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    if rank_heads_of(case.num_heads):
        record_figures("heads_of_a_rank", rank_heads_of(case.num_heads))
    record_figures("tolerance", f"{bound.name}: rel_l2<={bound.max_rel_l2} cos_diff<{bound.max_cos_diff} "
                                f"atol={bound.atol} rtol={bound.rtol}")
    for name, value in figures.as_dict().items():
        record_figures(name, value)
    found = tolerance.problems(figures, bound)
    if inputs.is_fp8:
        exact_ref = reference.mla_decode(inputs.query, inputs.exact_cache, inputs.sm_scale)  # unquantised query
        quantisation = tolerance.error_figures(out, exact_ref, tolerance.FP8_QUANTISATION)
        for name, value in quantisation.as_dict().items():
            record_figures(f"vs_unquantised_{name}", value)
        found += tolerance.problems(quantisation, tolerance.FP8_QUANTISATION)
    assert not found, f"{family.name} {case.id}: " + "; ".join(found) + f" [{figures.summary()}]"


@pytest.mark.parametrize(("family", "kv", "spec"), list(_speed_params()))
def test_decode_speed(family: KernelFamily, kv: str, spec, record_figures, timings_dir, worker_id_or_main) -> None:
    device = _device(family)
    inputs = make_bench_inputs(spec, kv, device)
    prepared = _prepare(family, inputs)
    out = prepared.run()
    assert bool(torch.isfinite(out).all()), f"{family.name} produced non-finite output on {spec.name}"
    repeats = benchmark.repeats_from_env()
    measured = benchmark.time_launch(prepared.run, device, repeats)
    moved = bytes_moved(inputs)
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
    # Faster than the device can copy means the launch did not do the work (or the clock is wrong).
    assert achieved <= 1.25 * copy, f"{achieved:.0f} GB/s is above the device's copy bandwidth {copy:.0f} GB/s"


def _negative_control_params():
    for name in ("flashinfer_mla_fa3", "vllm_triton_mla", "vllm_flashmla"):
        family = FAMILIES[name]
        for heads in (16, *family.bf16_scores_heads):  # and under the looser bound of a bf16-scores path
            case = DecodeCase(spec=BATCH_SPECS["ragged_short"], num_heads=heads, page_size=family.page_sizes[-1],
                              kv_cache_dtype="fp8_e4m3")
            yield pytest.param(family, case, id=f"{family.name}-{case.id}", marks=_marks(family, "fp8_e4m3"))


@pytest.mark.parametrize(("family", "case"), list(_negative_control_params()))
def test_a_wrong_kv_scale_is_caught(family: KernelFamily, case: DecodeCase, record_figures) -> None:
    """Negative control: the kernel is handed a k_scale 10 % off; the accuracy check must notice."""
    device = _device(family)
    inputs = make_inputs(case, device)
    wrong = dataclasses.replace(inputs, cache=dataclasses.replace(inputs.cache, scale=inputs.cache.scale * 1.1))
    prepared = _prepare(family, wrong)
    out = prepared.run()
    torch.cuda.synchronize(device)
    query = prepared.reference_query if prepared.reference_query is not None else inputs.query
    ref = reference.mla_decode(query, inputs.cache, inputs.sm_scale)
    bound = tolerance.for_kernel(inputs.kv_dtype, fp8_pv=family.fp8_pv,  # the bound the accuracy test applies
                                 bf16_scores=case.num_heads in family.bf16_scores_heads)
    figures = tolerance.error_figures(out, ref, bound)
    record_figures("rel_l2", figures.rel_l2)
    assert tolerance.problems(figures, bound), f"a 10 % scale error went unnoticed: {figures.summary()}"
