"""FP8 quantisation with per-tensor scales, and the vLLM <-> FlashInfer scale mapping, on CPU."""

from __future__ import annotations

import pytest
import torch

from kvgate.kernels import fp8, reference
from kvgate.kernels.cases import BATCH_SPECS, SM_SCALE, DecodeCase, make_inputs


@pytest.mark.parametrize(("dtype", "fp8_max", "relative_step"),
                         [(torch.float8_e4m3fn, 448.0, 2 ** -3), (torch.float8_e5m2, 57344.0, 2 ** -2)])
def test_round_trip_error_is_half_a_step(dtype, fp8_max, relative_step) -> None:
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3
    scale = fp8.per_tensor_scale(x, dtype=dtype)
    assert scale == pytest.approx(float(x.abs().max()) / fp8_max)
    back = fp8.dequantize(fp8.quantize(x, scale, dtype), scale)
    normal = x.abs() > scale * torch.finfo(dtype).smallest_normal * 4
    relative = ((back - x).abs() / x.abs())[normal]
    assert float(relative.max()) <= relative_step / 2 + 1e-6
    assert float(back.abs().max()) == pytest.approx(float(x.abs().max()), rel=relative_step)


def test_quantize_saturates_instead_of_overflowing() -> None:
    q = fp8.quantize(torch.tensor([1e6, -1e6, 1.0]), scale=1.0)
    assert q.float().tolist() == [448.0, -448.0, 1.0]


def test_bad_scales_are_refused() -> None:
    with pytest.raises(ValueError, match=r"scale must be a finite positive number, got 0\.0"):
        fp8.quantize(torch.ones(2), 0.0)
    with pytest.raises(ValueError, match="cannot scale a tensor holding inf or nan"):
        fp8.per_tensor_scale(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'fp8_e3m4'"):
        fp8.kv_torch_dtype("fp8_e3m4")


def test_vllm_bmm_scales() -> None:
    scales = fp8.VllmMlaScales(sm_scale=0.5, k_scale=0.25, q_scale=2.0)
    assert (scales.bmm1_scale, scales.bmm2_scale) == (0.25, 0.25)


def test_flashinfer_mapping_round_trips() -> None:
    vllm = fp8.VllmMlaScales(sm_scale=SM_SCALE, k_scale=0.0123)
    mapped = fp8.to_flashinfer(vllm.bmm1_scale, vllm.bmm2_scale)
    assert mapped.sm_scale == pytest.approx(SM_SCALE)
    assert mapped.ckv_scale == mapped.kpe_scale == 0.0123
    assert fp8.from_flashinfer(mapped) == pytest.approx((vllm.bmm1_scale, vllm.bmm2_scale))
    with pytest.raises(ValueError, match="one latent scale"):
        fp8.from_flashinfer(fp8.FlashInferKvScales(sm_scale=1.0, ckv_scale=1.0, kpe_scale=2.0))


def test_bmm_scale_decode_equals_dequantised_decode() -> None:
    """vLLM's trtllm-gen convention (raw fp8 values, bmm1/bmm2) computes what FlashInfer's does
    (dequantise with ckv/kpe scales, then sm_scale): the mapping is exact, not approximate."""
    case = DecodeCase(spec=BATCH_SPECS["ragged_short"], num_heads=4, page_size=32, kv_cache_dtype="fp8")
    inputs = make_inputs(case)
    assert inputs.cache.scale != 1.0
    scales = inputs.scales
    via_bmm = reference.mla_decode_bmm_scales(inputs.query, inputs.cache, scales.bmm1_scale, scales.bmm2_scale)
    mapped = fp8.to_flashinfer(scales.bmm1_scale, scales.bmm2_scale)
    via_dequant = reference.mla_decode(inputs.query, inputs.cache, mapped.sm_scale)
    torch.testing.assert_close(via_bmm, via_dequant, rtol=1e-5, atol=1e-5)
    # and a wrong convention (bmm2 left out) is far off: the check can fail
    wrong = reference.mla_decode_bmm_scales(inputs.query, inputs.cache, scales.bmm1_scale, 1.0)
    assert float((wrong - via_dequant).norm() / via_dequant.norm()) > 0.5


def test_fp8_cache_is_close_to_the_exact_values() -> None:
    case = DecodeCase(spec=BATCH_SPECS["ragged_short"], num_heads=4, page_size=1, kv_cache_dtype="fp8_e4m3")
    inputs = make_inputs(case)
    deq = inputs.cache.dequantized().kv
    rel = float((deq - inputs.exact_cache.kv).norm() / inputs.exact_cache.kv.norm())
    assert 0.005 < rel < 0.05  # e4m3: 3 mantissa bits
