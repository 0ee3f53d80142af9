"""The gate job's stored baseline: the kvgate-run artifact of the newest successful run of the workflow on main.

    GH_TOKEN=... GITHUB_REPOSITORY=owner/repo BASELINE_DIR=... [GITHUB_RUN_ID=...] python ci/fetch_baseline.py

Only runs that main itself started count: a push to main or a manual run on main (`gh run list --event push`,
then `--event workflow_dispatch`), never a pull request's run, whatever its branch is called (a fork's branch
may be named main). This run itself is never its own baseline. A pull request compares with the newest such
run; a push run compares with the run before it, so a regression that lands fails main's own run instead of
silently becoming the next reference (a failed run is never a baseline).

No such run, an expired artifact, or a failed `gh`: a warning and no $BASELINE_DIR. The gate job runs the gate
with --require-baseline, so that is a failing check, not a pass (fail closed); the step itself exits 0 so the
gate still runs and says why. Writes `run-id` (empty when none) to $GITHUB_OUTPUT. Exit 2 on bad input, a
$GITHUB_OUTPUT that cannot be appended to included (ci/step_files.py), with one `ERROR` line.
Needs GH_TOKEN with actions: read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run isolated (python -I), Python puts no folder there
import step_files
from ci_facts import workflow_command

ARTIFACT = "kvgate-run"
# The events of runs that main itself started.
MAIN_EVENTS = ("push", "workflow_dispatch")
CANDIDATES_PER_EVENT = 10


class BaselineError(Exception):
    """Bad input; printed as one `ERROR` line, exit status 2."""


class GhFailed(Exception):
    """`gh` could not answer; a warning, no baseline."""


def _gh(gh: Sequence[str], *args: str) -> str:
    try:
        result = subprocess.run([*gh, *args], capture_output=True, text=True, check=False, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise GhFailed(f"{gh[0]} {args[0]} {args[1]}: {getattr(error, 'strerror', None) or error}") from None
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["failed"])[-1][:300]
        raise GhFailed(f"{gh[0]} {args[0]} {args[1]} exited {result.returncode}: {tail}")
    return result.stdout


def candidates(gh: Sequence[str], repository: str, workflow: str, branch: str, own_run: str) -> list[dict[str, Any]]:
    """Successful runs main started, newest first, this run left out."""
    runs: list[dict[str, Any]] = []
    for event in MAIN_EVENTS:
        out = _gh(gh, "run", "list", "--repo", repository, "--workflow", workflow, "--branch", branch,
                  "--event", event, "--status", "success", "--limit", str(CANDIDATES_PER_EVENT),
                  "--json", "databaseId,headBranch,headSha,event,conclusion,createdAt")
        try:
            listed = json.loads(out or "[]")
        except ValueError:
            raise GhFailed(f"gh run list --event {event}: not JSON") from None
        if not isinstance(listed, list):
            raise GhFailed(f"gh run list --event {event}: not a list of runs")
        for run in listed:
            if not isinstance(run, dict) or not isinstance(run.get("databaseId"), int):
                continue
            # gh filtered by these already; checked again so a changed gh or API cannot widen the choice.
            if (run.get("event"), run.get("headBranch"), run.get("conclusion")) != (event, branch, "success"):
                continue
            if str(run["databaseId"]) == own_run:
                continue
            runs.append(run)
    return sorted(runs, key=lambda run: str(run.get("createdAt", "")), reverse=True)


def fetch(environ: Mapping[str, str]) -> str | None:
    """Download the baseline into $BASELINE_DIR; the run id it came from, or None (said as a warning)."""
    repository = environ.get("GITHUB_REPOSITORY", "")
    if not repository or repository.count("/") != 1:
        raise BaselineError("$GITHUB_REPOSITORY: expected owner/repo")
    if not environ.get("BASELINE_DIR"):
        raise BaselineError("$BASELINE_DIR: not set. Point it at the folder the gate reads the baseline from")
    target = Path(environ["BASELINE_DIR"])
    if target.exists() and not target.is_dir():
        raise BaselineError(f"{target}: not a folder. Point $BASELINE_DIR at the folder the gate reads the baseline from")
    if target.exists() and any(target.iterdir()):
        raise BaselineError(f"{target}: the baseline folder must start empty")
    workflow = environ.get("KVGATE_WORKFLOW_FILE", "kvgate.yml")
    branch = environ.get("KVGATE_BASELINE_BRANCH", "main")
    gh = environ.get("KVGATE_GH", "gh").split()
    if not gh:
        raise BaselineError("$KVGATE_GH: empty. Leave it unset (gh) or name the GitHub CLI")
    try:
        runs = candidates(gh, repository, workflow, branch, environ.get("GITHUB_RUN_ID", ""))
    except GhFailed as error:
        print(workflow_command("warning", f"kvgate: no baseline: {error}"))
        return None
    if not runs:
        print(workflow_command("warning", f"kvgate: no baseline: no successful push or manual run of {workflow} on "
                                          f"{branch}"))
        return None
    run_id = str(runs[0]["databaseId"])
    try:
        _gh(gh, "run", "download", run_id, "--repo", repository, "--name", ARTIFACT, "--dir", str(target))
    except GhFailed as error:
        shutil.rmtree(target, ignore_errors=True)
        print(workflow_command("warning", f"kvgate: no baseline: run {run_id} (the newest successful run on {branch}) "
                                          f"has no usable {ARTIFACT} artifact (expired?): {error}"))
        return None
    print(f"kvgate: baseline from run {run_id} ({runs[0].get('event')} of {str(runs[0].get('headSha', ''))[:12]}) "
          f"in {target}")
    return run_id


def main() -> int:
    try:
        run_id = fetch(os.environ)
    except BaselineError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    try:  # the baseline already fetched stays; the gate step after this one does not run
        step_files.append("GITHUB_OUTPUT", os.environ.get("GITHUB_OUTPUT"), f"run-id={run_id or ''}\n")
    except step_files.StepFileError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
