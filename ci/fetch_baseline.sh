#!/usr/bin/env bash
# The gate job's baseline: the kvgate-run artifact of the latest successful push run of kvgate.yml on main,
# unpacked into $BASELINE_DIR. No such run, or its artifact expired: no baseline (a warning, not a failure;
# the gate then compares FP8 cells with their auto cells only).
# Needs GH_TOKEN with actions: read, GITHUB_REPOSITORY, BASELINE_DIR (the workflow passes them through env).
set -euo pipefail

: "${BASELINE_DIR:?set BASELINE_DIR}" "${GITHUB_REPOSITORY:?set GITHUB_REPOSITORY}"
workflow="${KVGATE_WORKFLOW_FILE:-kvgate.yml}"
branch="${KVGATE_BASELINE_BRANCH:-main}"

run_id="$(gh run list --repo "$GITHUB_REPOSITORY" --workflow "$workflow" --branch "$branch" --event push \
  --status success --limit 1 --json databaseId --jq '.[0].databaseId // empty')" || run_id=""
if [[ -z "$run_id" ]]; then
  echo "::warning::kvgate: no successful push run of $workflow on $branch; gating without a baseline"
  exit 0
fi
if ! gh run download "$run_id" --repo "$GITHUB_REPOSITORY" --name kvgate-run --dir "$BASELINE_DIR"; then
  echo "::warning::kvgate: run $run_id has no kvgate-run artifact (expired?); gating without a baseline"
  rm -rf "$BASELINE_DIR"
  exit 0
fi
echo "kvgate: baseline from run $run_id in $BASELINE_DIR"
