"""kvgate's log readers on real vLLM GPU engine logs: the H200 run of every sm90 cell (tests/fixtures/h200_run/).

The lines were quoted from vLLM pull requests before a GPU engine ever ran under kvgate (runs/gpu-backend-lines.log);
these are the engine's own, from vLLM 0.26.0 on an H200.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from fixture_archives import extract_data
from kvgate.runners.engine.backend_check import backend_mismatch
from kvgate.runners.engine.log import failure_cause, read_backend_evidence, read_kv_cache_tokens

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def h200_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("h200")
    with tarfile.open(FIXTURES / "h200_run" / "run.tar.xz") as archive:
        extract_data(archive, root)
    return root / "run"


def cells(run: Path) -> list[Path]:
    return sorted(p for p in run.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_the_trimmed_lines_name_each_cells_backend_and_no_moe_or_prefill_backend() -> None:
    text = (FIXTURES / "runs" / "h200-engine-lines.log").read_text(encoding="utf-8")
    chosen = read_backend_evidence(text).chosen
    assert chosen == ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "FLASHMLA", "FLASH_ATTN_MLA",
                      "TRITON_MLA")
    assert "Using FLASH_ATTN MLA prefill backend." in text and "Using TRITON Unquantized MoE backend" in text
    assert read_kv_cache_tokens(text)[:2] == [1_891_648, 3_783_312]


def test_every_engine_that_started_logged_the_cells_backend_and_nothing_else(h200_run: Path) -> None:
    started = 0
    for cell_dir in cells(h200_run):
        cell = json.loads((cell_dir / "cell.json").read_text())
        log = (cell_dir / "logs" / "accuracy.log").read_text(errors="replace")
        status = json.loads((cell_dir / "status.json").read_text())
        evidence = read_backend_evidence(log)
        if status["accuracy"]["status"] != "ok":
            assert "Engine core initialization failed" in log, cell_dir.name
            continue
        started += 1
        assert evidence.chosen == (cell["backend"],), cell_dir.name
        assert backend_mismatch(cell["backend"], "sm90", evidence, status["accuracy"]["engine_backends"]) is None
    assert started == 12  # the two fp8_e5m2 cells cannot start on vLLM 0.26.0 (matrix/waivers.toml)


def test_fp8_cells_hold_one_byte_caches_with_twice_the_tokens(h200_run: Path) -> None:
    tokens, element_bytes = {}, {}
    for cell_dir in cells(h200_run):
        status = json.loads((cell_dir / "status.json").read_text())
        if status["accuracy"]["status"] != "ok":
            continue
        evidence = status["accuracy"]["kv_cache"]
        log = (cell_dir / "logs" / "accuracy.log").read_text(errors="replace")
        assert read_kv_cache_tokens(log)[-1] == evidence["tokens"], cell_dir.name
        tokens[cell_dir.name] = evidence["tokens"]
        element_bytes[cell_dir.name] = evidence["element_bytes"]
    for name, size in element_bytes.items():
        assert size == ([2] if "-auto-" in name else [1]), name
    for fp8 in [n for n in tokens if "-fp8-" in n]:
        ratio = tokens[fp8] / tokens[fp8.replace("-fp8-", "-auto-")]
        assert 1.9 < ratio < 2.3, (fp8, ratio)


@pytest.mark.parametrize(("cell", "log", "cause"), [
    ("triton_attn-fp8_e5m2-sm90", "accuracy.log", 'AssertionError: assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}'),
    ("flashinfer-fp8_e5m2-sm90", "accuracy.log", "ValueError: The dtype of q torch.float8_e4m3fn does not match the "
                                                 "q_data_type torch.float8_e5m2 specified in plan function."),
    ("flex_attention-auto-sm90", "throughput.log", "AssertionError: Error in memory profiling. Initial free memory "
                                                   "136.49 GiB, current free memory 138.27 GiB."),
])
def test_a_failed_engines_root_cause_is_read_from_its_log(h200_run: Path, cell: str, log: str, cause: str) -> None:
    text = (h200_run / cell / "logs" / log).read_text(errors="replace")
    assert "RuntimeError: Engine core initialization failed. See root cause above." in text
    assert failure_cause(text).startswith(cause)


def test_a_healthy_engines_log_names_no_cause(h200_run: Path) -> None:
    assert failure_cause((h200_run / "triton_mla-fp8-sm90" / "logs" / "accuracy.log").read_text()) is None


def test_only_the_memory_profiling_race_earns_a_second_start(h200_run: Path) -> None:
    """A stage starts an engine once more only when vLLM refused to start because another engine on the GPU freed
    memory while it profiled (the H200's real logs): never for a cell's own failure, never for a healthy log."""
    from kvgate.runners.engine.infrastructure import infrastructure_failure

    raced = (h200_run / "flex_attention-auto-sm90" / "logs" / "throughput.log").read_text(errors="replace")
    assert infrastructure_failure(raced).startswith(
        "vLLM's memory profiling saw another process free GPU memory (two engines started on one GPU at once): "
        "AssertionError: Error in memory profiling. Initial free memory 136.49 GiB, current free memory 138.27 GiB. "
        "This happens when other processes sharing the same container release GPU memory")
    assert infrastructure_failure((h200_run / "triton_attn-fp8_e5m2-sm90" / "logs" / "accuracy.log").read_text(
        errors="replace")) is None
    assert infrastructure_failure((h200_run / "triton_mla-fp8-sm90" / "logs" / "accuracy.log").read_text()) is None
