"""Writing a cell's folder: stages replaced whole, a failed re-run keeps the old outputs, status merged."""

from __future__ import annotations

import json
import stat

import pytest

from kvgate.results import cell_folder
from kvgate.results.records import CONTRACT_VERSION

RECORD = {"cell_id": "cpu_attn-fp8-cpu", "backend": "CPU_ATTN", "kv_cache_dtype": "fp8", "arch": "cpu", "model": "m"}


def test_prepare_cell_writes_versioned_identity(tmp_path):
    cell_dir = cell_folder.prepare_cell(tmp_path, RECORD)
    assert cell_dir == tmp_path / "cpu_attn-fp8-cpu"
    assert json.loads((cell_dir / "cell.json").read_text()) == {"contract_version": CONTRACT_VERSION, **RECORD}
    assert stat.S_IMODE((cell_dir / "cell.json").stat().st_mode) == 0o644


def test_stage_output_replaces_the_stage_whole(tmp_path):
    cell_dir = cell_folder.prepare_cell(tmp_path, RECORD)
    with cell_folder.stage_output(cell_dir, "accuracy") as out:
        (out / "first.json").write_text("1")
    with cell_folder.stage_output(cell_dir, "accuracy") as out:
        (out / "second.json").write_text("2")
    assert sorted(p.name for p in (cell_dir / "accuracy").iterdir()) == ["second.json"]
    assert stat.S_IMODE((cell_dir / "accuracy").stat().st_mode) == 0o755
    assert [p.name for p in cell_dir.iterdir() if p.name.startswith(".accuracy")] == []


def test_a_crashed_rerun_keeps_the_previous_outputs_and_leaves_no_partial_folder(tmp_path):
    cell_dir = cell_folder.prepare_cell(tmp_path, RECORD)
    with cell_folder.stage_output(cell_dir, "throughput") as out:
        (out / "repeat-1.json").write_text("{}")
    with pytest.raises(RuntimeError), cell_folder.stage_output(cell_dir, "throughput") as out:
        (out / "half.json").write_text("{")
        raise RuntimeError("engine died")
    assert [p.name for p in (cell_dir / "throughput").iterdir()] == ["repeat-1.json"]
    assert [p.name for p in cell_dir.iterdir() if p.name.startswith(".throughput")] == []


def test_status_entries_merge_per_stage(tmp_path):
    cell_dir = cell_folder.prepare_cell(tmp_path, RECORD)
    cell_folder.write_status(cell_dir, "accuracy", "ok")
    cell_folder.write_status(cell_dir, "throughput", "timeout", reason="ran past 600 s", log_tail="...")
    cell_folder.write_status(cell_dir, "accuracy", "error", reason="engine crashed")
    assert json.loads((cell_dir / "status.json").read_text()) == {
        "accuracy": {"status": "error", "reason": "engine crashed"},
        "throughput": {"status": "timeout", "reason": "ran past 600 s", "log_tail": "..."},
    }


def test_status_must_be_a_contract_value(tmp_path):
    with pytest.raises(ValueError, match="status must be one of"):
        cell_folder.write_status(tmp_path, "accuracy", "passed")
