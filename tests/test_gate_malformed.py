"""Bad input: one whole `ERROR <file>: ...` line per problem, never a traceback.

Input unusable as a whole (a missing run folder, run.json, two folders of one cell, no cell at all) exits 2 with no
verdict. A corrupt file inside one cell's folder (truncated by a killed job, against its schema) is that cell's
error: exit 1, the ERROR line printed, the report written with the other cells judged as usual."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvgate.cli import main
from kvgate.report.inert_text import escape_text
from kvgate.results import cell_folder
from kvgate.results.records import CONTRACT_VERSION
from synthetic_run import paired_outcomes, write_accuracy, write_cell, write_kernels, write_throughput

FP8 = "flashinfer_mla-fp8-sm100"
AUTO = "flashinfer_mla-auto-sm100"


def build_run(run_dir: Path, n: int = 300) -> Path:
    auto, fp8 = paired_outcomes(n, reference_correct=int(0.65 * n), only_reference=20, only_candidate=15)
    for dtype, outcomes, rps in (("auto", auto, (3.2, 3.22)), ("fp8", fp8, (3.5, 3.55))):
        cell = write_cell(run_dir, backend="FLASHINFER_MLA", kv_cache_dtype=dtype, arch="sm100")
        write_accuracy(cell, {"strict-match": outcomes, "flexible-extract": outcomes})
        write_throughput(cell, rps)
        write_kernels(cell)
    return run_dir


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return build_run(tmp_path / "run")


def _results(run: Path, cell: str) -> Path:
    return next((run / cell / "accuracy").rglob("results_*.json"))


def _samples(run: Path, cell: str) -> Path:
    return next((run / cell / "accuracy").rglob("samples_*.jsonl"))


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _set_cell(key: str, value: object) -> Callable[[Path], None]:
    return lambda run: _edit_json(run / FP8 / "cell.json", lambda d: d.__setitem__(key, value))


def _truncate(path_of: Callable[[Path], Path], keep: int = 40) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        path = path_of(run)
        path.write_text(path.read_text()[:keep])
    return apply


def _duplicate(run: Path) -> None:
    shutil.copytree(run / FP8, run / "fp8-again")


def _empty(run: Path) -> None:
    shutil.rmtree(run)
    run.mkdir()


def _garbage_sample_line(run: Path) -> None:
    path = _samples(run, FP8)
    lines = path.read_text().splitlines()
    lines[6] = "Killed"
    path.write_text("\n".join(lines) + "\n")


def _drop_task(run: Path) -> None:
    _edit_json(_results(run, AUTO), lambda d: d["results"].update({"mmlu": d["results"].pop("kvgate_gsm8k_test_train")}))


def _nan_mean(run: Path) -> None:
    path = _results(run, AUTO)
    path.write_text(path.read_text().replace('"exact_match,strict-match": 0.65', '"exact_match,strict-match": NaN'))


def _status(entries: dict) -> Callable[[Path], None]:
    return lambda run: (run / FP8 / "status.json").write_text(json.dumps(entries))


def _second_results(run: Path) -> None:
    first = _results(run, FP8)
    shutil.copy(first, first.with_name("results_2026-12-01T00-00-00.000000.json"))


def _orphan_folder(run: Path) -> None:
    (run / "stray" / "accuracy").mkdir(parents=True)


def _bench(change: dict) -> Callable[[Path], None]:
    return lambda run: _edit_json(run / FP8 / "throughput" / "repeat-1.json", lambda d: d.update(change))


def _text(relative: str, text: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        path = run / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return apply


def _killed_mid_write(run: Path) -> None:
    """status.json as a job killed while writing it leaves it: kvgate's own writer's file, cut half-way."""
    cell_folder.write_status(run / FP8, "accuracy", "ok", elapsed_s=12.5, strict_match=0.61)
    cell_folder.write_status(run / FP8, "throughput", "ok")
    path = run / FP8 / "status.json"
    text = path.read_text()
    path.write_text(text[:len(text) // 2])


R = "{run}"
RUN_CASES = {
    "duplicate cells": (_duplicate,
                        [f"ERROR {R}/fp8-again/cell.json: duplicate cell {FP8} (model deepseek-ai/DeepSeek-V2-Lite-Chat, "
                         f"task kvgate_gsm8k_test_train) in the top level. {R}/{FP8}/cell.json is the same cell; keep one of them"]),
    "empty run folder": (_empty, [f"ERROR {R}: no cell folders (none holds a cell.json). Is this a run folder? "
                                  "Each cell writes <run dir>/<cell id>/cell.json"]),
    "newer run.json": (_text("run.json", '{"contract_version": 3}'),
                       [f"ERROR {R}/run.json: written for results contract version 3, but this kvgate reads "
                        f"version {CONTRACT_VERSION} in contract_version. Upgrade kvgate to a release that reads it"]),
    "run.json version of 5000 digits": (_text("run.json", json.dumps({"contract_version": "9" * 5000})),
                                        [f"ERROR {R}/run.json: expected a version number like 1 or \"1.0\", got string "
                                         f"'{'9' * 40}' in contract_version"]),
    "run.json against its schema": (_text("run.json", '{"contract_version": "1.8", "planned_stages": '
                                                      '{"flashinfer_mla-fp8-sm100": ["accuracy", "speed"]}}'),
                                    [f"ERROR {R}/run.json: expected \"kernels\" or \"accuracy\" or \"throughput\" or "
                                     "\"probe\", got string 'speed' in planned_stages['flashinfer_mla-fp8-sm100'][1]"]),
}

# case -> (how the run is broken, the ERROR lines, the (cell, kind) checks that error for it)
CELL_CASES = {
    "status.json of a job killed mid-write": (_killed_mid_write,
                                              [f"ERROR {R}/{FP8}/status.json: truncated JSON in line 5 column 5"],
                                              {(FP8, "cell")}),
    "truncated cell.json": (_truncate(lambda r: r / FP8 / "cell.json"),
                            [f"ERROR {R}/{FP8}/cell.json: truncated JSON in line 3 column 14"], {(FP8, "cell")}),
    "cell.json not an object": (_text(f"{FP8}/cell.json", "[]"),
                                [f"ERROR {R}/{FP8}/cell.json: expected an object, got a list in the top level"], {(FP8, "cell")}),
    "wrong type in cell.json": (_set_cell("arch", 100),
                                [f"ERROR {R}/{FP8}/cell.json: expected a string, got number 100 in arch"], {(FP8, "cell")}),
    "missing identity key": (lambda r: _edit_json(r / FP8 / "cell.json", lambda d: d.pop("model")),
                             [f"ERROR {R}/{FP8}/cell.json: missing key 'model' in the top level"], {(FP8, "cell")}),
    "unknown backend": (_set_cell("backend", "FLASHINFR_MLA"),
                        [f"ERROR {R}/{FP8}/cell.json: unknown backend 'FLASHINFR_MLA' in backend. "
                         "Did you mean FLASHINFER_MLA?"], {(FP8, "cell")}),
    "unknown dtype": (_set_cell("kv_cache_dtype", "fp4"),
                      [f"ERROR {R}/{FP8}/cell.json: unknown kv_cache_dtype 'fp4' in kv_cache_dtype. "
                       "Did you mean fp8?"], {(FP8, "cell")}),
    "unknown arch": (_set_cell("arch", "h100"),
                     [f"ERROR {R}/{FP8}/cell.json: unknown arch 'h100' in arch. Did you mean sm100?"], {(FP8, "cell")}),
    "newer contract major version": (_set_cell("contract_version", "2.0"),
                                     [f"ERROR {R}/{FP8}/cell.json: written for results contract version 2.0, but "
                                      f"this kvgate reads version {CONTRACT_VERSION} in contract_version. Upgrade kvgate to a release "
                                      "that reads it"], {(FP8, "cell")}),
    "contract version of a digit Python cannot read": (_set_cell("contract_version", "\u00b2.0"),
                                                        [f"ERROR {R}/{FP8}/cell.json: expected a version number like 1 "
                                                         "or \"1.0\", got string '\u00b2.0' in contract_version"],
                                                        {(FP8, "cell")}),
    "cell folder without cell.json": (_orphan_folder,
                                      [f"ERROR {R}/stray: cell folder without cell.json. Write cell.json with "
                                       "backend, kv_cache_dtype, arch and model"], {("stray", "cell")}),
    "results without the cell's task": (_drop_task,
                                       [f"ERROR {R}/{AUTO}/accuracy/deepseek-ai__DeepSeek-V2-Lite-Chat/"
                                        "results_2026-11-30T10-00-00.000000.json: no results for task 'kvgate_gsm8k_test_train' in "
                                        "results. Tasks found: mmlu"], {(AUTO, "accuracy"), (FP8, "fp8_accuracy")}),
    "truncated results json": (_truncate(lambda r: _results(r, AUTO), keep=200),
                               [f"ERROR {R}/{AUTO}/accuracy/deepseek-ai__DeepSeek-V2-Lite-Chat/"
                                "results_2026-11-30T10-00-00.000000.json: truncated JSON in line 8 column 3"], {(AUTO, "accuracy"), (FP8, "fp8_accuracy")}),
    "NaN accuracy": (_nan_mean,
                     [f"ERROR {R}/{AUTO}/accuracy/deepseek-ai__DeepSeek-V2-Lite-Chat/"
                      "results_2026-11-30T10-00-00.000000.json: NaN is not a number JSON allows in the file. "
                      "Write a finite number or null"], {(AUTO, "accuracy"), (FP8, "fp8_accuracy")}),
    "accuracy above 1": (lambda r: _edit_json(_results(r, AUTO), lambda d: d["results"]["kvgate_gsm8k_test_train"].update(
                             {"exact_match,flexible-extract": 65.2})),
                         [f"ERROR {R}/{AUTO}/accuracy/deepseek-ai__DeepSeek-V2-Lite-Chat/"
                          "results_2026-11-30T10-00-00.000000.json: expected a number <= 1, got 65.2 in "
                          "results.kvgate_gsm8k_test_train['exact_match,flexible-extract']"], {(AUTO, "accuracy"), (FP8, "fp8_accuracy")}),
    "garbage line in a sample log": (_garbage_sample_line,
                                     [f"ERROR {R}/{FP8}/accuracy/deepseek-ai__DeepSeek-V2-Lite-Chat/"
                                      "samples_kvgate_gsm8k_test_train_2026-11-30T10-00-00.000000.jsonl: not a JSON object (Expecting "
                                      "value at column 1) in line 7. Each line must be one sample record as lm-eval "
                                      "--log_samples writes it"], {(FP8, "accuracy"), (FP8, "fp8_accuracy")}),
    "two lm-eval results files": (_second_results,
                                  [f"ERROR {R}/{FP8}/accuracy: 2 lm-eval results files (deepseek-ai__DeepSeek-V2-"
                                   "Lite-Chat/results_2026-11-30T10-00-00.000000.json, deepseek-ai__DeepSeek-V2-Lite-"
                                   "Chat/results_2026-12-01T00-00-00.000000.json) in the folder. Keep the one of this "
                                   "cell's run; the stage folder should hold one lm-eval run"], {(FP8, "accuracy"), (FP8, "fp8_accuracy")}),
    "negative throughput": (_bench({"requests_per_second": -3.5}),
                            [f"ERROR {R}/{FP8}/throughput/repeat-1.json: expected a number > 0, got -3.5 in "
                             "requests_per_second"], {(FP8, "throughput")}),
    "throughput as a string": (_bench({"tokens_per_second": "32757.46"}),
                               [f"ERROR {R}/{FP8}/throughput/repeat-1.json: expected a number, got string "
                                "'32757.46' in tokens_per_second"], {(FP8, "throughput")}),
    "unknown stage status": (_status({"accuracy": {"status": "crashed"}}),
                             [f"ERROR {R}/{FP8}/status.json: expected \"ok\" or \"error\" or \"timeout\" or "
                              "\"skipped\", got string 'crashed' in accuracy.status"], {(FP8, "cell")}),
    "unknown stage in status.json": (_status({"acuracy": {"status": "ok"}}),
                                     [f"ERROR {R}/{FP8}/status.json: unknown key 'acuracy' in the top level. "
                                      "Did you mean accuracy?"], {(FP8, "cell")}),
    "garbage junit.xml": (_text(f"{FP8}/kernels/junit.xml", "<testsuites><testcase"),
                          [f"ERROR {R}/{FP8}/kernels/junit.xml: not valid JUnit XML (Couldn't find end of Start Tag "
                           "testcase line 1, line 1, column 22 (<string>, line 1)) in the file. Expected pytest "
                           "--junitxml output"], {(FP8, "kernels")}),
    "probe file of another tool": (_text(f"{FP8}/probe/probe.json", '{"format": "other"}'),
                                   [f"ERROR {R}/{FP8}/probe/probe.json: not a kvgate probe file (format 'other') in "
                                    "'format'. Expected format 'kvgate-probe'"], {(FP8, "probe")}),
    "several problems at once": (lambda r: (_set_cell("arch", "sm101")(r), _bench({"elapsed_time": 0})(r),
                                            _text(f"{AUTO}/kernels/junit.xml", "")(r)),
                                 [f"ERROR {R}/{AUTO}/kernels/junit.xml: empty file in the file. Expected pytest "
                                  "--junitxml output",
                                  f"ERROR {R}/{FP8}/cell.json: unknown arch 'sm101' in arch. Did you mean sm120?"],
                                 {(AUTO, "kernels"), (FP8, "cell")}),
}


@pytest.mark.parametrize("case", list(RUN_CASES))
def test_input_unusable_as_a_whole_exits_2_with_whole_error_lines(case, run, capsys):
    mutate, expected = RUN_CASES[case]
    mutate(run)
    status = main(["gate", str(run), "--today", "2026-11-30"])
    err = capsys.readouterr().err
    print(err)
    assert status == 2
    assert err.splitlines() == [line.replace(R, str(run)) for line in expected]
    assert not (run / "gate").exists()  # no verdict from unusable input


def _gated_with_errors(run: Path, capsys, *flags: str) -> tuple[int, list[str], dict]:
    status = main(["gate", str(run), "--today", "2026-11-30", *flags])
    err = capsys.readouterr().err
    print(err)
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    return status, [line for line in err.splitlines() if line.startswith("ERROR ")], verdict


@pytest.mark.parametrize("case", list(CELL_CASES))
def test_a_corrupt_file_in_a_cell_errors_that_cell_and_the_rest_is_judged(case, run, capsys):
    mutate, expected, errored = CELL_CASES[case]
    mutate(run)
    status, errors, verdict = _gated_with_errors(run, capsys)
    expected = [line.replace(R, str(run)) for line in expected]
    assert status == 1
    assert errors == expected
    checks = verdict["checks"]
    assert {(c["cell"], c["kind"]) for c in checks if c["status"] == "error"} == errored
    for line in expected:  # the report names the file and the reason
        assert any(line.removeprefix("ERROR ") in c["detail"] for c in checks if c["status"] == "error")
        # report.md names the file as inert Markdown text (kvgate.report.inert_text: `__` escaped)
        assert escape_text(line.removeprefix("ERROR ").split(": ", 1)[0], "") in (run / "gate" / "report.md").read_text()
    intact = {AUTO, FP8} - {cell for cell, _ in errored}  # a cell no problem touched is judged as usual
    for cell in intact:
        assert {c["kind"]: c["status"] for c in checks if c["cell"] == cell}["kernels"] == "pass"


def test_the_policy_comes_from_the_matrix_folder_given(run, tmp_path, capsys):
    """`--matrix-dir DIR` reads DIR/policy.toml, as `kvgate run` does; `--policy FILE` still overrides it."""
    matrix = tmp_path / "matrix"
    shutil.copytree(Path(__file__).resolve().parents[1] / "matrix", matrix)
    policy = matrix / "policy.toml"
    good = policy.read_text()
    policy.write_text(good.replace("[accuracy]\n", "[accuracy]\nfp8_tax_point = 3.0\n", 1))
    assert main(["gate", str(run), "--matrix-dir", str(matrix)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ERROR {policy}: unknown key 'fp8_tax_point' in accuracy"), err
    (tmp_path / "good.toml").write_text(good)
    assert main(["gate", str(run), "--matrix-dir", str(matrix), "--policy", str(tmp_path / "good.toml")]) in (0, 1)


def test_missing_run_folder(tmp_path, capsys):
    assert main(["gate", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == (f"ERROR {tmp_path / 'nope'}: no such folder. Pass the run folder the runners "
                                       "wrote (reports/runs/...)\n")


def test_problems_of_run_and_baseline_are_all_reported(tmp_path, capsys):
    run = build_run(tmp_path / "run")
    baseline = build_run(tmp_path / "base")
    _set_cell("backend", "TRITON")(run)
    _bench({"num_requests": 0})(baseline)
    status, errors, verdict = _gated_with_errors(run, capsys, "--baseline", str(baseline))
    assert status == 1
    assert errors == [
        f"ERROR {run}/{FP8}/cell.json: unknown backend 'TRITON' in backend. Did you mean TRITON_MLA?",
        f"ERROR {baseline}/{FP8}/throughput/repeat-1.json: expected an integer >= 1, got 0 in num_requests",
    ]
    assert {(c["cell"], c["kind"]) for c in verdict["checks"] if c["status"] == "error"} == {(FP8, "cell")}
    auto = {c["kind"]: c["status"] for c in verdict["checks"] if c["cell"] == AUTO}
    assert auto["baseline_accuracy"] == "pass" and auto["throughput"] == "pass"


@pytest.mark.parametrize(("flags", "message"), [
    (["--require", "accuracy,speed"], "ERROR --require: unknown stage 'speed'. Stages: kernels, accuracy, throughput, "
                                      "probe (comma-separated), or all"),
    (["--today", "30/11/2026"], "ERROR --today: bad date '30/11/2026'. Write YYYY-MM-DD, e.g. 2026-11-30"),
])
def test_bad_flags(flags, message, run, capsys):
    assert main(["gate", str(run), *flags]) == 2
    assert capsys.readouterr().err == message + "\n"


def test_the_installed_command_prints_no_traceback(run):
    """The same through a real process: stderr is the ERROR lines and nothing else."""
    _garbage_sample_line(run)
    _bench({"requests_per_second": float("nan")})(run)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    done = subprocess.run([sys.executable, "-m", "kvgate", "gate", str(run)], capture_output=True, text=True,
                          env=env, check=False)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if not line.startswith("kvgate gate: ")] == [
        f"ERROR {run}/{FP8}/accuracy/deepseek-ai__DeepSeek-V2-Lite-Chat/samples_kvgate_gsm8k_test_train_2026-11-30T10-00-00.000000.jsonl: "
        "not a JSON object (Expecting value at column 1) in line 7. Each line must be one sample record as lm-eval "
        "--log_samples writes it",
        f"ERROR {run}/{FP8}/throughput/repeat-1.json: NaN is not a number JSON allows in the file. "
        "Write a finite number or null",
    ]
