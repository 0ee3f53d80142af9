#!/usr/bin/env bash
# Recompile the hashed locks CI installs from, after changing a *.in file beside them. Needs uv (`pip install uv`)
# and PyPI; the locks are committed, the machines that install them never resolve anything themselves.
#   ci/requirements-nox.txt          nox for the workflows' jobs (any Python >= 3.10, any OS)
#   ci/requirements-core.txt         kvgate's core dependencies for the `matrix` and `gate` sessions (idem)
#   ci/locks/gpu-py312-x86_64.txt    the GPU engine environment: CPython 3.12 on Linux x86-64 with glibc >= 2.35
#                                    (manylinux_2_35: Ubuntu 22.04 or newer; llguidance 1.7 has no 2_28 wheel)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
uv="${UV:-uv}"
export UV_PYTHON_DOWNLOADS=never  # resolving needs no interpreter of the target version
common=(--no-config --index-url https://pypi.org/simple --generate-hashes --custom-compile-command "bash ci/compile_locks.sh")
"$uv" pip compile "${common[@]}" --universal --python-version 3.10 requirements-nox.in -o requirements-nox.txt
"$uv" pip compile "${common[@]}" --universal --python-version 3.10 requirements-core.in -o requirements-core.txt
"$uv" pip compile "${common[@]}" --python-version 3.12 --python-platform x86_64-manylinux_2_35 \
  locks/gpu.in -o locks/gpu-py312-x86_64.txt
