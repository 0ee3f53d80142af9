#!/usr/bin/env bash
# Recompile the hashed locks CI installs from, after changing a *.in file beside them. Needs uv (`pip install uv`)
# and PyPI; the locks are committed, the machines that install them never resolve anything themselves.
#   ci/requirements-nox.txt          nox for the workflows' jobs (any Python >= 3.10, any OS)
#   ci/requirements-core.txt         kvgate's core dependencies for the `matrix` and `gate` sessions (idem)
#   ci/requirements-history.txt      the history of main's extras (Otava, psycopg, pgserver), installed --no-deps
#   ci/locks/gpu-py312-x86_64.txt    the GPU engine environment: CPython 3.12 on Linux x86-64 with glibc >= 2.35
#                                    (manylinux_2_35: Ubuntu 22.04 or newer; llguidance 1.7 has no 2_28 wheel)
#   ci/locks/cpu-py311-x86_64.txt    the CPU engine environment: CPython 3.11 on Linux x86-64 (manylinux_2_28); torch
#                                    2.13.0+cpu from a local wheel (PIP_FIND_LINKS) or the PyTorch CPU index
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
uv="${UV:-uv}"
export UV_PYTHON_DOWNLOADS=never  # resolving needs no interpreter of the target version
common=(--no-config --index-url https://pypi.org/simple --generate-hashes --custom-compile-command "bash ci/compile_locks.sh")
"$uv" pip compile "${common[@]}" --universal --python-version 3.10 requirements-nox.in -o requirements-nox.txt
"$uv" pip compile "${common[@]}" --universal --python-version 3.10 requirements-core.in -o requirements-core.txt
"$uv" pip compile "${common[@]}" --universal --python-version 3.11 --no-deps requirements-history.in \
  -o requirements-history.txt
"$uv" pip compile "${common[@]}" --python-version 3.12 --python-platform x86_64-manylinux_2_35 \
  locks/gpu.in -o locks/gpu-py312-x86_64.txt
# torch's +cpu build: a local wheel where PIP_FIND_LINKS names one, else the PyTorch CPU index.
if [ -n "${PIP_FIND_LINKS:-}" ]; then torch_from=(--find-links "$PIP_FIND_LINKS")
else torch_from=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match); fi
"$uv" pip compile "${common[@]}" "${torch_from[@]}" --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  locks/cpu.in -o locks/cpu-py311-x86_64.txt
