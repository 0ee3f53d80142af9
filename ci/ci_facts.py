"""Which CI runs a job, GitHub Actions or Buildkite, and the facts the job's run.json takes from its variables.

ci/cell_job.py and ci/gate_job.py import it (a script's own folder is first on Python's path). Stdlib only: the
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

import re
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from kvgate.runners.environment.ci import ci_branch

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
