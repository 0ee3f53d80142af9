"""ci/plan.py's pure parts (the real `nox -s matrix` run is in tests/test_workflows.py) and ci/cell_job.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ci_scripts import load_ci_script

ROOT = Path(__file__).resolve().parents[1]




plan = load_ci_script("plan")
cell_job = load_ci_script("cell_job")

ENTRY = {"cell": "flashinfer_mla-fp8-sm100", "backend": "FLASHINFER_MLA", "kv_cache_dtype": "fp8", "arch": "sm100",
         "model": "deepseek-ai/DeepSeek-V2-Lite-Chat", "runner": "gpu-sm100",
         "sessions": ["cell(flashinfer_mla-fp8-sm100)"]}


def nox_stdout(matrix: object) -> str:
    return "\n".join(["kvgate: some chatter", json.dumps(matrix, separators=(",", ":")), ""])


def test_the_matrix_line_is_found_among_other_output():
    assert plan.parse_matrix(nox_stdout({"include": [ENTRY]})) == {"include": [ENTRY]}


@pytest.mark.parametrize(("stdout", "message"), [
    ("nothing here\n", "nox -s matrix: expected one {\"include\": [...]} line on stdout, found 0. "
                       "Run it by hand to see what it printed"),
    ('{"include": [\n', "nox -s matrix: the matrix line is not JSON (Expecting value at column 14)"),
    ('{"include": [], "exclude": []}\n', "nox -s matrix: the matrix must be an object with only an 'include' list"),
    (nox_stdout({"include": [{k: v for k, v in ENTRY.items() if k != "runner"}]}),
     "nox -s matrix: include[0] lacks runner"),
    (nox_stdout({"include": [{**ENTRY, "sessions": []}]}),
     "nox -s matrix: include[0].sessions must be a non-empty list of session names"),
    (nox_stdout({"include": [ENTRY, ENTRY]}), "nox -s matrix: a cell id appears twice in the matrix"),
])
def test_a_bad_matrix_is_refused_with_one_message(stdout, message):
    with pytest.raises(plan.PlanError) as error:
        plan.parse_matrix(stdout)
    assert str(error.value) == message


def test_more_cells_than_github_allows_is_refused():
    include = [{**ENTRY, "cell": f"c{i}"} for i in range(257)]
    with pytest.raises(plan.PlanError, match="257 cells, but a GitHub Actions matrix takes at most 256 jobs"):
        plan.parse_matrix(nox_stdout({"include": include}))


def test_outputs_flag_an_empty_plan():
    assert plan.outputs({"include": []}) == {"matrix": '{"include":[]}', "has-cells": "false", "cell-count": "0"}
    assert plan.outputs({"include": [ENTRY]})["has-cells"] == "true"


def test_an_output_value_with_a_newline_is_refused():
    with pytest.raises(plan.PlanError, match="must be one line"):
        plan.output_lines({"matrix": "a\nhas-cells=true"})


@pytest.mark.parametrize(("event", "changed", "expected"), [
    ("push", None, None),
    ("workflow_dispatch", None, None),
    ("pull_request", ["vllm/v1/attention/backends/mla/flashinfer_mla.py"],
     ["vllm/v1/attention/backends/mla/flashinfer_mla.py"]),
    ("pull_request", ["README.md", "src/kvgate/gate/checks.py"], None),
    ("pull_request", ["matrix/backends.toml"], None),
    ("pull_request", ["tests/test_gate.py", "ci/README.md"], ["tests/test_gate.py", "ci/README.md"]),
])
def test_which_changes_plan_every_cell(event, changed, expected):
    assert plan.decide(event, changed)[0] == expected


def test_a_pull_request_without_a_diff_is_an_error():
    with pytest.raises(plan.PlanError, match="event 'pull_request': no changed-files list"):
        plan.decide("pull_request", None)


def test_the_pull_request_diff_is_the_merge_commits(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    git("init", "-q")
    (tmp_path / "a.txt").write_text("a")
    git("add", "a.txt")
    git("commit", "-qm", "base")
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "b.py").write_text("b")
    git("add", "vllm/b.py")
    git("commit", "-qm", "change")
    assert plan.pull_request_changed_files(tmp_path) == ["vllm/b.py"]


def test_summary_lists_the_cells_or_says_none():
    assert "No cell selected" in plan.summary({"include": []}, "reason")
    assert "| `flashinfer_mla-fp8-sm100` | `gpu-sm100` |" in plan.summary({"include": [ENTRY]}, "reason")


# ------------------------------------------------------------------------------------------------ cell job

def test_cell_job_reads_the_matrix_entry_from_the_environment(tmp_path):
    cell, sessions, run_dir = cell_job.read_environment({
        "KVGATE_CELL": ENTRY["cell"], "KVGATE_SESSIONS": json.dumps(ENTRY["sessions"]), "KVGATE_RUN_DIR": str(tmp_path)})
    assert (cell, sessions, run_dir) == (ENTRY["cell"], ENTRY["sessions"], tmp_path)
    assert cell_job.session_commands(["nox"], sessions) == [["nox", "-s", "cell(flashinfer_mla-fp8-sm100)"]]


@pytest.mark.parametrize(("environ", "message"), [
    ({}, "$KVGATE_CELL: not set. The workflow passes the matrix entry's `cell`"),
    ({"KVGATE_CELL": "x", "KVGATE_SESSIONS": "[]"}, "$KVGATE_SESSIONS: expected a non-empty JSON list of nox session names"),
    ({"KVGATE_CELL": "x", "KVGATE_SESSIONS": "cell(x)"}, "$KVGATE_SESSIONS: not a JSON list of nox session names"),
    ({"KVGATE_CELL": "x", "KVGATE_SESSIONS": '["cell(x)"]'},
     "$KVGATE_RUN_DIR: not set. Point it at the folder the artifact uploads"),
])
def test_cell_job_refuses_a_bad_environment(environ, message):
    with pytest.raises(cell_job.CellJobError) as error:
        cell_job.read_environment(environ)
    assert str(error.value) == message


@pytest.mark.parametrize(("environ", "gpus", "expected"), [
    ({}, 0, None),
    ({}, 1, None),
    ({}, 8, "8"),
    ({"KVGATE_KERNEL_WORKERS": "4"}, 8, "4"),  # the runner's .env
    ({"KVGATE_KERNEL_WORKERS": "4", "KVGATE_KERNEL_WORKERS_OVERRIDE": "2"}, 8, "2"),  # the repository variable
    ({"KVGATE_KERNEL_WORKERS_OVERRIDE": ""}, 2, "2"),  # an unset repository variable arrives empty
])
def test_kernel_workers_one_per_gpu_unless_told(environ, gpus, expected):
    assert cell_job.kernel_workers(environ, gpus) == expected


def test_kernel_workers_must_be_a_number():
    with pytest.raises(cell_job.CellJobError, match="KVGATE_KERNEL_WORKERS='all': expected a whole number"):
        cell_job.kernel_workers({"KVGATE_KERNEL_WORKERS_OVERRIDE": "all"}, 2)


def test_the_workers_variable_is_the_one_kvgate_kernels_reads():
    from kvgate.kernels.gpus import WORKERS_ENV

    assert cell_job.WORKERS_ENV == WORKERS_ENV


def test_a_session_that_writes_no_cell_folder_fails_the_job(tmp_path):
    """As when `cell(<id>)` skips on a runner whose GPU is not the cell's arch (nox exits 0)."""
    env = {"KVGATE_CELL": ENTRY["cell"], "KVGATE_SESSIONS": json.dumps(ENTRY["sessions"]),
           "KVGATE_RUN_DIR": str(tmp_path / "run"), "KVGATE_NOX": "true", "PATH": "/usr/bin:/bin",
           "GITHUB_SHA": "c" * 40}
    result = subprocess.run([sys.executable, "ci/cell_job.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 1
    assert f"::error::cell {ENTRY['cell']}: no cell folder (cell.json)" in result.stdout
    assert json.loads((tmp_path / "run" / "run.json").read_text())["commit"] == "c" * 40
