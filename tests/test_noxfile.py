"""The nox sessions: listed with descriptions, parametrized from the matrix, matching what the GHA matrix emits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.matrix import cells as kvmatrix
from kvgate.matrix.views import gha_matrix

ROOT = Path(__file__).resolve().parents[1]
NAMED_SESSIONS = {"matrix", "kernels", "accuracy", "throughput", "gate", "try_gate", "tests", "lint"}


def nox(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    return subprocess.run([sys.executable, "-m", "nox", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


@pytest.fixture(scope="module")
def listing() -> list[dict]:
    result = nox("-l", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_every_session_is_listed_with_a_description(listing):
    names = {entry["name"] for entry in listing}
    assert names >= NAMED_SESSIONS | {"cell"}
    for entry in listing:
        assert entry["description"], entry["session"]


def test_cell_sessions_are_parametrized_by_cell_id_and_tagged_by_arch(listing):
    cells = kvmatrix.load(ROOT / "matrix").cells
    listed = {entry["session"]: entry for entry in listing if entry["name"] == "cell"}
    assert set(listed) == {f"cell({cell.id})" for cell in cells}
    for cell in cells:
        assert listed[f"cell({cell.id})"]["tags"] == [cell.arch, "cell"]


def test_every_session_the_gha_matrix_emits_exists(listing):
    matrix = kvmatrix.load(ROOT / "matrix")
    emitted = {session for job in gha_matrix(matrix, matrix.cells)["include"] for session in job["sessions"]}
    assert emitted <= {entry["session"] for entry in listing}


def test_sessions_of_other_archs_skip_on_this_machine():
    result = nox("-s", "cell(flashinfer_mla-fp8-sm100)", "--no-install")
    assert result.returncode == 0, result.stderr
    assert "cell flashinfer_mla-fp8-sm100 needs sm100; this machine is cpu" in result.stderr


def test_a_cell_session_this_hosts_cpu_cannot_run_skips_with_the_reason_unless_ci_sent_it():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env["KVGATE_HOST_CPU_WITHOUT"] = "avx512,amx"
    result = subprocess.run([sys.executable, "-m", "nox", "-s", "cell(cpu_attn-fp8-cpu)", "--no-install"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert "this host cannot run cpu_attn-fp8-cpu: needs a CPU with AVX-512 or AMX" in result.stderr


@pytest.mark.slow
def test_matrix_session_prints_the_gha_matrix():
    result = nox("-s", "matrix", "--", "--format", "gha", "--arch", "sm90", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    include = json.loads(result.stdout.strip().splitlines()[-1])["include"]
    backends = {job["backend"] for job in include}
    assert "FLASHMLA" in backends and "FLASHINFER_MLA" not in backends


def test_the_sessions_run_kvgate_isolated(tmp_path):
    """`nox -s accuracy` runs `python -I -m kvgate`: a module of the repository root (a numpy.py a change committed)
    is never imported in its place."""
    result = nox("-s", "accuracy", "--no-install", "--", "--help")
    assert result.returncode == 0, result.stderr
    assert " -I -m kvgate run accuracy " in result.stderr


def test_attack_a_root_level_module_is_imported_by_python_m_but_not_by_python_i(tmp_path):
    run = tmp_path / "run"
    import synthetic_run

    synthetic_run.write_seed_run(run)
    (tmp_path / "numpy.py").write_text("import pathlib\npathlib.Path('hijacked').write_text('numpy.py ran')\n"
                                       "raise SystemExit('a numpy.py of the checkout ran')\n")
    argv = ["-m", "kvgate", "gate", str(run), "--today", "2026-12-02"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    plain = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert (tmp_path / "hijacked").exists() and plain.returncode != 0  # the hazard: the folder's module came first
    (tmp_path / "hijacked").unlink()
    isolated = subprocess.run([sys.executable, "-I", *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                              check=False)
    assert not (tmp_path / "hijacked").exists()
    assert isolated.returncode == 0, isolated.stderr
