"""The CI a process runs under, as its environment variables say. Stdlib only: ci/ci_facts.py imports it from the
checkout before kvgate is installed, and kvgate.runners.run_record writes it into run.json."""

from __future__ import annotations

import os
from collections.abc import Mapping

# GitHub Actions events whose run is the branch's own: GITHUB_REF names the branch the run was made from. On any
# other event GITHUB_REF is not the code under test: a pull request's (refs/pull/...), or the default branch's while
# the run serves a pull request or a comment (pull_request_target, issue_comment, pull_request_review*,
# workflow_run): such a run is never main's.
BRANCH_EVENTS = ("push", "schedule", "workflow_dispatch")


def ci_branch(environ: Mapping[str, str] | None = None) -> str | None:
    """The branch a CI run was made for: GitHub Actions' GITHUB_REF `refs/heads/<branch>` on a push, a scheduled or
    a manual run (BRANCH_EVENTS; a pull request's ref is `refs/pull/...`, and on pull_request_target or issue_comment
    GITHUB_REF names the default branch though the run serves a pull request: no branch); on Buildkite
    (BUILDKITE=true) BUILDKITE_BRANCH, when BUILDKITE_PULL_REQUEST says `false` (a pull request's build has its
    number there, and a fork's branch may be called main too; a build that does not say is not counted); None
    outside CI. The gate records runs of main (run.json `branch`, contract 1.8)."""
    environ = os.environ if environ is None else environ
    if environ.get("BUILDKITE") == "true":
        branch = environ.get("BUILDKITE_BRANCH", "")
        return branch if branch and environ.get("BUILDKITE_PULL_REQUEST") == "false" else None
    event = environ.get("GITHUB_EVENT_NAME")
    if event is not None and event not in BRANCH_EVENTS:
        return None
    ref = environ.get("GITHUB_REF", "")
    return ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None
