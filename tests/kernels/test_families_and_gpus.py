"""Which kernel families test which cell; GPU pinning of xdist workers. Stdlib code, on CPU."""

from __future__ import annotations

import pytest

from kvgate.kernels import families, gpus
from kvgate.matrix import cells as matrix


def test_every_mla_cell_has_a_family_or_a_reason() -> None:
    for cell in matrix.load().cells:
        plan = families.kernels_for_cell(cell.backend, cell.kv_cache_dtype, cell.arch, cell.mla)
        assert bool(plan.families) != bool(plan.skip_reason), cell.id
        for family in plan.families:
            assert cell.arch in family.archs and cell.kv_cache_dtype in family.kv_cache_dtypes


@pytest.mark.parametrize(("backend", "dtype", "arch", "families_", "reason"), [
    ("TRITON_MLA", "fp8", "sm90", ("vllm_triton_mla",), None),
    ("FLASHINFER_MLA", "fp8", "sm100", ("flashinfer_trtllm_mla",), None),
    ("CPU_MLA", "auto", "cpu", ("vllm_cpu_mla",), None),
    ("CPU_ATTN", "fp8", "cpu", ("vllm_cpu_attn",), None),
    ("CPU_MLA", "fp8", "cpu", (), "no kernel family of CPU_MLA has a fp8 KV path"),
    ("FLASHINFER_MLA", "auto", "sm90", (), "no kernel family of FLASHINFER_MLA runs on sm90"),
    ("FLASHMLA", "fp8", "sm90", ("vllm_flashmla",), None),
    ("FLASH_ATTN_MLA", "fp8", "sm90", (), "no kernel family of FLASH_ATTN_MLA has a fp8 KV path"),
    ("CUTLASS_MLA", "fp8", "sm100", (), families.NO_FAMILY_REASONS["CUTLASS_MLA"]),
    ("NEW_MLA", "auto", "sm90", (), "kvgate has no kernel adapter for the MLA backend NEW_MLA yet"),
])
def test_kernels_for_cell(backend, dtype, arch, families_, reason) -> None:
    plan = families.kernels_for_cell(backend, dtype, arch, mla=True)
    assert tuple(f.name for f in plan.families) == families_ and plan.skip_reason == reason


def test_a_non_mla_backend_without_a_family_says_so() -> None:
    plan = families.kernels_for_cell("NEW_ATTN", "fp8", "sm90", mla=False)
    assert plan.skip_reason == ("kvgate has no kernel adapter for the non-MLA backend NEW_ATTN yet (its accuracy and "
                                "throughput stages still run)")


# Every sm90 cell of the matrix and the families that test it (issue 12: a kernel test for every SM90 cell); fp8_e4m3
# is fp8 on CUDA, so matrix/exclusions.toml keeps one of the two.
SM90_CELLS = {
    "flashmla-auto-sm90": ("vllm_flashmla",), "flashmla-fp8-sm90": ("vllm_flashmla",),
    "flash_attn_mla-auto-sm90": ("vllm_flash_attn_mla",),
    "triton_mla-auto-sm90": ("vllm_triton_mla",), "triton_mla-fp8-sm90": ("vllm_triton_mla",),
    "flash_attn-auto-sm90": ("vllm_flash_attn",), "flash_attn-fp8-sm90": ("vllm_flash_attn",),
    "flashinfer-auto-sm90": ("flashinfer_decode",), "flashinfer-fp8-sm90": ("flashinfer_decode",),
    "flashinfer-fp8_e5m2-sm90": ("flashinfer_decode",),
    "triton_attn-auto-sm90": ("vllm_triton_attn",), "triton_attn-fp8-sm90": ("vllm_triton_attn",),
    "triton_attn-fp8_e5m2-sm90": ("vllm_triton_attn",),
    "flex_attention-auto-sm90": ("vllm_flex_attn",),
}


def test_every_sm90_cell_has_a_kernel_family() -> None:
    sm90 = [c for c in matrix.load().cells if c.arch == "sm90"]
    cells = {c.id: c for c in sm90 if c.feature is None}
    assert set(cells) == set(SM90_CELLS), "the matrix's sm90 cells changed; map the new ones here"
    for cell_id, expected in SM90_CELLS.items():
        cell = cells[cell_id]
        plan = families.kernels_for_cell(cell.backend, cell.kv_cache_dtype, cell.arch, cell.mla)
        assert tuple(f.name for f in plan.families) == expected and plan.skip_reason is None, cell_id
    # a feature's cell (spec_decode, tp2: matrix/axes.toml) runs the kernels of the plain cell it varies
    variants = [c for c in sm90 if c.feature is not None]
    assert variants
    for cell in variants:
        plain = cell.id.removesuffix(f"-{cell.feature.name}")
        plan = families.kernels_for_cell(cell.backend, cell.kv_cache_dtype, cell.arch, cell.mla)
        assert tuple(f.name for f in plan.families) == SM90_CELLS[plain], cell.id


def test_storage_kinds() -> None:
    assert families.storage_kinds(families.FAMILIES["vllm_triton_attn"]) == ("auto", "fp8_e4m3", "fp8_e5m2")
    assert families.storage_kinds(families.FAMILIES["vllm_flash_attn"]) == ("auto", "fp8_e4m3")
    assert families.storage_kinds(families.FAMILIES["vllm_flex_attn"]) == ("auto",)
    assert [f.name for f in families.FAMILIES.values() if f.fp8_pv] == ["vllm_flashmla", "vllm_flash_attn", "vllm_triton_attn"]


@pytest.mark.parametrize(("worker", "devices", "expected"), [
    ("gw0", ["0", "1"], "0"), ("gw1", ["0", "1"], "1"), ("gw2", ["0", "1"], "0"),
    ("gw1", ["4", "6"], "6"), (None, ["0"], None), ("main", ["0"], None), ("gw0", [], None),
])
def test_device_for_worker(worker, devices, expected) -> None:
    assert gpus.device_for_worker(worker, devices) == expected


def test_pin_this_worker_sets_visible_devices_once() -> None:
    env = {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert gpus.pin_this_worker(env) == "3"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert gpus.pin_this_worker(env) == "3" and env["CUDA_VISIBLE_DEVICES"] == "3"  # not re-pinned to "3"[1 % 1]
