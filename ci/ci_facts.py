"""Which CI runs a job, GitHub Actions or Buildkite, and the facts the job's run.json takes from its variables.

ci/cell_job.py and ci/gate_job.py import it (each puts its own folder first on Python's path: the workflows run them
isolated, `python -I`, which puts none there). It also gives them `workflow_command` (GitHub Actions' `::error::`
lines, escaped: kvgate/report/command_escapes.py, loaded by its path). Stdlib only: the
workflows and the Buildkite steps run these scripts with a bare python3, before kvgate is installed, so the branch
rule comes from the checkout's kvgate.runners.environment.ci (stdlib only, as ci/plan.py reads kvgate.matrix), the
module the runners' own run.json uses.

    source   "buildkite" where BUILDKITE=true (Buildkite sets it in every job), else "github-actions"
    branch   the branch a push or scheduled build ran on, which the gate's history of main reads (run.json `branch`,
             contract 1.8): GitHub's GITHUB_REF `refs/heads/<branch>`; Buildkite's BUILDKITE_BRANCH when
             BUILDKITE_PULL_REQUEST is `false` (a pull request's build has no branch of its own: a fork's branch may
             be called main too)
    commit   GITHUB_SHA, or BUILDKITE_COMMIT when it is a commit SHA (Buildkite may say HEAD before its checkout)
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from kvgate.runners.environment.ci import ci_branch


def _load_by_path(name: str, path: Path):
    """A module of the checkout that imports nothing, loaded from its file: importing it through its package would
    load the package's dependencies, which a bare python3 lacks."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# GitHub Actions workflow commands, every property and message escaped (`%`, CR, LF, `::`; and `:` `,` in properties)
workflow_command = _load_by_path("kvgate_command_escapes", Path(__file__).resolve().parents[1] / "src" / "kvgate"
                                 / "report" / "command_escapes.py").workflow_command

GITHUB_ACTIONS, BUILDKITE = "github-actions", "buildkite"
# run.json key -> the variable each CI sets it from
FACTS = {
    GITHUB_ACTIONS: {"commit": "GITHUB_SHA", "repository": "GITHUB_REPOSITORY", "workflow_run_id": "GITHUB_RUN_ID",
                     "event": "GITHUB_EVENT_NAME", "runner": "RUNNER_NAME"},
    BUILDKITE: {"commit": "BUILDKITE_COMMIT", "repository": "BUILDKITE_REPO", "build_url": "BUILDKITE_BUILD_URL",
                "event": "BUILDKITE_SOURCE", "runner": "BUILDKITE_AGENT_NAME"},
}
_SHA = re.compile(r"[0-9a-f]{40}")


def source(environ: Mapping[str, str]) -> str:
    return BUILDKITE if environ.get("BUILDKITE") == "true" else GITHUB_ACTIONS


def branch(environ: Mapping[str, str]) -> str | None:
    """The branch a push or scheduled build ran on; None for a pull request's build and outside CI."""
    return ci_branch(environ)


def run_facts(environ: Mapping[str, str]) -> dict[str, str]:
    """run.json's facts of this CI job: its source, then each fact its CI set, the branch included."""
    ci = source(environ)
    facts = {"source": ci}
    facts.update({key: environ[var] for key, var in FACTS[ci].items() if environ.get(var)})
    if ci == BUILDKITE and "commit" in facts and not _SHA.fullmatch(facts["commit"]):
        del facts["commit"]
    if (name := branch(environ)) is not None:
        facts["branch"] = name
    return facts
