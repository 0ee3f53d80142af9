"""Writing one cell's folder of a results run (docs/results-folder.md), safely.

    <run dir>/<cell id>/cell.json      identity (written first); the base side of an A/B run: <cell id>--base/
    <run dir>/<cell id>/status.json    one entry per stage: ok | error | timeout | skipped
    <run dir>/<cell id>/<stage>/       a stage's outputs, replaced whole on a re-run
    <run dir>/<cell id>/logs/<stage>.log   the stage's full log (engine included)

A stage writes into a hidden temporary folder and is renamed into place only when it finished, so a
half-written stage never passes for a whole one, and a crashed re-run leaves the previous outputs
intact while status.json says it failed (the gate fails closed on that).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvgate.results.records import CONTRACT_VERSION, HEAD, STAGE_STATUSES


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, 0o644)  # mkstemp makes 0600; results are read by other users and CI artifact uploads
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def folder_name(cell_id: str, side: str | None = None) -> str:
    """A cell's folder: its id, and for the base side of an A/B run `<id>--base` (docs/results-folder.md)."""
    return cell_id if side in (None, HEAD) else f"{cell_id}--{side}"


def prepare_cell(run_dir: Path, cell_record: dict[str, Any]) -> Path:
    """Create the cell's folder (kvgate's name for it: folder_name) and its cell.json; returns the folder."""
    cell_dir = Path(run_dir) / folder_name(cell_record["cell_id"], cell_record.get("side"))
    cell_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cell_dir / "cell.json", {"contract_version": CONTRACT_VERSION, **cell_record})
    return cell_dir


def log_path(cell_dir: Path, stage: str) -> Path:
    path = Path(cell_dir) / "logs" / f"{stage}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def stage_output(cell_dir: Path, stage: str) -> Iterator[Path]:
    """Yield an empty temporary folder for a stage's outputs; on success it replaces <cell>/<stage>/."""
    cell_dir = Path(cell_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{stage}.partial-", dir=cell_dir))
    tmp.chmod(0o755)  # mkdtemp makes 0700
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = cell_dir / stage
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{stage}.old-", dir=cell_dir))
        os.replace(final, old / stage)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_status(cell_dir: Path, stage: str, status: str, reason: str | None = None,
                 log_tail: str | None = None, **extra: Any) -> None:
    """Record one stage's outcome in status.json (merged with the other stages' entries, under a lock)."""
    if status not in STAGE_STATUSES:
        raise ValueError(f"status must be one of {STAGE_STATUSES}, got {status!r}")
    cell_dir = Path(cell_dir)
    entry: dict[str, Any] = {"status": status, **extra}
    if reason is not None:
        entry["reason"] = reason
    if log_tail is not None:
        entry["log_tail"] = log_tail
    with open(cell_dir / ".status.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = cell_dir / "status.json"
        current: dict[str, Any] = {}
        if path.exists():
            try:
                current = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                current = {}
        current[stage] = entry
        write_json_atomic(path, current)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])
