"""Error figures and tolerance checks, on CPU."""

from __future__ import annotations

import pytest
import torch

from kvgate.kernels import tolerance


def test_figures_of_identical_tensors() -> None:
    x = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(0))
    figures = tolerance.error_figures(x, x, tolerance.BF16)
    assert (figures.max_abs, figures.rel_l2, figures.outside_tolerance, figures.nonfinite) == (0.0, 0.0, 0, 0)
    assert figures.cosine == pytest.approx(1.0) and figures.cos_diff == pytest.approx(0.0, abs=1e-12)
    assert tolerance.problems(figures, tolerance.BF16) == []


def test_bf16_rounding_passes_and_a_wrong_scale_fails() -> None:
    ref = torch.randn(8, 16, 512, generator=torch.Generator().manual_seed(1))
    rounded = ref.to(torch.bfloat16)
    assert tolerance.problems(tolerance.error_figures(rounded, ref, tolerance.BF16), tolerance.BF16) == []
    found = tolerance.problems(tolerance.error_figures(ref * 1.1, ref, tolerance.BF16), tolerance.BF16)
    assert any(p.startswith("rel-L2 0.1 > 0.004 (bf16-kv)") for p in found), found


def test_vllm_cos_diff_formula() -> None:
    x, y = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])
    figures = tolerance.error_figures(x, y, tolerance.FP8)
    assert figures.cos_diff == pytest.approx(1 - 2 * (1 + 5) / (1 + 4 + 1 + 6.25))


def test_nonfinite_and_shape_mismatch() -> None:
    figures = tolerance.error_figures(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, 1.0]), tolerance.FP8)
    assert tolerance.problems(figures, tolerance.FP8)[0] == "1 non-finite output elements"
    with pytest.raises(ValueError, match=r"output shape \(2,\) != reference shape \(3,\)"):
        tolerance.error_figures(torch.ones(2), torch.ones(3), tolerance.FP8)


def test_fp8_dtypes_get_the_fp8_bound() -> None:
    assert tolerance.for_kv_dtype(torch.float8_e4m3fn) is tolerance.FP8
    assert tolerance.for_kv_dtype(torch.bfloat16) is tolerance.BF16
