"""ci/gate_job.py: downloaded artifacts -> one run folder -> the real gate -> step summary and exit status.

The artifacts are laid out as actions/download-artifact lays them (one folder per artifact name), each
holding what a cells job uploads: its run folder with run.json and one cell folder, written in the
contract's format by tests/synthetic_run.py (lm-eval results + samples, vllm bench JSON + logs, JUnit).
Each attack of issue 13 on the gate job is a test here that plays it and checks it now fails safe.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
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
    """What the plan job outputs for this diff of one backend's own module (ci/plan.py's own test runs it through
    nox on a vLLM repository): that backend's cells, with the stages planned for each."""
    from kvgate.cli.matrix_command import gha_extras

    assert changed == FLASHINFER_MLA_DIFF
    matrix = kvmatrix.load()
    cells = matrix.select(backends=["FLASHINFER_MLA"])
    return json.dumps(gha_matrix(matrix, cells, gha_extras(cells, None)))


def seed_cells(tmp_path: Path) -> Path:
    """The seed case's FLASHINFER_MLA cells (auto, fp8), which is what a FLASHINFER_MLA change plans."""
    run = tmp_path / "seed"
    # every stage the plan plans, as its job runs them, with the questions the policy plans for these cells
    synthetic_run.write_seed_run(run, probes=True, contract="1.6",
                                 n=synthetic_run.planned_questions("FLASHINFER_MLA", "fp8", "sm100"))
    return run


def download_layout(seed: Path, artifacts: Path, cells: list[str]) -> Path:
    """artifacts/kvgate-cell-<id>/{run.json, <id>/...}: one folder per artifact, as download-artifact writes."""
    for cell in cells:
        folder = artifacts / f"kvgate-cell-{cell}"
        shutil.copytree(seed / cell, folder / cell)
        (folder / "run.json").write_text(json.dumps({"contract_version": "1.6", "runner": f"b200-{cell[-9:]}",
                                                     "gpus": [{"name": "NVIDIA B200"}]}))
    return artifacts


def job_environment(tmp_path: Path, planned: str, **extra: str) -> dict[str, str]:
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 4242, "head": {"sha": "a" * 40}}}))
    return {**os.environ, "ARTIFACTS_DIR": str(tmp_path / "artifacts"), "KVGATE_RUN_DIR": str(tmp_path / "run"),
            "PLANNED_MATRIX": planned, "PLAN_RESULT": "success", "CELLS_RESULT": "failure",
            "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "GITHUB_EVENT_PATH": str(event),
            "GITHUB_SHA": "b" * 40, "GITHUB_EVENT_NAME": "pull_request", "KVGATE_NOX": NOX, **extra}


def verdict_of(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "gate" / "verdict.json").read_text())


def failing_checks(tmp_path: Path) -> set[tuple[str, str, str]]:
    """(cell id, kind, status) of every failing check; the gate adds ` [model]` where two checks share an id."""
    return {(c["cell"].split(" [")[0], c["kind"], c["status"]) for c in verdict_of(tmp_path)["checks"]
            if c["status"] in ("fail", "error", "missing")}


SEED_CELLS = ["flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"]
AUTO, LOST = SEED_CELLS


def ab_layout(seed: Path, artifacts: Path, cells: list[str], base_lost: tuple[str, ...] = ()) -> None:
    """Each cell's artifact holds its head folder and its base folder (`<id>--base`), as an A/B job writes: the two
    sides' throughput repeats by turns (status.json throughput.interleaved)."""
    download_layout(seed, artifacts, cells)
    for cell in cells:
        head = artifacts / f"kvgate-cell-{cell}" / cell
        folders = [head]
        if cell not in base_lost:
            base = artifacts / f"kvgate-cell-{cell}" / f"{cell}--base"
            shutil.copytree(seed / cell, base)
            record = json.loads((base / "cell.json").read_text())
            (base / "cell.json").write_text(json.dumps({**record, "side": "base"}, indent=2))
            folders.append(base)
        for folder in folders:
            status = json.loads((folder / "status.json").read_text())
            rounds = len(list((folder / "throughput").glob("repeat-*.json")))
            status["throughput"] = {"status": "ok", "interleaved": {"order": ["base", "head"], "rounds": rounds}}
            (folder / "status.json").write_text(json.dumps(status))


# ------------------------------------------------------------------------------------------------ planned = required

@pytest.mark.slow
def test_attack_an_artifact_lost_between_cells_and_gate_fails_named(tmp_path, capsys):
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", [AUTO])  # the fp8 cell's artifact never arrives
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), BASELINE_DIR=str(seed))

    status = gate_job.run(env)

    summary = (tmp_path / "summary.md").read_text()
    print(summary)
    out = capsys.readouterr().out
    assert status == 1
    assert failing_checks(tmp_path) == {(LOST, "cell", "missing")}
    assert LOST in summary
    assert "--expect-cells" in out and "--require-baseline" in out
    assert (f"::error title={LOST}::no results from its job (cells job result: failure); "
            "the gate fails it as missing") in out
    assert json.loads((tmp_path / "run" / "gate" / "pull_request.json").read_text()) == {
        "number": 4242, "head_sha": "a" * 40}
    run_info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert sorted(run_info["jobs"]) == [f"kvgate-cell-{AUTO}"]


@pytest.mark.slow
def test_attack_one_cells_artifact_cannot_stand_in_for_a_lost_one(tmp_path, capsys):
    """The auto job's artifact also carries a (passing) fp8 folder; the fp8 cell's own artifact is lost."""
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", [AUTO])
    shutil.copytree(seed / LOST, tmp_path / "artifacts" / f"kvgate-cell-{AUTO}" / LOST)
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), BASELINE_DIR=str(seed))

    assert gate_job.run(env) == 1
    assert failing_checks(tmp_path) == {(LOST, "cell", "missing")}
    assert (f"::warning::artifact kvgate-cell-{AUTO}: {LOST}/ is not a folder of cell "
            f"{AUTO} ({AUTO}/ or {AUTO}--base/); left out") in capsys.readouterr().out


@pytest.mark.slow
def test_attack_a_folder_named_for_its_cell_but_holding_another_is_left_out(tmp_path, capsys):
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", [AUTO])
    impostor = tmp_path / "artifacts" / f"kvgate-cell-{LOST}" / LOST
    shutil.copytree(seed / AUTO, impostor)  # the auto cell's results under the fp8 name
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), BASELINE_DIR=str(seed))

    assert gate_job.run(env) == 1
    assert failing_checks(tmp_path) == {(LOST, "cell", "missing")}
    assert (f"::warning::artifact kvgate-cell-{LOST}: {LOST}/ holds the cell.json of another cell "
            "(FLASHINFER_MLA, auto, sm100, deepseek-ai/DeepSeek-V2-Lite-Chat); left out") in capsys.readouterr().out


@pytest.mark.slow
def test_attack_an_artifact_cannot_plant_the_gate_report(tmp_path):
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", SEED_CELLS)
    planted = tmp_path / "artifacts" / f"kvgate-cell-{SEED_CELLS[0]}" / "gate"
    shutil.copytree(seed / SEED_CELLS[0], planted)
    (planted / "report.md").write_text("## kvgate gate: PASS (planted)\n")
    (planted / "pull_request.json").write_text(json.dumps({"number": 1, "head_sha": "a" * 40}))
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), BASELINE_DIR=str(seed),
                          CELLS_RESULT="success")

    assert gate_job.run(env) == 0
    assert "planted" not in (tmp_path / "run" / "gate" / "report.md").read_text()
    assert json.loads((tmp_path / "run" / "gate" / "pull_request.json").read_text())["number"] == 4242


@pytest.mark.slow
def test_a_cell_killed_mid_run_fails_its_unreported_stages(tmp_path):
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", SEED_CELLS)
    killed = tmp_path / "artifacts" / "kvgate-cell-flashinfer_mla-fp8-sm100" / "flashinfer_mla-fp8-sm100"
    shutil.rmtree(killed / "throughput")  # the job timed out during the throughput stage
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="failure",
                          BASELINE_DIR=str(seed))

    assert gate_job.run(env) == 1
    errors = {(c["cell"], c["kind"]) for c in verdict_of(tmp_path)["checks"] if c["status"] == "error"}
    assert errors and {cell for cell, _ in errors} == {"flashinfer_mla-fp8-sm100"}


@pytest.mark.slow
def test_every_planned_cell_present_passes_with_the_report_in_the_summary(tmp_path, capsys):
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", SEED_CELLS)
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="success",
                          BASELINE_DIR=str(seed))

    status = gate_job.run(env)

    summary = (tmp_path / "summary.md").read_text()
    print(summary)
    assert status == 0
    assert summary.count((tmp_path / "run" / "gate" / "report.md").read_text()) == 1  # once, not twice
    assert "No baseline" not in summary
    assert f"--baseline {seed}" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ baseline

@pytest.mark.slow
def test_attack_no_baseline_fails_a_pull_request(tmp_path):
    """No baseline (none yet, expired, or the fetch failed) used to be a pass with a note."""
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", SEED_CELLS)
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="success",
                          BASELINE_DIR=str(tmp_path / "absent"), KVGATE_BOOTSTRAP_BASELINE="true")

    assert gate_job.run(env) == 1  # a pull request cannot ask for a bootstrap
    assert failing_checks(tmp_path) == {("(run)", "baseline", "missing")}


@pytest.mark.slow
def test_a_push_run_without_a_baseline_fails(tmp_path):
    """Push runs compare with the previous main run; one that cannot does not silently become the reference."""
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", SEED_CELLS)
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="success",
                          GITHUB_EVENT_NAME="push")

    assert gate_job.run(env) == 1
    assert failing_checks(tmp_path) == {("(run)", "baseline", "missing")}


@pytest.mark.slow
def test_only_a_bootstrap_run_on_main_goes_without_a_baseline(tmp_path):
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", SEED_CELLS)
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="success",
                          GITHUB_EVENT_NAME="workflow_dispatch", KVGATE_BOOTSTRAP_BASELINE="true")

    assert gate_job.run(env) == 0
    assert verdict_of(tmp_path)["neutral"] is True
    assert ("_No baseline: no usable kvgate-run artifact of an earlier run on main was found (a bootstrap run: this "
            "one becomes the first reference)._") in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize(("event", "bootstrap", "required"), [
    ("pull_request", "", True), ("pull_request", "true", True), ("push", "", True), ("push", "false", True),
    ("push", "true", False), ("workflow_dispatch", "true", False), ("schedule", "true", True),
])
def test_the_baseline_is_required_except_on_a_bootstrap_run_on_main(event, bootstrap, required):
    assert gate_job.require_baseline({"GITHUB_EVENT_NAME": event, "KVGATE_BOOTSTRAP_BASELINE": bootstrap}) is required


@pytest.mark.slow
def test_an_ab_run_passes_against_its_own_base_side(tmp_path):
    seed = seed_cells(tmp_path)
    ab_layout(seed, tmp_path / "artifacts", SEED_CELLS)
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="success",
                          KVGATE_SIDES="base,head")

    assert gate_job.run(env) == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["sides"] == ["base", "head"]


@pytest.mark.slow
def test_attack_an_ab_run_whose_base_sides_were_all_lost_fails(tmp_path):
    """Without its base folders an A/B run looks like a run of one side, compared with nothing."""
    seed = seed_cells(tmp_path)
    ab_layout(seed, tmp_path / "artifacts", SEED_CELLS, base_lost=tuple(SEED_CELLS))
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="success",
                          KVGATE_SIDES="base,head")

    assert gate_job.run(env) == 1
    assert failing_checks(tmp_path) == {("(run)", "baseline", "missing")} | {(c, "cell", "missing") for c in SEED_CELLS}


# ------------------------------------------------------------------------------------------------ no plan, bad input

def test_nothing_planned_passes_with_a_note_and_runs_no_gate(tmp_path):
    env = job_environment(tmp_path, json.dumps({"include": []}), KVGATE_NOX="/bin/false", CELLS_RESULT="skipped")

    assert gate_job.run(env) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("## kvgate: nothing to check\n")
    assert (tmp_path / "run" / "gate" / "report.md").read_text() == summary


def stand_in_gate(tmp_path: Path, status: int) -> str:
    """A KVGATE_NOX that does what the gate session does for this job (writes gate/report.md) and exits `status`."""
    script = tmp_path / "gate.sh"
    script.write_text(f'#!/bin/sh\nmkdir -p "$4/gate" && printf "## kvgate\\n" > "$4/gate/report.md"\nexit {status}\n')
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(("plan_result", "planned", "gate", "status"), [
    ("success", {"include": []}, None, 2),  # nothing to check, a pass: 2
    ("failure", None, None, 1),  # the plan failed: the gate job's failure stands
    ("success", {"include": [{"cell": "cpu_attn-fp8-cpu"}]}, 0, 2),  # the gate passed: 2
    ("success", {"include": [{"cell": "cpu_attn-fp8-cpu"}]}, 1, 1),  # a regression stays one
])
def test_a_step_summary_that_cannot_be_written_never_turns_into_a_pass(tmp_path, capsys, plan_result, planned, gate,
                                                                       status):
    """$GITHUB_STEP_SUMMARY naming a folder was an IsADirectoryError traceback after the gate ran; now it is one ERROR
    line naming the variable, the gate's failure stands as it is and a pass becomes 2; report.md is kept."""
    env = job_environment(tmp_path, json.dumps(planned), PLAN_RESULT=plan_result, GITHUB_STEP_SUMMARY=str(tmp_path),
                          GITHUB_REPOSITORY="", KVGATE_NOX="/bin/false" if gate is None else stand_in_gate(tmp_path, gate))

    assert gate_job.run(env) == status
    assert capsys.readouterr().err.endswith(
        f"ERROR $GITHUB_STEP_SUMMARY {tmp_path}: cannot append to it (it is a folder). Point it at a file this job may "
        "write (GitHub Actions sets it for each step), or unset it\n")
    assert (tmp_path / "run" / "gate" / "report.md").read_text().startswith("## kvgate")


def test_a_lost_plan_output_is_not_an_empty_plan(tmp_path):
    env = job_environment(tmp_path, "", KVGATE_NOX="/bin/false")
    with pytest.raises(gate_job.GateJobError) as error:
        gate_job.run(env)
    assert str(error.value) == ("$PLANNED_MATRIX: empty, though the plan job succeeded. Pass the plan job's `matrix` "
                                "output (`{\"include\": []}` when it planned nothing)")


def test_a_planned_feature_cell_is_a_cell_and_a_hostile_id_is_not():
    planned = gate_job.planned_cells(json.dumps({"include": [{"cell": "flashmla-fp8-sm90-spec_decode"}]}))
    assert [e["cell"] for e in planned] == ["flashmla-fp8-sm90-spec_decode"]
    for hostile in ("flashmla-fp8-sm90-spec_decode-x", "flashmla-fp8-sm90-$(id)", "flashmla-fp8-sm90-"):
        with pytest.raises(gate_job.GateJobError):
            gate_job.planned_cells(json.dumps({"include": [{"cell": hostile}]}))


@pytest.mark.parametrize("plan_result", ["failure", "cancelled", "skipped", ""])
def test_a_plan_that_did_not_succeed_fails_the_gate_job(tmp_path, plan_result):
    env = job_environment(tmp_path, "", PLAN_RESULT=plan_result, KVGATE_NOX="/bin/false")

    assert gate_job.run(env) == 1
    assert (f"The plan job ended `{plan_result or 'unknown'}`: no cell was chosen, so nothing can be checked."
            in (tmp_path / "summary.md").read_text())


def test_a_gate_that_writes_no_report_fails_with_its_output_in_the_summary(tmp_path):
    seed = seed_cells(tmp_path)
    download_layout(seed, tmp_path / "artifacts", ["flashinfer_mla-auto-sm100"])
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), KVGATE_NOX="/bin/false")

    assert gate_job.run(env) == 1
    assert "exited 1 without writing gate/report.md" in (tmp_path / "summary.md").read_text()


def test_the_run_folder_must_start_empty(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "stale.txt").write_text("x")
    with pytest.raises(gate_job.GateJobError) as error:
        gate_job.run(job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF)))
    assert str(error.value) == f"{tmp_path / 'run'}: the run folder must start empty; it holds files already"


@pytest.mark.parametrize(("run_dir", "why"), [("file", "it is a file"), ("file/run", "Not a directory")])
def test_a_run_folder_that_cannot_be_made_is_one_error(tmp_path, run_dir, why):
    """$KVGATE_RUN_DIR naming a file (or a folder under one) was a NotADirectoryError traceback."""
    (tmp_path / "file").write_text("x")
    env = job_environment(tmp_path, json.dumps({"include": []}), KVGATE_RUN_DIR=str(tmp_path / run_dir))
    with pytest.raises(gate_job.GateJobError) as error:
        gate_job.run(env)
    assert str(error.value) == (f"$KVGATE_RUN_DIR {tmp_path / run_dir}: cannot make the run folder ({why}). Point it at "
                                "an empty or new folder")
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize(("environ", "message"), [
    ({"KVGATE_SIDES": "base,left"}, "$KVGATE_SIDES: unknown side 'left'. Write base,head or head"),
    ({"KVGATE_BOOTSTRAP_BASELINE": "yes"}, "$KVGATE_BOOTSTRAP_BASELINE: 'yes', expected true or false"),
])
def test_bad_job_settings_are_one_error(tmp_path, environ, message):
    with pytest.raises(gate_job.GateJobError) as error:
        gate_job.run(job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), **environ))
    assert str(error.value) == message


@pytest.mark.parametrize(("value", "message"), [
    ("{", "$PLANNED_MATRIX: not JSON (Expecting property name enclosed in double quotes)"),
    ("[" * 5000, "$PLANNED_MATRIX: not JSON (nested too deep)"),
    ('{"include": [{"cell": "../../etc"}]}',
     '$PLANNED_MATRIX: expected {"include": [{"cell": "<id>", ...}, ...]} from ci/plan.py'),
    ('{"include": [{"cell": "cpu_attn-fp8-cpu", "stages": 5}]}',
     "$PLANNED_MATRIX: expected a list of stages (kernels, accuracy, throughput) in include[0].stages, as ci/plan.py "
     "writes it"),
    ('{"include": [{"cell": "cpu_attn-fp8-cpu", "stages": "accuracy"}]}',
     "$PLANNED_MATRIX: expected a list of stages (kernels, accuracy, throughput) in include[0].stages, as ci/plan.py "
     "writes it"),
    ('{"include": [{"cell": "cpu_attn-fp8-cpu", "not_planned": ["kernels"]}]}',
     "$PLANNED_MATRIX: expected {stage: reason} in include[0].not_planned, as ci/plan.py writes it"),
])
def test_bad_planned_matrix_is_an_error(value, message):
    with pytest.raises(gate_job.GateJobError) as error:
        gate_job.planned_cells(value)
    assert str(error.value) == message


def test_the_script_says_bad_input_in_one_line(tmp_path):
    env = {**job_environment(tmp_path, "{"), "KVGATE_NOX": "/bin/false"}
    result = subprocess.run([sys.executable, "ci/gate_job.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    assert (result.returncode, result.stderr) == (2, "ERROR $PLANNED_MATRIX: not JSON (Expecting property name "
                                                     "enclosed in double quotes)\n")


# ------------------------------------------------------------------------------------------------ parts

@pytest.mark.parametrize("stages", [5, "accuracy"])
def test_planned_stages_of_another_shape_are_one_error_and_write_nothing_into_a_cell(tmp_path, stages):
    """A planned entry's `stages` of another shape was a TypeError traceback (5) or, a string, marked each of its
    letters a failed stage in the cell's status.json; now it is one error, before any artifact is read."""
    cell = tmp_path / "artifacts" / "kvgate-cell-cpu_attn-fp8-cpu" / "cpu_attn-fp8-cpu"
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text(json.dumps({"backend": "CPU_ATTN", "kv_cache_dtype": "fp8", "arch": "cpu"}))
    env = job_environment(tmp_path, json.dumps({"include": [{"cell": "cpu_attn-fp8-cpu", "stages": stages}]}),
                          KVGATE_NOX="/bin/false")
    with pytest.raises(gate_job.GateJobError) as error:
        gate_job.run(env)
    assert str(error.value).startswith("$PLANNED_MATRIX: expected a list of stages")
    assert not (tmp_path / "run" / "cpu_attn-fp8-cpu").exists()


def test_a_cells_artifact_brings_its_own_folders_only(tmp_path):
    seed = seed_cells(tmp_path)
    artifacts = tmp_path / "artifacts"
    own = artifacts / f"kvgate-cell-{SEED_CELLS[0]}"
    shutil.copytree(seed / SEED_CELLS[0], own / SEED_CELLS[0])
    shutil.copytree(seed / SEED_CELLS[0], own / f"{SEED_CELLS[0]}--base")  # head's cell.json in the base folder
    shutil.copytree(seed / SEED_CELLS[1], artifacts / "kvgate-cell-not_planned-fp8-sm100" / SEED_CELLS[1])
    (own / "run.json").write_text("[" * 5000)
    (tmp_path / "run").mkdir()
    planned = json.loads(planned_matrix(FLASHINFER_MLA_DIFF))["include"]

    found = gate_job.assemble(artifacts, tmp_path / "run", planned, ["base", "head"])

    assert sorted(found.cells) == [SEED_CELLS[0]]
    assert found.problems == [
        f"kvgate-cell-{SEED_CELLS[0]}/run.json is unreadable (not JSON, or a number JSON does not allow: NaN, "
        "Infinity, out of a float's range); left out of run.json",
        f"artifact kvgate-cell-{SEED_CELLS[0]}: {SEED_CELLS[0]}--base/ holds a cell.json of the 'head' side; left out",
        "artifact kvgate-cell-not_planned-fp8-sm100: not the artifact of a planned cell; left out",
    ]


def test_reported_stages_are_left_as_the_runner_wrote_them(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "status.json").write_text(json.dumps({"throughput": {"status": "skipped", "reason": "cpu"}}))
    assert gate_job.mark_unreported_stages(tmp_path, gate_job.CELL_STAGES, "killed") == ["accuracy"]
    assert json.loads((tmp_path / "status.json").read_text()) == {
        "throughput": {"status": "skipped", "reason": "cpu"}, "accuracy": {"status": "error", "reason": "killed"}}


def test_the_stages_a_cell_runs_are_the_runners_stages():
    from kvgate.runners.stage_plan import STAGES

    assert gate_job.CELL_STAGES == STAGES


def test_summary_is_clipped_at_a_line_under_the_limit():
    text = "".join(f"| row {i} | é |\n" for i in range(1000))
    clipped = gate_job.clip(text, 200, "_(cut)_")
    assert len(clipped.encode()) <= 200
    assert clipped.endswith("|\n\n_(cut)_\n")
    assert gate_job.clip("short\n", 200, "_(cut)_") == "short\n"


# ---------------------------------------------------------------------------------------- links to the cells' logs

def test_on_buildkite_each_log_links_its_file_in_the_cells_artifact(tmp_path):
    template = gate_job.log_links({"BUILDKITE": "true"}, ["flashmla-fp8-sm90"], tmp_path)
    assert template == "artifact://kvgate-cell-{cell}/{path}"  # the cell step uploads "kvgate-cell-<id>/**/*"


def test_on_github_each_log_links_its_cells_artifact_listed_by_the_api(tmp_path):
    """A stand-in `gh` answers as `gh api --paginate .../artifacts --jq ...` does (name, id per line) and records
    what it was asked; a cell whose artifact is not listed links the run's page, which lists the artifacts."""
    asked = tmp_path / "asked.txt"
    gh = tmp_path / "gh"
    gh.write_text(f"#!{sys.executable}\nimport sys\nopen({str(asked)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
                  "print('kvgate-cell-flashmla-fp8-sm90\\t4711\\nkvgate-gate\\t4712\\nkvgate-cell-x;rm\\tnope')\n")
    gh.chmod(0o755)
    environ = {"GITHUB_REPOSITORY": "acme/vllm", "GITHUB_RUN_ID": "99"}
    argument = gate_job.log_links(environ, ["flashmla-fp8-sm90", "flashmla-auto-sm90"], tmp_path, gh=[str(gh)])
    assert argument == f"@{tmp_path}/log-links.json"
    assert json.loads((tmp_path / "log-links.json").read_text()) == {
        "*": "https://github.com/acme/vllm/actions/runs/99",
        "flashmla-fp8-sm90": "https://github.com/acme/vllm/actions/runs/99/artifacts/4711"}
    assert asked.read_text().startswith("api --paginate repos/acme/vllm/actions/runs/99/artifacts --jq ")
    assert gate_job.log_links({}, ["flashmla-fp8-sm90"], tmp_path) is None  # outside CI: paths, relative


@pytest.mark.parametrize("dangling", [False, True])
def test_attack_an_artifacts_status_json_link_is_never_written_through(tmp_path, dangling):
    """A cell's status.json that is a link (to a file outside the run folder: the baseline's, the trusted checkout's)
    was copied as a link, and marking the cell's unreported stages wrote through it: the cell's artifact rewrote a
    file of the trusted side. Now the copy becomes a file of its own; a dangling link is left for the gate to report."""
    victim = tmp_path / "trusted" / "status.json"
    victim.parent.mkdir()
    if not dangling:
        victim.write_text('{"kernels": {"status": "ok"}}', encoding="utf-8")
    cell = tmp_path / "run" / "flashinfer_mla-fp8-sm100"
    cell.mkdir(parents=True)
    (cell / "status.json").symlink_to(victim)
    marked = gate_job.mark_unreported_stages(cell, gate_job.CELL_STAGES, "killed")
    assert marked == ([] if dangling else ["accuracy", "throughput"])
    if dangling:
        assert not victim.exists() and (cell / "status.json").is_symlink()
    else:
        assert victim.read_text(encoding="utf-8") == '{"kernels": {"status": "ok"}}'
        assert not (cell / "status.json").is_symlink()
        assert json.loads((cell / "status.json").read_text(encoding="utf-8")) == {
            "kernels": {"status": "ok"}, "accuracy": {"status": "error", "reason": "killed"},
            "throughput": {"status": "error", "reason": "killed"}}


@pytest.mark.parametrize("run_json", ['{"x": NaN}', '{"x": Infinity}', '{"x": 1e999}', '{"x": -1e999}'])
def test_attack_a_jobs_run_json_with_a_number_json_does_not_allow_is_left_out(tmp_path, run_json):
    """A cell's run.json went whole into the run's run.json under `jobs`: NaN, Infinity or 1e999 in it were written
    out as NaN / Infinity, no JSON, so the run.json this trusted job wrote was one the gate refuses."""
    seed = seed_cells(tmp_path)
    artifacts = download_layout(seed, tmp_path / "artifacts", SEED_CELLS)
    (artifacts / "kvgate-cell-flashinfer_mla-fp8-sm100" / "run.json").write_text(run_json, encoding="utf-8")
    found = gate_job.assemble(artifacts, tmp_path / "run", [e for e in json.loads(
        planned_matrix(FLASHINFER_MLA_DIFF))["include"]])
    assert "kvgate-cell-flashinfer_mla-fp8-sm100" not in found.run_infos
    assert any("kvgate-cell-flashinfer_mla-fp8-sm100/run.json is unreadable" in p for p in found.problems)
    json.loads(json.dumps(gate_job.merged_run_info(found, {}, [])), parse_constant=lambda c: 1 / 0)  # strict JSON


@pytest.mark.parametrize("event", [{"pull_request": {"number": 5, "head": "abc"}},
                                   {"pull_request": {"number": True, "head": {"sha": "a" * 40}}},
                                   {"pull_request": {"number": 5, "head": None}}])
def test_an_odd_event_payload_names_no_pull_request_sha_rather_than_a_traceback(tmp_path, event):
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event), encoding="utf-8")
    info = gate_job.pull_request_info(str(path))
    assert info is None or info == {"number": 5, "head_sha": ""}


@pytest.mark.slow
def test_attack_a_cell_job_cannot_bring_its_own_base_side_as_the_baseline(tmp_path, capsys):
    """kvgate.yml runs no base side: its baseline is main's run. A pull request's cell job that uploaded a made-up
    `<id>--base` folder beside its own made the run an A/B run that the gate judged against that base side: with no
    baseline of main to be had (none yet, expired, gh failed) the run passed under --require-baseline, compared with
    what the pull request chose. Such folders are now left out where $KVGATE_SIDES names no base side."""
    seed = seed_cells(tmp_path)
    ab_layout(seed, tmp_path / "artifacts", SEED_CELLS)
    env = job_environment(tmp_path, planned_matrix(FLASHINFER_MLA_DIFF), CELLS_RESULT="success")  # no KVGATE_SIDES

    assert gate_job.run(env) == 1
    assert failing_checks(tmp_path) == {("(run)", "baseline", "missing")}
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.is_dir()) == sorted(["gate", *SEED_CELLS])
    out = capsys.readouterr().out
    assert all(f"{cell}--base/ is a base side's folder, but this workflow runs no base side" in out for cell in SEED_CELLS)


def test_an_event_payload_that_is_a_fifo_is_one_error_not_a_job_blocked_for_ever(tmp_path):
    """$GITHUB_EVENT_PATH naming a FIFO blocked the gate job for ever, before any gate ran."""
    fifo = tmp_path / "event.fifo"
    os.mkfifo(fifo)
    env = {**job_environment(tmp_path, json.dumps({"include": []})), "KVGATE_NOX": "/bin/false",
           "GITHUB_EVENT_PATH": str(fifo)}
    result = subprocess.run([sys.executable, "-I", "ci/gate_job.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert (result.returncode, result.stderr) == (2, (
        f"ERROR $GITHUB_EVENT_PATH {fifo}: not a regular file (a FIFO, socket or device). Point it at the event's JSON "
        "payload (GitHub Actions sets it), or unset it\n"))


@pytest.mark.parametrize(("name", "content", "message"), [
    ("/dev/zero", None, "not a regular file (a FIFO, socket or device). Point it at the event's JSON payload (GitHub "
                        "Actions sets it), or unset it"),
    ("big.json", b"{" + b" " * (1 << 20), "more than 1 MiB, larger than any event's payload. Point it at the event's "
                                          "JSON payload, or unset it"),
    ("folder", None, "not a regular file (a folder). Point it at the event's JSON payload (GitHub Actions sets it), or "
                     "unset it"),
    ("missing.json", None, "cannot read it (No such file or directory). Point it at the event's JSON payload (GitHub "
                           "Actions sets it), or unset it"),
    ("broken.json", b'{"pull_request": ', "not JSON. Point it at the event's JSON payload (GitHub Actions sets it), "
                                          "or unset it"),
])
def test_an_event_payload_that_cannot_be_read_is_one_error(tmp_path, monkeypatch, name, content, message):
    """/dev/zero was read without end; a folder, a missing file or broken JSON silently named no pull request."""
    monkeypatch.setattr(gate_job, "EVENT_READ_LIMIT", 1 << 20)
    path = Path(name) if name.startswith("/") else tmp_path / name
    if content is not None:
        path.write_bytes(content)
    elif name == "folder":
        path.mkdir()
    with pytest.raises(gate_job.GateJobError) as error:
        gate_job.pull_request_info(str(path))
    assert str(error.value) == f"$GITHUB_EVENT_PATH {path}: {message}"
