"""The CI a process runs under, as its environment variables say. Stdlib only: ci/ci_facts.py imports it from the
checkout before kvgate is installed, and kvgate.runners.run_record writes it into run.json."""

from __future__ import annotations

import os
from collections.abc import Mapping


def ci_branch(environ: Mapping[str, str] | None = None) -> str | None:
    """The branch a CI run was made for: GitHub Actions' GITHUB_REF `refs/heads/<branch>` on a push or a scheduled
    run (a pull request's ref is `refs/pull/...`: no branch); on Buildkite (BUILDKITE=true) BUILDKITE_BRANCH, unless
    the build is a pull request's (BUILDKITE_PULL_REQUEST is its number, not `false`: a fork's branch may be called
    main too); None outside CI. The gate records runs of main (run.json `branch`, contract 1.8)."""
    environ = os.environ if environ is None else environ
    if environ.get("BUILDKITE") == "true":
        branch = environ.get("BUILDKITE_BRANCH", "")
        return branch if branch and environ.get("BUILDKITE_PULL_REQUEST", "false") == "false" else None
    ref = environ.get("GITHUB_REF", "")
    return ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None
