#!/usr/bin/env bash
# Install the workflow linters (actionlint, zizmor, shellcheck) into ci/linters/.venv, pinned with hashes.
# tests/test_workflows.py runs them over .github/workflows/ and fails, saying to run this, when they are absent.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/linters/.venv"
python="${PYTHON:-python3}"
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --only-binary=:all: \
  -r "$here/linters/requirements.txt"
"$venv/bin/actionlint" -version | head -1
"$venv/bin/zizmor" --version
"$venv/bin/shellcheck" --version | sed -n 2p
