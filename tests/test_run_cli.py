"""`kvgate run` without an engine: bad input (one ERROR line, exit 2) and cells of another machine (skipped)."""

from __future__ import annotations

import json

import pytest

from kvgate.cli import main


@pytest.mark.parametrize(("argv", "error"), [
    (["run", "cell", "--run-dir", "x"],
     "ERROR kvgate run cell: no cell named. Pass --cell ID (see `kvgate matrix`)"),
    (["run", "accuracy", "--run-dir", "x", "--stages", "kernels"],
     "ERROR --stages: only `kvgate run cell` takes --stages. `kvgate run accuracy` runs the accuracy stage"),
    (["run", "cell", "--run-dir", "x", "--cell", "cpu_attn-auto-cpu", "--stages", "kernel"],
     "ERROR --stages: unknown stage 'kernel'. Did you mean kernels?"),
    (["run", "accuracy", "--run-dir", "x", "--arch-default", "sm91"],
     "ERROR --arch-default: unknown arch 'sm91'. Did you mean sm90?"),
    (["run", "accuracy", "--run-dir", "x", "--cell", "cpu_attn-fp9-cpu"],
     "ERROR --cell: unknown cell 'cpu_attn-fp9-cpu'. Did you mean cpu_attn-fp8-cpu?"),
    (["run", "throughput", "--run-dir", "x", "--timeout", "0"],
     "ERROR --timeout: expected a positive number of seconds, got 0"),
    (["run", "cell", "--run-dir", "x", "--cell", "cpu_attn-auto-cpu", "--limit", "5"],
     "ERROR kvgate run cell: unrecognized arguments: --limit 5. Pass-through flags go to one tool: use "
     "`kvgate run accuracy` (lm_eval) or `kvgate run throughput` (vllm bench throughput)"),
])
def test_bad_input_is_one_error_line_and_exit_2(argv, error, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == error
    assert not (tmp_path / "x").exists()


def test_cells_of_another_arch_are_skipped_with_the_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVGATE_ARCH", "cpu")
    assert main(["run", "throughput", "--run-dir", str(tmp_path / "run"), "--cell", "flashinfer_mla-fp8-sm100"]) == 0
    status = json.loads((tmp_path / "run" / "flashinfer_mla-fp8-sm100" / "status.json").read_text())
    reason = "cell flashinfer_mla-fp8-sm100 needs sm100; this machine is cpu (set KVGATE_ARCH to override)"
    assert status == {"throughput": {"status": "skipped", "reason": reason}}
    cell = json.loads((tmp_path / "run" / "flashinfer_mla-fp8-sm100" / "cell.json").read_text())
    assert (cell["backend"], cell["kv_cache_dtype"], cell["arch"], cell["task"]) == ("FLASHINFER_MLA", "fp8", "sm100",
                                                                                         "kvgate_gsm8k_test_train")
    assert "1 stage runs, 0 ok, 0 failed, 1 skipped" in capsys.readouterr().out


def _earlier_run(folder, *, spec="release", sides=("head",), accuracy="ok", cells=("cpu_attn-auto-cpu",)):
    """A results folder as an earlier `kvgate run` on this machine left it (run.json + each cell's status.json)."""
    from kvgate.change.sides import prepare_sides

    side = prepare_sides(spec, None)[0]
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"sides": list(sides), "vllm_under_test": {
        name: side.vllm.as_record() for name in sides}}))
    for cell in cells:
        name = cell if "base" not in sides else f"{cell}--base"
        (folder / name).mkdir()
        (folder / name / "status.json").write_text(json.dumps({"accuracy": {"status": accuracy},
                                                               "probe": {"status": "ok"}}))
    return folder


@pytest.mark.parametrize(("earlier", "error"), [
    ({"spec": "patch:canaries/harmless-refactor.patch"},
     "its head side ran 'patch:canaries/harmless-refactor.patch', not this run's --base-vllm ('release') with the "
     "same changes in vllm_under_test.head. Reuse a run of the same vLLM, or run the base side again"),
    ({"accuracy": "error"}, "its accuracy stage is not ok in accuracy. Reuse a run whose stages all passed, or run "
                            "the base side again"),
    ({"cells": ()}, "no readable status.json: cell cpu_attn-auto-cpu did not run there. Run the base side again "
                    "(leave out --base-from)"),
])
def test_a_base_side_is_reused_only_when_it_ran_the_same_vllm_and_every_stage_passed(tmp_path, capsys, earlier,
                                                                                      error, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[1])
    base = _earlier_run(tmp_path / "base", **earlier)
    argv = ["run", "accuracy", "--run-dir", str(tmp_path / "x"), "--cell", "cpu_attn-auto-cpu", "--vllm",
            "patch:canaries/harmless-refactor.patch", "--base-vllm", "release", "--base-from", str(base)]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith(error)
    assert not (tmp_path / "x").exists()


def test_base_from_needs_an_ab_run_and_no_throughput(tmp_path, capsys):
    base = _earlier_run(tmp_path / "base")
    assert main(["run", "accuracy", "--run-dir", str(tmp_path / "x"), "--cell", "cpu_attn-auto-cpu",
                 "--base-from", str(base)]) == 2
    assert capsys.readouterr().err.strip() == "ERROR --base-from: reuses the base side of an A/B run. Pass --base-vllm too"
    assert main(["run", "throughput", "--run-dir", str(tmp_path / "x"), "--cell", "cpu_attn-auto-cpu", "--vllm",
                 "release", "--base-vllm", "release", "--base-from", str(base)]) == 2
    assert "throughput compares the two sides run by turns" in capsys.readouterr().err


def test_a_base_side_that_stopped_early_is_not_reused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[1])
    base = _earlier_run(tmp_path / "base")
    status = base / "cpu_attn-auto-cpu" / "status.json"
    status.write_text(json.dumps({"accuracy": {"status": "ok", "question_plan": {
        "design": "kvgate-gs/1", "questions": 1331, "looks": [333, 666, 999, 1331], "answered": 333}},
        "probe": {"status": "ok"}}))
    assert main(["run", "accuracy", "--run-dir", str(tmp_path / "x"), "--cell", "cpu_attn-auto-cpu", "--vllm",
                 "patch:canaries/harmless-refactor.patch", "--base-vllm", "release", "--base-from", str(base)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "cell cpu_attn-auto-cpu stopped after 333 of 1331 questions in accuracy.question_plan. A base side answers "
        "them all: make it with `kvgate run ... --powered`")
