"""ci/gate_job.py: downloaded artifacts -> one run folder -> the real gate -> step summary and exit status.

The artifacts are laid out as actions/download-artifact lays them (one folder per artifact name), each
holding what a cells job uploads: its run folder with run.json and one cell folder, written in the
contract's format by tests/synthetic_run.py (lm-eval results + samples, vllm bench JSON + logs, JUnit).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import synthetic_run
from ci_scripts import load_ci_script
from kvgate.matrix import cells as kvmatrix
from kvgate.matrix.views import gha_matrix

ROOT = Path(__file__).resolve().parents[1]
NOX = f"{sys.executable} -m nox"
FLASHINFER_MLA_DIFF = ["vllm/v1/attention/backends/mla/flashinfer_mla.py"]




gate_job = load_ci_script("gate_job")


def planned_matrix(changed: list[str]) -> str:
    """What the plan job outputs for this diff (ci/plan.py's own test runs it through nox)."""
    matrix = kvmatrix.load()
    return json.dumps(gha_matrix(matrix, matrix.select(changed_files=changed)))


def seed_cells(tmp_path: Path) -> Path:
    """The seed case's FLASHINFER_MLA cells (auto, fp8): what a diff of flashinfer_mla.py plans on CUDA."""
    run = tmp_path / "seed"
    synthetic_run.write_seed_run(run)
    return run


def download_layout(seed: Path, artifacts: Path, cells: list[str]) -> Path:
    """artifacts/kvgate-cell-<id>/{run.json, <id>/...}: one folder per artifact, as download-artifact writes."""
    for cell in cells:
        folder = artifacts / f"kvgate-cell-{cell}"
        shutil.copytree(seed / cell, folder / cell)
        (folder / "run.json").write_text(json.dumps({"contract_version": 1, "runner": f"b200-{cell[-9:]}",
                                                     "gpus": [{"name": "NVIDIA B200"}]}))
    return artifacts


def job_environment(tmp_path: Path, planned: str, **extra: str) -> dict[str, str]:
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 4242, "head": {"sha": "a" * 40}}}))
    return {**os.environ, "ARTIFACTS_DIR": str(tmp_path / "artifacts"), "KVGATE_RUN_DIR": str(tmp_path / "run"),
            "PLANNED_MATRIX": planned, "PLAN_RESULT": "success", "CELLS_RESULT": "failure",
            "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "GITHUB_EVENT_PATH": str(event),
            "GITHUB_SHA": "b" * 40, "GITHUB_EVENT_NAME": "pull_request", "KVGATE_NOX": NOX, **extra}


# ------------------------------------------------------------------------------------------------ end to end

@pytest.mark.slow
def test_a_missing_cell_fails_the_gate_and_the_summary_says_which(tmp_path, capsys):
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", ["flashinfer_mla-auto-sm100"])
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF))

    status = gate_job.run(env)

    summary = (tmp_path / "summary.md").read_text()
    print(summary)
    assert status == 1
    assert "flashinfer_mla-fp8-sm100" in summary
    verdict = json.loads((tmp_path / "run" / "gate" / "verdict.json").read_text())
    failing = {(c["cell"], c["status"]) for c in verdict["checks"] if c["status"] in ("fail", "error", "missing")}
    assert ("flashinfer_mla-fp8-sm100", "error") in failing
    assert {cell for cell, _ in failing} == {"flashinfer_mla-fp8-sm100"}
    assert json.loads((tmp_path / "run" / "gate" / "pull_request.json").read_text()) == {
        "number": 4242, "head_sha": "a" * 40}
    run_info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert sorted(run_info["jobs"]) == ["kvgate-cell-flashinfer_mla-auto-sm100"]
    assert "::error::cell flashinfer_mla-fp8-sm100: no artifact from its job" in capsys.readouterr().out


@pytest.mark.slow
def test_every_planned_cell_present_passes_with_the_report_in_the_summary(tmp_path):
    seed = seed_cells(tmp_path)
    cells = ["flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"]
    download_layout(seed, tmp_path / "artifacts", cells)
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="success")

    status = gate_job.run(env)

    summary = (tmp_path / "summary.md").read_text()
    print(summary)
    assert status == 0
    assert summary.count((tmp_path / "run" / "gate" / "report.md").read_text()) == 1  # once, not twice
    assert "No baseline" in summary


@pytest.mark.slow
def test_a_cell_killed_mid_run_fails_its_unreported_stages(tmp_path):
    seed = seed_cells(tmp_path)
    cells = ["flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"]
    download_layout(seed, tmp_path / "artifacts", cells)
    killed = tmp_path / "artifacts" / "kvgate-cell-flashinfer_mla-fp8-sm100" / "flashinfer_mla-fp8-sm100"
    shutil.rmtree(killed / "throughput")  # the job timed out during the throughput stage
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="failure")

    assert gate_job.run(env) == 1
    verdict = json.loads((tmp_path / "run" / "gate" / "verdict.json").read_text())
    errors = {(c["cell"], c["kind"]) for c in verdict["checks"] if c["status"] == "error"}
    assert errors and {cell for cell, _ in errors} == {"flashinfer_mla-fp8-sm100"}


@pytest.mark.slow
def test_the_baseline_is_passed_to_the_gate(tmp_path, capsys):
    seed = seed_cells(tmp_path)
    cells = ["flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"]
    download_layout(seed, tmp_path / "artifacts", cells)
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), BASELINE_DIR=str(seed))

    assert gate_job.run(env) == 0
    out = capsys.readouterr().out
    assert f"--baseline {seed}" in out
    assert "No baseline" not in (tmp_path / "summary.md").read_text()


def test_nothing_planned_passes_with_a_note_and_runs_no_gate(tmp_path):
    env = job_environment(tmp_path, json.dumps({"include": []}), KVGATE_NOX="/bin/false", CELLS_RESULT="skipped")

    assert gate_job.run(env) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("## kvgate: nothing to check\n")
    assert (tmp_path / "run" / "gate" / "report.md").read_text() == summary


def test_a_failed_plan_fails_the_gate_job(tmp_path):
    env = job_environment(tmp_path, "", PLAN_RESULT="failure", KVGATE_NOX="/bin/false")

    assert gate_job.run(env) == 1
    assert "The plan job ended `failure`" in (tmp_path / "summary.md").read_text()


def test_a_gate_that_writes_no_report_fails_with_its_output_in_the_summary(tmp_path):
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", ["flashinfer_mla-auto-sm100"])
    env = job_environment(tmp_path, planned_matrix([]), KVGATE_NOX="/bin/false")

    assert gate_job.run(env) == 1
    assert "exited 1 without writing gate/report.md" in (tmp_path / "summary.md").read_text()


def test_the_run_folder_must_start_empty(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "stale.txt").write_text("x")
    with pytest.raises(gate_job.GateJobError, match="must start empty"):
        gate_job.run(job_environment(tmp_path, ""))


# ------------------------------------------------------------------------------------------------ parts

def test_assembly_keeps_two_cell_folders_of_the_same_name_apart(tmp_path):
    seed = seed_cells(tmp_path)
    artifacts = tmp_path / "artifacts"
    for name in ("kvgate-cell-a", "kvgate-cell-b"):
        shutil.copytree(seed / "flashinfer_mla-auto-sm100", artifacts / name / "flashinfer_mla-auto-sm100")
    (artifacts / "kvgate-cell-b" / "run.json").write_text("{not json")
    (tmp_path / "run").mkdir()

    found = gate_job.assemble(artifacts, tmp_path / "run")

    assert sorted(found.cells) == ["flashinfer_mla-auto-sm100", "kvgate-cell-b--flashinfer_mla-auto-sm100"]
    assert found.problems == ["kvgate-cell-b/run.json is unreadable; left out of run.json"]


def test_a_missing_cell_gets_its_identity_and_errored_stages(tmp_path):
    entry = json.loads(planned_matrix(FLASHINFER_MLA_DIFF))["include"][1]
    folder = gate_job.write_missing_cell(tmp_path, entry, "no results")
    cell = json.loads((folder / "cell.json").read_text())
    assert {k: cell[k] for k in gate_job.IDENTITY_KEYS} == {
        "backend": "FLASHINFER_MLA", "kv_cache_dtype": "fp8", "arch": "sm100",
        "model": "deepseek-ai/DeepSeek-V2-Lite-Chat"}
    assert json.loads((folder / "status.json").read_text()) == {
        stage: {"status": "error", "reason": "no results"} for stage in ("kernels", "accuracy", "throughput")}


def test_reported_stages_are_left_as_the_runner_wrote_them(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "status.json").write_text(json.dumps({"throughput": {"status": "skipped", "reason": "cpu"}}))
    assert gate_job.mark_unreported_stages(tmp_path, gate_job.CELL_STAGES, "killed") == ["accuracy"]
    assert json.loads((tmp_path / "status.json").read_text()) == {
        "throughput": {"status": "skipped", "reason": "cpu"}, "accuracy": {"status": "error", "reason": "killed"}}


def test_the_stages_a_cell_runs_are_the_runners_stages():
    from kvgate.runners.matrix_run import STAGES

    assert gate_job.CELL_STAGES == STAGES


def test_summary_is_clipped_at_a_line_under_the_limit():
    text = "".join(f"| row {i} | é |\n" for i in range(1000))
    clipped = gate_job.clip(text, 200, "_(cut)_")
    assert len(clipped.encode()) <= 200
    assert clipped.endswith("|\n\n_(cut)_\n")
    assert gate_job.clip("short\n", 200, "_(cut)_") == "short\n"


def test_bad_planned_matrix_is_an_error():
    with pytest.raises(gate_job.GateJobError, match=r"\$PLANNED_MATRIX: not JSON"):
        gate_job.planned_cells("{")
