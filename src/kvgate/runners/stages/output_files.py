"""Moving a finished stage's files from a scratch folder into <cell>/<stage>/ (kvgate.results.cell_folder.stage_output:
the old folder is replaced whole, or left as it was if anything goes wrong on the way)."""

from __future__ import annotations

import os
from pathlib import Path

from kvgate.results import cell_folder


def commit_stage(cell_dir: Path, stage: str, source: Path) -> Path:
    with cell_folder.stage_output(cell_dir, stage) as target:
        if source.is_dir():
            for child in source.iterdir():
                os.replace(child, target / child.name)
    return Path(cell_dir) / stage


def fresh_log(cell_dir: Path, stage: str) -> Path:
    """An empty logs/<stage>.log for this run; the previous run's log is kept as logs/<stage>.previous.log
    (a failed re-run leaves the earlier outputs in place, and their log with them)."""
    log = cell_folder.log_path(cell_dir, stage)
    if log.exists() and log.stat().st_size > 0:
        os.replace(log, log.with_name(f"{stage}.previous.log"))
    log.write_bytes(b"")
    return log
