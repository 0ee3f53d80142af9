"""The gate job: assemble the cells' artifacts into one run folder, run the gate, report, pass its verdict on.

    ARTIFACTS_DIR=... KVGATE_RUN_DIR=... [BASELINE_DIR=...] [PLANNED_MATRIX='{"include": [...]}'] \
    [PLAN_RESULT=success] python ci/gate_job.py

actions/download-artifact lays out one folder per artifact (`kvgate-cell-<id>/`), each holding that job's run
folder: `run.json` and `<cell folder>/cell.json ...`. Every cell folder is copied into $KVGATE_RUN_DIR.
A planned cell with no folder (its job crashed, timed out or was cancelled before uploading) gets a folder
with its cell.json and a status.json marking its stages `error`, so the gate fails it (fail closed), and the
report says which job to look at. No planned cell: nothing to check, a pass with that note.

A planned cell whose folder lacks a stage that nothing reported (the job was killed mid-cell) gets that
stage marked `error` too. Then `nox -s gate -- $KVGATE_RUN_DIR [--baseline $BASELINE_DIR]`; `gate/report.md` goes to
$GITHUB_STEP_SUMMARY; `gate/pull_request.json` tells kvgate-comment.yml which pull request it is for.
The exit status is the gate's (0 pass, 1 regression or missing cell, 2 bad input).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

IDENTITY_KEYS = ("backend", "kv_cache_dtype", "arch", "model")
# The stages a `cell(<id>)` session runs; a planned cell with no results fails each of them.
CELL_STAGES = ("kernels", "accuracy", "throughput")
GATE_FOLDER = "gate"
# $GITHUB_STEP_SUMMARY takes at most 1 MiB per step.
SUMMARY_LIMIT = 1024 * 1024 - 4096
PULL_REQUEST_FILE = "pull_request.json"


class GateJobError(Exception):
    """Bad job input; printed as one `ERROR` line, exit status 2."""


@dataclass
class Assembly:
    """What the artifacts held: cell folder name -> identity; each artifact's run.json."""

    cells: dict[str, tuple[str, ...]] = field(default_factory=dict)
    run_infos: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def planned_cells(matrix_json: str) -> list[dict[str, Any]]:
    """The plan job's `{"include": [...]}`; empty when it planned nothing."""
    if not matrix_json.strip():
        return []
    try:
        matrix = json.loads(matrix_json)
    except json.JSONDecodeError as error:
        raise GateJobError(f"$PLANNED_MATRIX: not JSON ({error.msg})") from None
    include = matrix.get("include") if isinstance(matrix, dict) else None
    if not isinstance(include, list) or not all(isinstance(e, dict) and "cell" in e for e in include):
        raise GateJobError("$PLANNED_MATRIX: expected {\"include\": [{\"cell\": ...}, ...]} from ci/plan.py")
    return include


def identity(record: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(record.get(key, "")) for key in IDENTITY_KEYS)


def _cell_identity(cell_json: Path) -> tuple[str, ...] | None:
    try:
        data = json.loads(cell_json.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # the gate reads it again and says what is wrong with it
    return identity(data) if isinstance(data, dict) else None


def assemble(artifacts_dir: Path, run_dir: Path) -> Assembly:
    """Copy every cell folder of every downloaded artifact into run_dir (names made unique)."""
    found = Assembly()
    if not artifacts_dir.is_dir():
        return found
    for artifact in sorted(p for p in artifacts_dir.iterdir() if p.is_dir()):
        if (artifact / "run.json").is_file():
            try:
                found.run_infos[artifact.name] = json.loads((artifact / "run.json").read_text(encoding="utf-8"))
            except (OSError, ValueError, UnicodeDecodeError):
                found.problems.append(f"{artifact.name}/run.json is unreadable; left out of run.json")
        for cell_json in sorted(artifact.glob("*/cell.json")):
            source = cell_json.parent
            name = source.name if not (run_dir / source.name).exists() else f"{artifact.name}--{source.name}"
            shutil.copytree(source, run_dir / name, symlinks=True)
            found.cells[name] = _cell_identity(cell_json) or ()
    return found


def missing_cells(planned: Iterable[Mapping[str, Any]], present: Iterable[tuple[str, ...]]) -> list[Mapping[str, Any]]:
    have = set(present)
    return [entry for entry in planned if identity(entry) not in have]


def write_missing_cell(run_dir: Path, entry: Mapping[str, Any], reason: str) -> Path:
    """A folder for a planned cell that uploaded nothing: its identity, and every stage marked error."""
    folder = run_dir / str(entry["cell"])
    if folder.exists():
        folder = run_dir / f"{entry['cell']}--missing"
    folder.mkdir(parents=True)
    cell = {"contract_version": 1, **{key: entry[key] for key in IDENTITY_KEYS},
            "cell_id": entry["cell"], "written_by": "ci/gate_job.py (no artifact from the cell's job)"}
    status = {stage: {"status": "error", "reason": reason} for stage in CELL_STAGES}
    (folder / "cell.json").write_text(json.dumps(cell, indent=2) + "\n", encoding="utf-8")
    (folder / "status.json").write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
    return folder


def mark_unreported_stages(cell_dir: Path, stages: Sequence[str], reason: str) -> list[str]:
    """In a planned cell's folder, mark `error` each stage that left no folder and no status.json entry.

    A job killed mid-cell leaves its later stages unreported; the gate would call them "not run" and pass
    them. Stages the runner reported (ok, error, skipped with a reason) are left as they are.
    """
    status_path = cell_dir / "status.json"
    status: dict[str, Any] = {}
    if status_path.exists():
        try:
            status = json.loads(status_path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return []  # the gate reports the unreadable file (exit 2)
        if not isinstance(status, dict):
            return []
    unreported = [stage for stage in stages if not (cell_dir / stage).is_dir() and stage not in status]
    if unreported:
        status.update({stage: {"status": "error", "reason": reason} for stage in unreported})
        status_path.write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
    return unreported


def unreported_reason(cells_result: str) -> str:
    return (f"the cell's job ended before this stage reported anything (cells job result: {cells_result or 'unknown'}); "
            "see the job's log")


def missing_reason(entry: Mapping[str, Any], cells_result: str) -> str:
    return (f"no results from the job `{entry['cell']}` (cells job result: {cells_result or 'unknown'}): "
            f"it failed, timed out or was cancelled before uploading kvgate-cell-{entry['cell']}; see its log")


def merged_run_info(assembly: Assembly, environ: Mapping[str, str]) -> dict[str, Any]:
    info: dict[str, Any] = {"contract_version": 1, "source": "github-actions"}
    for key, var in (("commit", "GITHUB_SHA"), ("repository", "GITHUB_REPOSITORY"),
                     ("workflow_run_id", "GITHUB_RUN_ID"), ("event", "GITHUB_EVENT_NAME")):
        if environ.get(var):
            info[key] = environ[var]
    if assembly.run_infos:
        info["jobs"] = assembly.run_infos
    return info


def gate_command(nox: Sequence[str], run_dir: Path, baseline: Path | None, root: Path = ROOT) -> list[str]:
    # --matrix-dir / --policy: the gate session installs kvgate into its own venv, away from the checkout's matrix/.
    argv = [*nox, "-s", "gate", "--", str(run_dir), "--matrix-dir", str(root / "matrix"),
            "--policy", str(root / "matrix" / "policy.toml")]
    if baseline is not None:
        argv += ["--baseline", str(baseline)]
    return argv


def usable_baseline(baseline_dir: Path | None) -> Path | None:
    """The baseline run folder, if the fetch step left one with cells in it."""
    if baseline_dir is None or not baseline_dir.is_dir():
        return None
    return baseline_dir if any(baseline_dir.glob("*/cell.json")) else None


def pull_request_info(event_path: str | None) -> dict[str, Any] | None:
    """{"number", "head_sha"} of the pull request this run is for, from the event payload."""
    if not event_path:
        return None
    try:
        event = json.loads(Path(event_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    pr = event.get("pull_request") if isinstance(event, dict) else None
    if not isinstance(pr, dict) or not isinstance(pr.get("number"), int):
        return None
    return {"number": pr["number"], "head_sha": str((pr.get("head") or {}).get("sha", ""))}


def clip(text: str, limit: int, note: str) -> str:
    """text cut at a line boundary to fit `limit` UTF-8 bytes, with a note saying so."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    cut = data[: limit - len(note.encode("utf-8")) - 2].decode("utf-8", errors="ignore")
    return cut[: cut.rfind("\n") + 1] + "\n" + note + "\n"


def note_report(title: str, lines: Sequence[str]) -> str:
    """report.md written by this job when the gate did not write one."""
    return "\n".join([f"## kvgate: {title}", "", *lines]) + "\n"


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(text)


def _write_pull_request(gate_dir: Path, environ: Mapping[str, str]) -> None:
    pr = pull_request_info(environ.get("GITHUB_EVENT_PATH"))
    if pr is not None:
        gate_dir.mkdir(parents=True, exist_ok=True)
        (gate_dir / PULL_REQUEST_FILE).write_text(json.dumps(pr) + "\n", encoding="utf-8")


def run(environ: Mapping[str, str]) -> int:
    artifacts_dir = Path(environ.get("ARTIFACTS_DIR", "artifacts"))
    run_dir = Path(environ.get("KVGATE_RUN_DIR", "kvgate-run"))
    baseline_dir = Path(environ["BASELINE_DIR"]) if environ.get("BASELINE_DIR") else None
    nox = environ.get("KVGATE_NOX", "nox").split()
    gate_dir = run_dir / GATE_FOLDER
    summary = environ.get("GITHUB_STEP_SUMMARY")
    plan_result = environ.get("PLAN_RESULT", "success")

    if run_dir.exists() and any(run_dir.iterdir()):
        raise GateJobError(f"{run_dir}: the run folder must start empty; it holds files already")
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_pull_request(gate_dir, environ)

    if plan_result != "success":
        report = note_report("plan failed", [f"The plan job ended `{plan_result}`: no cell was chosen, "
                                             "so nothing can be checked. See the plan job's log."])
        return _finish(gate_dir, summary, report, 1)

    planned = planned_cells(environ.get("PLANNED_MATRIX", ""))
    assembly = assemble(artifacts_dir, run_dir)
    cells_result = environ.get("CELLS_RESULT", "")
    planned_ids = {identity(entry) for entry in planned}
    for name, found in assembly.cells.items():
        if found in planned_ids:
            for stage in mark_unreported_stages(run_dir / name, CELL_STAGES, unreported_reason(cells_result)):
                print(f"::error::cell {name}: its {stage} stage never reported; the gate fails it", flush=True)
    for entry in missing_cells(planned, assembly.cells.values()):
        folder = write_missing_cell(run_dir, entry, missing_reason(entry, cells_result))
        assembly.cells[folder.name] = identity(entry)
        print(f"::error::cell {entry['cell']}: no artifact from its job; the gate fails it", flush=True)
    for problem in assembly.problems:
        print(f"::warning::{problem}", flush=True)

    if not assembly.cells:
        report = note_report("nothing to check", [
            "This change touches no attention backend source that the matrix covers, so no cell was planned "
            "and no GPU job ran. Pass."])
        return _finish(gate_dir, summary, report, 0)

    (run_dir / "run.json").write_text(json.dumps(merged_run_info(assembly, environ), indent=2) + "\n",
                                      encoding="utf-8")
    baseline = usable_baseline(baseline_dir)
    argv = gate_command(nox, run_dir, baseline)
    print(f"kvgate gate job: {len(assembly.cells)} cells; baseline: {baseline or 'none'}", flush=True)
    print(f"kvgate gate job: {' '.join(argv)}", flush=True)
    try:
        # The gate appends report.md to $GITHUB_STEP_SUMMARY itself; this job does it once, clipped, with notes.
        gate_env = {key: value for key, value in environ.items() if key != "GITHUB_STEP_SUMMARY"}
        result = subprocess.run(argv, cwd=ROOT, env=gate_env, check=False, capture_output=True, text=True)
    except OSError as error:
        raise GateJobError(f"{argv[0]}: {error.strerror}. Install nox (`pip install nox`)") from None
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    status = result.returncode
    if (gate_dir / "report.md").is_file():
        report = (gate_dir / "report.md").read_text(encoding="utf-8", errors="replace")
        if baseline is None:
            report += "\n_No baseline: no successful run on main with a kvgate-run artifact was found._\n"
        _append(summary, clip(report, SUMMARY_LIMIT, "_(report cut to fit the step summary; the full report "
                                                     "is in the kvgate-gate artifact)_"))
        return status
    tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-40:])
    report = note_report("the gate wrote no report", [
        f"`{' '.join(argv)}` exited {status} without writing {GATE_FOLDER}/report.md.", "", "```", tail, "```"])
    return _finish(gate_dir, summary, report, status or 1)


def _finish(gate_dir: Path, summary: str | None, report: str, status: int) -> int:
    gate_dir.mkdir(parents=True, exist_ok=True)
    (gate_dir / "report.md").write_text(report, encoding="utf-8")
    _append(summary, report)
    return status


def main() -> int:
    try:
        return run(os.environ)
    except GateJobError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
