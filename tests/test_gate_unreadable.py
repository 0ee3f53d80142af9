"""An unreadable folder inside a cell is that cell's error (one ERROR line, exit 1), never a traceback."""

from __future__ import annotations

import errno
import json
import os
import pathlib

import pytest

import synthetic_run
from kvgate.cli import main
from kvgate.results.parsers import reading


def test_unreadable_folder_is_one_error_line(tmp_path, monkeypatch, capsys):
    run = synthetic_run.write_seed_run(tmp_path / "run")
    blocked = next(p for p in run.iterdir() if p.is_dir()) / "accuracy"
    real_scandir = os.scandir

    def scandir(path):  # root reads every folder, so the refusal is simulated where the walk meets it
        if pathlib.Path(path) == blocked:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code = main(["gate", str(run), "--out", str(tmp_path / "gate")])
    err = capsys.readouterr().err
    assert code == 1
    assert [line for line in err.splitlines() if line.startswith("ERROR ")] == [
        f"ERROR {blocked}: cannot read: Permission denied. Check the permissions of the run folder"]
    verdict = json.loads((tmp_path / "gate" / "verdict.json").read_text())
    errored = [c for c in verdict["checks"] if c["status"] == "error" and c["kind"] == "accuracy"]
    assert [c["detail"] for c in errored] == [
        f"accuracy stage unreadable: {blocked}: cannot read: Permission denied. Check the permissions of the run folder"]


def test_a_stage_folder_nested_deeper_than_pythons_recursion_limit_is_read(tmp_path, capsys):
    """A stage folder holding a chain of 1,200 folders (past Python's recursion limit of 1,000) is walked like any
    other: the run is judged as without them, not stopped by a RecursionError traceback with no report."""
    run = synthetic_run.write_seed_run(tmp_path / "run")
    top = deep = _fp8_cell(run) / "accuracy"
    for _ in range(1200):
        deep = deep / "d"
        deep.mkdir()
    try:
        assert _gate_errors(run, tmp_path, capsys) == (0, [])
        verdict = json.loads((tmp_path / "gate" / "verdict.json").read_text())
        assert [c["status"] for c in verdict["checks"]
                if c["kind"] == "fp8_accuracy" and c["subject"] == "strict-match"] == ["pass"]
    finally:
        _remove_chain(deep, top)


def _remove_chain(deepest: pathlib.Path, top: pathlib.Path) -> None:
    """Python 3.11's shutil.rmtree recurses once per level, so pytest's later clean-up of this tmp_path would stop at
    a RecursionError (and fail the next pytest session that reaches it): the chain goes bottom-up here."""
    while deepest != top:
        deepest.rmdir()
        deepest = deepest.parent


def _fp8_cell(run: pathlib.Path) -> pathlib.Path:
    return next(p for p in run.iterdir() if p.is_dir() and json.loads((p / "cell.json").read_text())[
        "kv_cache_dtype"] == "fp8")


def _gate_errors(run, tmp_path, capsys) -> tuple[int, list[str]]:
    code = main(["gate", str(run), "--out", str(tmp_path / "gate")])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR ")]


def test_seed_run_passes(tmp_path, capsys):  # the baseline of the hostile cases below
    assert _gate_errors(synthetic_run.write_seed_run(tmp_path / "run"), tmp_path, capsys) == (0, [])


@pytest.mark.parametrize(("make", "what"), [
    (lambda path: path.symlink_to("/nonexistent/status.json"), "cannot read: No such file or directory"),
    (lambda path: path.symlink_to(path.name), "cannot read: Too many levels of symbolic links"),
    (lambda path: path.symlink_to("/dev/zero"), "not a regular file (a FIFO, socket or device). "
                                                "Write the file itself at this name"),
    (lambda path: os.mkfifo(path), "not a regular file (a FIFO, socket or device). Write the file itself at this name"),
    (lambda path: path.mkdir(), "not a regular file (a folder). Write the file itself at this name"),
], ids=["dangling", "loop", "dev-zero", "fifo", "folder"])
def test_status_json_that_cannot_be_read_errors_the_cell(tmp_path, capsys, make, what):
    """A link that leads nowhere is not an absent status.json (that passed a failing cell); a FIFO or /dev/zero is never
    opened (a hang, a MemoryError)."""
    run = synthetic_run.write_seed_run(tmp_path / "run")
    status = _fp8_cell(run) / "status.json"
    make(status)
    code, errors = _gate_errors(run, tmp_path, capsys)
    assert (code, errors) == (1, [f"ERROR {status}: {what}"])
    assert (tmp_path / "gate" / "verdict.json").is_file()


@pytest.mark.parametrize("target", ["/nonexistent/run.json", "run.json"], ids=["dangling", "loop"])
def test_run_json_link_that_leads_nowhere_is_bad_input(tmp_path, capsys, target):
    run = synthetic_run.write_seed_run(tmp_path / "run")
    (run / "run.json").symlink_to(target)
    code, errors = _gate_errors(run, tmp_path, capsys)
    assert code == 2
    assert len(errors) == 1 and errors[0].startswith(f"ERROR {run}/run.json: cannot read: ")


@pytest.mark.parametrize("name", ["throughput/repeat-1.log", "kernels/timings.json", "kernels/junit.xml"])
def test_stage_file_link_that_leads_nowhere_errors_the_stage(tmp_path, capsys, name):
    run = synthetic_run.write_seed_run(tmp_path / "run")
    path = _fp8_cell(run) / name
    path.unlink(missing_ok=True)
    path.symlink_to("/nonexistent/file")
    code, errors = _gate_errors(run, tmp_path, capsys)
    assert (code, errors) == (1, [f"ERROR {path}: cannot read: No such file or directory"])


@pytest.mark.parametrize("target", ["/nonexistent/cell", "self"], ids=["dangling", "loop"])
def test_a_cell_folder_that_is_a_link_to_nothing_is_that_cells_error(tmp_path, capsys, target):
    """A planned cell's folder replaced by a link that leads nowhere: the cell fails as unreadable, and the line says
    why (it read as a cell that never ran, which failed closed but sent people looking for a run that did not fail)."""
    run = synthetic_run.write_seed_run(tmp_path / "run")
    folder = _fp8_cell(run)
    moved = folder.rename(tmp_path / "elsewhere")
    folder.symlink_to(folder.name if target == "self" else target)
    code, errors = _gate_errors(run, tmp_path, capsys)
    why = "Too many levels of symbolic links" if target == "self" else "No such file or directory"
    assert (code, errors) == (1, [f"ERROR {folder}: a link that leads nowhere ({why}), not a cell folder. Put the "
                                  "cell's folder itself at this name"])
    verdict = json.loads((tmp_path / "gate" / "verdict.json").read_text())
    assert any(c["status"] == "error" and c["cell"] == folder.name for c in verdict["checks"])
    assert moved.is_dir()


@pytest.mark.parametrize("what", ["dangling", "loop", "file"])
def test_a_stage_folder_swapped_for_a_dead_link_or_a_file_is_that_stages_error(tmp_path, capsys, what):
    """(1.18) The FP8 cell's kernels/ replaced by a link to nothing or a file: with no status.json and no plan it read
    as a stage that never ran, and the gate passed (exit 0) on the other stages; now that stage errors, named."""
    run = synthetic_run.write_seed_run(tmp_path / "run")
    stage = _fp8_cell(run) / "kernels"
    stage.rename(tmp_path / "elsewhere")
    if what == "file":
        stage.write_text("not a folder\n")
    else:
        stage.symlink_to(stage.name if what == "loop" else "/nonexistent/kernels")
    code, errors = _gate_errors(run, tmp_path, capsys)
    why = {"dangling": "a link that leads nowhere (No such file or directory)",
           "loop": "a link that leads nowhere (Too many levels of symbolic links)", "file": "a file"}[what]
    assert code == 1
    assert any(f"{why}, not the kernels stage's folder. Put the stage's folder itself at this name" in line
               for line in errors), errors
    verdict = json.loads((tmp_path / "gate" / "verdict.json").read_text())
    [check] = [c for c in verdict["checks"] if c["cell"] == stage.parent.name and c["kind"] == "kernels"]
    assert check["status"] == "error"


def test_contract_file_past_the_cap_errors_the_cell(tmp_path, capsys, monkeypatch):
    run = synthetic_run.write_seed_run(tmp_path / "run")
    status = _fp8_cell(run) / "status.json"
    status.write_text("{}" + " " * 5000)  # a huge file, at a cap of 4096 bytes (cell.json is smaller)
    monkeypatch.setattr(reading, "MAX_FILE_BYTES", 4096)
    code, errors = _gate_errors(run, tmp_path, capsys)
    assert code == 1  # (the sample logs are past such a cap too)
    assert f"ERROR {status}: larger than 4096 bytes, the most a contract file is read. Is this the file the tool " \
           "wrote?" in errors
