"""kvgate declares only the Pythons something tests it on, and says so in one line on any other."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from kvgate.runners.environment import engine_venv, pythons

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_requires_python_admits_exactly_the_tested_pythons():
    declared = SpecifierSet(PROJECT["requires-python"])
    admitted = {(3, minor) for minor in range(0, 40) if f"3.{minor}.0" in declared or f"3.{minor}.99" in declared}
    assert admitted == set(pythons.TESTED)
    assert PROJECT["requires-python"] == pythons.REQUIRES_PYTHON
    assert {c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"] if c.startswith("Programming Language :: Python ::")
            } == {pythons.shown(v) for v in pythons.TESTED}


def test_each_tested_python_is_the_one_an_engine_lock_is_resolved_for():
    assert {engine_venv.CPU_PYTHON, engine_venv.GPU_PYTHON} == set(pythons.TESTED)
    assert (ROOT / engine_venv.CPU_LOCK).is_file() and (ROOT / engine_venv.GPU_LOCK).is_file()
    assert engine_venv.CPU_LOCK.name.startswith(f"cpu-py{''.join(map(str, engine_venv.CPU_PYTHON))}-")
    assert engine_venv.GPU_LOCK.name.startswith(f"gpu-py{''.join(map(str, engine_venv.GPU_PYTHON))}-")


def test_these_tests_run_on_a_declared_python():
    assert pythons.undeclared() is None, pythons.undeclared()


def test_another_python_is_one_line_naming_it_and_what_to_do():
    assert pythons.undeclared((3, 13, 0), "/usr/bin/python3") == (
        "/usr/bin/python3 is Python 3.13.0, not one kvgate declares and tests (3.11 and 3.12: pyproject.toml "
        "requires-python >=3.11,<3.13). Put Debian 12's python3 (3.11) or a CPython 3.11 and 3.12 first on PATH and "
        "make .venv again (rm -rf .venv)")
    assert pythons.undeclared((3, 10, 13), "/x").startswith("/x is Python 3.10.13, not one kvgate declares")
    assert pythons.undeclared((3, 11, 2), "/x") is None and pythons.undeclared((3, 12, 1), "/x") is None


def test_the_python_in_use_is_described_with_its_sys_version():
    line = pythons.describe((3, 11, 2), "3.11.2 (main, Mar 13 2023, 12:18:29) [GCC 12.2.0]", "/usr/bin/python3")
    assert line == ("/usr/bin/python3: Python 3.11.2 (main, Mar 13 2023, 12:18:29) [GCC 12.2.0]; the CPU engine "
                    "environment (ci/locks/cpu-py311-x86_64.txt), where .ci/run runs the whole suite")


def test_a_nox_session_on_an_undeclared_python_fails_with_one_line(monkeypatch):
    """The noxfile's check, as the engine and kvgate-installing sessions call it, on a Python 3.13 (sys patched)."""
    spec = importlib.util.spec_from_file_location("kvgate_noxfile", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)

    class Session:
        def error(self, message: str):
            raise SystemExit(message)

    noxfile._declared_python(Session())  # this Python: nothing said
    monkeypatch.setattr(pythons.sys, "version_info", (3, 13, 0, "final", 0))
    with pytest.raises(SystemExit) as stopped:
        noxfile._declared_python(Session())
    assert str(stopped.value) == f"ERROR {pythons.undeclared((3, 13, 0), sys.executable)}"
    assert "\n" not in str(stopped.value)
    source = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert source.count("_declared_python(session)") == 2  # in _engine and _install_kvgate: every session using kvgate
