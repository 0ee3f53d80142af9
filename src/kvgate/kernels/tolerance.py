"""How close a decode kernel's output must be to the float32 reference, per KV dtype, and why.

Every check reports the same figures (`ErrorFigures`): element-wise (max |out - ref|, that over
max |ref|, elements outside atol + rtol*|ref|) and whole-tensor (relative L2 error, cosine similarity,
and vLLM's cosine difference ``1 - 2*sum(x*y) / sum(x^2 + y^2)``).

The bounds (`TOLERANCES`), with their reasons:
- bf16 KV: the kernel writes a bf16 output (a relative rounding step of 2^-8) and multiplies P.V with
  P rounded to bf16. Measured on the H200 (FlashInfer fa2/fa3, heads 16/128, pages 1/32/64, ragged
  1-8k): rel-L2 0.0021-0.0023, max abs / max |ref| 0.29-0.50 %, every element within 1e-2 + 1e-2*|ref|.
  Bound: rel-L2 <= 0.004 (1.7x the worst seen), vLLM's bf16 cosine difference < 1e-5
  (tests/kernels/attention/test_cutlass_mla_decode.py), atol = rtol = 1e-2.
- FP8 KV, against the *dequantised* reference: the kernel rounds the same way as bf16 and, on top,
  may keep the dequantised cache or P in lower precision. Measured on the H200 with one shared scale:
  rel-L2 0.0022-0.0069, max abs / max |ref| 0.48-0.75 %, every element within 1e-2 + 1e-2*|ref|.
  Bound: rel-L2 <= 0.012 (1.7x the worst seen), vLLM's FP8 cosine difference < 1e-4
  (test_cutlass_mla_decode.py, test_flashmla.py), atol = rtol = 2e-2 element-wise (the 1e-2 seen on
  FlashInfer has no margin for other kernels; vLLM's own non-MLA FP8 KV test allows 4e-2/6e-2).
- FP8 KV with an FP8 query and P.V in FP8 (`FP8_PV`, families with ``fp8_pv``: FA3 FP8, vLLM's Triton
  attention once vLLM quantises the query, vLLM's FlashMLA dense FP8): the kernel rounds the unnormalised softmax weights
  exp(s - max) to e4m3 (3 mantissa bits, subnormal below 2^-6) before P.V. Modelled on the CPU on the
  test's own cases (reference.gqa_decode(round_p_to=e4m3) against the plain reference on the dequantised
  FP8 query and cache; 32 query / 8 KV heads, head dim 128): rel-L2 0.0099 (ragged_short) and 0.0148
  (ragged_long), cosine difference 4.9e-5 and 1.1e-4, max abs 1.1 % / 1.5 % of max |ref|: ragged_long
  breaks FP8's bound by the model alone. Bound: rel-L2 <= 0.03 and cosine difference < 4e-4 (2x and
  3.7x the modelled worst), element-wise vLLM's own bound for an FP8 query with a bf16 output, rtol 4e-2 /
  atol 6e-2 (its trtllm attention tests); vLLM's FA3 and Triton FP8 tests compare with the unquantised
  values at atol = rtol = 0.15. The negative control (k_scale 10 % off) moves ragged_short by rel-L2
  0.050, cosine difference 1.2e-3, 254 elements outside atol/rtol: caught on all three. Measured on the H200
  (2026-12-03, vLLM 0.26.0, FLASH_ATTN and TRITON_ATTN FP8 at TP 1's heads and a tensor-parallel rank's): the
  model's figures to the third digit, rel-L2 0.0087-0.0222. The largest is kvgate's tiny Llama at TP 2 (2 query and
  2 KV heads of 64 dims, ragged_long): modelled 0.0222, cosine difference 2.46e-4, measured 0.0221 and 2.45e-4, so
  that case keeps 1.35x and 1.6x of the bound (the kernel and its inputs are deterministic; the model says the same
  figure for every run). tests/kernels/test_tolerance.py recomputes the model.
  The same model on the MLA cases (reference.mla_decode(round_p_to=e4m3) on the dequantised FP8 query and
  cache; 576-dim rows, 512-dim values, heads 16/128, ragged_short and ragged_long): rel-L2 0.0092-0.0123,
  cosine difference 4.2e-5-7.6e-5, max abs 0.99-1.66 % of max |ref|, worst element at 0.73 of FP8_PV's
  atol + rtol*|ref|; it breaks FP8's element-wise 2e-2 on 8-343 elements. Measured on the H200
  (2026-12-01, vLLM 0.26.0 FlashMLA FP8, whose P.V is an e4m3 WGMMA): the same maxima and 21/339/8/333
  elements outside 2e-2, rel-L2 0.0088-0.0110, cosine difference <= 6e-5, so FLASHMLA FP8 is judged by
  FP8_PV. Its negative control (one latent k_scale 10 % off moves Q.K and P.V) models at rel-L2 0.155-0.177
  (>= 5x the bound), cosine difference >= 0.0104 (26x), thousands of elements outside.
- Scores summed in bf16 (`BF16_SCORES`, a family's ``bf16_scores_heads``): vLLM's Triton decode kernel for one
  query head a KV head (triton_decode_attention.py, `_fwd_kernel_stage1`, which `decode_attention_fwd` takes when
  kv_group_num == 1) computes each score as `tl.sum(q[None, :] * k, 1)` on bf16 operands, where the grouped kernel
  of two heads or more uses `tl.dot` with a float32 accumulator. TRITON_MLA meets it where a rank holds one query
  head (the latent cache is one KV head): kvgate's tiny DeepSeek-V2 at TP 2, DeepSeek-V2-Lite at TP 16. Measured on
  the H200 (2026-12-03, vLLM 0.26.0, the MLA cases at one head, pages 16/32/64): rel-L2 0.0046-0.0103 (bf16 and FP8
  cache alike) against 0.0012-0.0017 (bf16) and 0.0024-0.0035 (FP8) at two heads or more, cosine difference up to
  5.3e-5, up to 126 elements outside bf16's 1e-2: bf16's bound fails on all six bf16 cases. Modelled on the CPU
  (reference.mla_decode(bf16_scores=True): every product rounded to bf16, summed pairwise in bf16) on the same cases:
  rel-L2 0.0052-0.0161, cosine difference up to 1.3e-4, max abs up to 1.6 % of max |ref| (ragged_short page 16:
  124 elements outside 1e-2; measured 126). Bound: rel-L2 <= 0.03 and cosine difference < 3e-4 (1.9x and 2.3x the
  modelled worst), atol = rtol = 4e-2. One latent k_scale 10 % off still models at rel-L2 >= 0.14 and cosine
  difference >= 0.010 on the FP8 cases (4.7x and 34x).
- FP8 KV against the unquantised values (``quantisation`` figures): e4m3 keeps 3 mantissa bits, so the
  output moves by rel-L2 0.033-0.067 (measured). Only a sanity bound (rel-L2 <= 0.15): a wrong or
  missing scale gives an error of order 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class Tolerance:
    name: str
    atol: float
    rtol: float
    max_rel_l2: float
    max_cos_diff: float
    reason: str


BF16 = Tolerance(name="bf16-kv", atol=1e-2, rtol=1e-2, max_rel_l2=0.004, max_cos_diff=1e-5,
                 reason="bf16 output and bf16 P.V; H200 measured rel-L2 <= 0.0023, all within 1e-2")
FP8 = Tolerance(name="fp8-kv-vs-dequantised", atol=2e-2, rtol=2e-2, max_rel_l2=0.012, max_cos_diff=1e-4,
                reason="as bf16 plus low-precision dequantised operands; H200 measured rel-L2 <= 0.0069; "
                       "vLLM's FP8 MLA tests bound the cosine difference by 1e-4")
FP8_QUANTISATION = Tolerance(name="fp8-kv-vs-unquantised", atol=float("inf"), rtol=float("inf"),
                             max_rel_l2=0.15, max_cos_diff=1e-2,
                             reason="e4m3 rounding of the cache itself moves the output by rel-L2 0.03-0.07; "
                                    "a wrong scale moves it by ~1")


FP8_PV = Tolerance(name="fp8-kv-fp8-pv-vs-dequantised", atol=6e-2, rtol=4e-2, max_rel_l2=0.03, max_cos_diff=4e-4,
                   reason="FP8 query and P.V in FP8 (softmax weights rounded to e4m3): modelled rel-L2 <= 0.0148, "
                          "cos-diff <= 1.1e-4 on the test cases; element-wise vLLM's FP8-query rtol 4e-2 / atol 6e-2; "
                          "FlashMLA FP8 on the H200 (MLA): rel-L2 <= 0.0110, as modelled")


BF16_SCORES = Tolerance(name="bf16-scores", atol=4e-2, rtol=4e-2, max_rel_l2=0.03, max_cos_diff=3e-4,
                        reason="scores as bf16 products summed in bf16 (vLLM's Triton decode kernel at one query head "
                               "a KV head): modelled rel-L2 <= 0.0161, cos-diff <= 1.3e-4; TRITON_MLA on the H200 at "
                               "one head: rel-L2 <= 0.0103, bf16 and FP8 caches alike")


def for_kv_dtype(dtype: torch.dtype) -> Tolerance:
    return FP8 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else BF16


def for_kernel(dtype: torch.dtype, *, fp8_pv: bool, bf16_scores: bool = False) -> Tolerance:
    """The bound of a kernel reading a `dtype` cache; `fp8_pv`: the family multiplies P.V in FP8; `bf16_scores`: the
    case runs a kernel path that sums its scores in bf16 (any cache dtype)."""
    if bf16_scores:
        return BF16_SCORES
    bound = for_kv_dtype(dtype)
    return FP8_PV if bound is FP8 and fp8_pv else bound


@dataclass(frozen=True, kw_only=True, slots=True)
class ErrorFigures:
    max_abs: float
    max_abs_over_max_ref: float
    rel_l2: float
    cosine: float
    cos_diff: float  # vLLM's: 1 - 2*sum(x*y)/sum(x^2+y^2)
    elements: int
    outside_tolerance: int  # elements with |out - ref| > atol + rtol*|ref|
    nonfinite: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def summary(self) -> str:
        return (f"max_abs={self.max_abs:.3g} ({100 * self.max_abs_over_max_ref:.2f}% of max|ref|) "
                f"rel_l2={self.rel_l2:.4g} cosine={self.cosine:.7f} cos_diff={self.cos_diff:.3g} "
                f"outside={self.outside_tolerance}/{self.elements} nonfinite={self.nonfinite}")


def error_figures(out: torch.Tensor, ref: torch.Tensor, tolerance: Tolerance) -> ErrorFigures:
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    x = out.detach().double().flatten()
    y = ref.detach().double().flatten().to(x.device)
    nonfinite = int((~torch.isfinite(x)).sum())
    diff = (x - y).abs()
    ref_max = float(y.abs().max()) if y.numel() else 0.0
    norm_y = float(y.norm())
    dot = float((x * y).sum())
    squares = float((x * x).sum() + (y * y).sum())
    norms = float(x.norm()) * norm_y
    outside = int((~(diff <= tolerance.atol + tolerance.rtol * y.abs())).sum())
    return ErrorFigures(
        max_abs=float(diff.max()) if diff.numel() else 0.0,
        max_abs_over_max_ref=float(diff.max()) / ref_max if ref_max else float("inf"),
        rel_l2=float((x - y).norm()) / norm_y if norm_y else float("inf"),
        cosine=dot / norms if norms else 0.0,
        cos_diff=1.0 - 2.0 * dot / squares if squares else 0.0,
        elements=int(x.numel()),
        outside_tolerance=outside,
        nonfinite=nonfinite,
    )


def problems(figures: ErrorFigures, tolerance: Tolerance) -> list[str]:
    """Every bound the figures break, worded for a test failure; empty when within tolerance."""
    found = []
    if figures.nonfinite:
        found.append(f"{figures.nonfinite} non-finite output elements")
    if not figures.rel_l2 <= tolerance.max_rel_l2:
        found.append(f"rel-L2 {figures.rel_l2:.4g} > {tolerance.max_rel_l2} ({tolerance.name})")
    if not figures.cos_diff < tolerance.max_cos_diff:
        found.append(f"cosine difference {figures.cos_diff:.3g} >= {tolerance.max_cos_diff} ({tolerance.name})")
    if figures.outside_tolerance:
        found.append(f"{figures.outside_tolerance} of {figures.elements} elements outside "
                     f"atol={tolerance.atol} rtol={tolerance.rtol} ({tolerance.name})")
    return found
