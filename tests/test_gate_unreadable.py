"""An unreadable folder inside a cell is that cell's error (one ERROR line, exit 1), never a traceback."""

from __future__ import annotations

import errno
import json
import pathlib

import synthetic_run
from kvgate.cli import main


def test_unreadable_folder_is_one_error_line(tmp_path, monkeypatch, capsys):
    run = synthetic_run.write_seed_run(tmp_path / "run")
    blocked = next(p for p in run.iterdir() if p.is_dir()) / "accuracy"
    real_rglob = pathlib.Path.rglob

    def rglob(self, pattern):  # root reads every folder, so the refusal is simulated where the walk meets it
        if self == blocked:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_rglob(self, pattern)

    monkeypatch.setattr(pathlib.Path, "rglob", rglob)
    code = main(["gate", str(run), "--out", str(tmp_path / "gate")])
    err = capsys.readouterr().err
    assert code == 1
    assert [line for line in err.splitlines() if line.startswith("ERROR ")] == [
        f"ERROR {blocked}: cannot read: Permission denied. Check the permissions of the run folder"]
    verdict = json.loads((tmp_path / "gate" / "verdict.json").read_text())
    errored = [c for c in verdict["checks"] if c["status"] == "error" and c["kind"] == "accuracy"]
    assert [c["detail"] for c in errored] == [
        f"accuracy stage unreadable: {blocked}: cannot read: Permission denied. Check the permissions of the run folder"]
