"""The plan job: which cells a change needs, as a GitHub Actions matrix.

    python ci/plan.py                           # in the workflow: event from $GITHUB_EVENT_NAME
    python ci/plan.py --changed-files diff.txt  # locally: one changed path a line

On a pull request the changed paths are `git diff --name-only HEAD^1 HEAD` of the merge commit that
actions/checkout checks out (first parent = the base branch tip). On a push, a schedule or a manual run
every cell is planned, and so is every cell when kvgate's own harness changed (HARNESS_PATHS): a change
to how cells run can break any of them. Otherwise `nox -s matrix -- --format gha --changed-files FILE`
keeps the cells whose backend sources were touched (all of them when vLLM's shared attention code was).

Writes to $GITHUB_OUTPUT: matrix (`{"include": [...]}`, one line), has-cells (true/false), cell-count;
a short plan to $GITHUB_STEP_SUMMARY; the matrix JSON to stdout. Exit 2 with one `ERROR` line on bad input.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# GitHub Actions refuses a generated matrix of more than 256 jobs.
MAX_JOBS = 256
# Keys every matrix entry carries (kvgate.matrix.views.gha_matrix); the workflow reads them.
ENTRY_KEYS = ("cell", "backend", "kv_cache_dtype", "arch", "model", "runner", "sessions")
# kvgate's own files whose change re-runs every cell (fnmatch patterns, `*` crosses folders).
HARNESS_PATHS = (
    "src/kvgate/*",
    "matrix/*",
    "noxfile.py",
    "pyproject.toml",
    "ci/*.py",
    ".github/workflows/kvgate.yml",
)
# Events whose runs plan every cell (push to main refreshes the baseline).
ALL_CELLS_EVENTS = ("push", "schedule", "workflow_dispatch")


class PlanError(Exception):
    """Bad input or a failed planning command; printed as one `ERROR` line."""


def harness_changed(changed: Sequence[str]) -> list[str]:
    """The changed paths that are kvgate's own harness."""
    return [path for path in changed if any(fnmatch.fnmatchcase(path, pattern) for pattern in HARNESS_PATHS)]


def matrix_command(nox: Sequence[str], changed_files: Path | None) -> list[str]:
    # --matrix-dir: the session installs kvgate into its own venv, away from the checkout's matrix/.
    argv = [*nox, "-s", "matrix", "--", "--format", "gha", "--matrix-dir", str(ROOT / "matrix")]
    if changed_files is not None:
        argv += ["--changed-files", str(changed_files)]
    return argv


def parse_matrix(stdout: str, source: str = "nox -s matrix") -> dict[str, list[dict[str, object]]]:
    """The `{"include": [...]}` line of the matrix session's output, checked."""
    lines = [line for line in stdout.splitlines() if line.startswith('{"include"')]
    if len(lines) != 1:
        raise PlanError(f"{source}: expected one {{\"include\": [...]}} line on stdout, found {len(lines)}. "
                        "Run it by hand to see what it printed")
    try:
        matrix = json.loads(lines[0])
    except json.JSONDecodeError as error:
        raise PlanError(f"{source}: the matrix line is not JSON ({error.msg} at column {error.colno})") from None
    include = matrix.get("include") if isinstance(matrix, dict) else None
    if not isinstance(include, list) or set(matrix) != {"include"}:
        raise PlanError(f"{source}: the matrix must be an object with only an 'include' list")
    for index, entry in enumerate(include):
        missing = [key for key in ENTRY_KEYS if not isinstance(entry, dict) or key not in entry]
        if missing:
            raise PlanError(f"{source}: include[{index}] lacks {', '.join(missing)}")
        sessions = entry["sessions"]
        if not isinstance(sessions, list) or not sessions or not all(isinstance(s, str) for s in sessions):
            raise PlanError(f"{source}: include[{index}].sessions must be a non-empty list of session names")
    ids = [entry["cell"] for entry in include]
    if len(set(ids)) != len(ids):
        raise PlanError(f"{source}: a cell id appears twice in the matrix")
    if len(include) > MAX_JOBS:
        raise PlanError(f"{source}: {len(include)} cells, but a GitHub Actions matrix takes at most {MAX_JOBS} "
                        "jobs. Split the workflow by arch (`--arch`)")
    return matrix


def outputs(matrix: dict[str, list[dict[str, object]]]) -> dict[str, str]:
    """The plan job's outputs. An empty matrix cannot fan out: has-cells=false skips the cells job."""
    count = len(matrix["include"])
    return {
        "matrix": json.dumps(matrix, separators=(",", ":")),
        "has-cells": "true" if count else "false",
        "cell-count": str(count),
    }


def output_lines(values: dict[str, str]) -> str:
    """`name=value` lines for $GITHUB_OUTPUT; a value with a newline would start a new output."""
    for name, value in values.items():
        if "\n" in value or "\r" in value:
            raise PlanError(f"output {name}: a value for $GITHUB_OUTPUT must be one line")
    return "".join(f"{name}={value}\n" for name, value in values.items())


def summary(matrix: dict[str, list[dict[str, object]]], reason: str) -> str:
    include = matrix["include"]
    lines = ["## kvgate plan", "", reason, ""]
    if not include:
        lines.append("No cell selected: nothing runs on a GPU runner, and the gate reports nothing to check.")
    else:
        lines += [f"{len(include)} cells:", "", "| cell | runner | model |", "|---|---|---|"]
        lines += [f"| `{e['cell']}` | `{e['runner']}` | `{e['model']}` |" for e in include]
    return "\n".join(lines) + "\n"


def pull_request_changed_files(cwd: Path) -> list[str]:
    """Paths the pull request changes: the merge commit against its first parent (the base tip)."""
    argv = ["git", "diff", "--name-only", "HEAD^1", "HEAD"]
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PlanError(f"{' '.join(argv)}: {result.stderr.strip() or 'failed'}. "
                        "Check out the pull request's merge commit with fetch-depth: 2")
    return [line for line in result.stdout.splitlines() if line.strip()]


def decide(event: str, changed: list[str] | None) -> tuple[list[str] | None, str]:
    """(changed paths to filter by, or None for every cell; the reason, in words)."""
    if changed is None:
        if event in ALL_CELLS_EVENTS:
            return None, f"Event `{event}`: every cell."
        raise PlanError(f"event {event!r}: no changed-files list. Pass --changed-files FILE, "
                        f"or run on one of {', '.join(ALL_CELLS_EVENTS)} to plan every cell")
    harness = harness_changed(changed)
    if harness:
        return None, f"kvgate's harness changed (`{harness[0]}`{' and more' if len(harness) > 1 else ''}): every cell."
    return changed, f"{len(changed)} changed paths: the cells whose backend sources they touch."


def plan(event: str, changed: list[str] | None, nox: Sequence[str], cwd: Path) -> tuple[dict, str]:
    selection, reason = decide(event, changed)
    with tempfile.TemporaryDirectory() as tmp:
        listing = None
        if selection is not None:
            listing = Path(tmp) / "changed-files.txt"
            listing.write_text("".join(f"{path}\n" for path in selection), encoding="utf-8")
        argv = matrix_command(nox, listing)
        try:
            result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
        except OSError as error:
            raise PlanError(f"{argv[0]}: {error.strerror}. Install nox (`pip install nox`)") from None
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise PlanError(f"{' '.join(argv)} exited {result.returncode}: {tail}")
    return parse_matrix(result.stdout), reason


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ci/plan.py", description=__doc__.splitlines()[0])
    parser.add_argument("--event", default=os.environ.get("GITHUB_EVENT_NAME", "workflow_dispatch"),
                        help="GitHub event name (default: $GITHUB_EVENT_NAME)")
    parser.add_argument("--changed-files", type=Path, metavar="FILE",
                        help="changed paths, one a line (default on pull_request: the merge commit's diff)")
    parser.add_argument("--nox", default=os.environ.get("KVGATE_NOX", "nox"),
                        help="the nox command (default: $KVGATE_NOX or nox)")
    args = parser.parse_args(argv)
    try:
        if args.changed_files is not None:
            try:
                changed = [p.strip() for p in args.changed_files.read_text(encoding="utf-8").splitlines() if p.strip()]
            except OSError as error:
                raise PlanError(f"{args.changed_files}: cannot read the changed-files list ({error.strerror})") from None
        elif args.event == "pull_request":
            changed = pull_request_changed_files(ROOT)
        else:
            changed = None
        matrix, reason = plan(args.event, changed, args.nox.split(), ROOT)
        _append(os.environ.get("GITHUB_OUTPUT"), output_lines(outputs(matrix)))
    except PlanError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    _append(os.environ.get("GITHUB_STEP_SUMMARY"), summary(matrix, reason))
    print(json.dumps(matrix, separators=(",", ":")))
    print(f"kvgate plan: {reason} {len(matrix['include'])} cells", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
