"""junit.xml's times: each check's test case takes the seconds its stage ran, as the cell's status.json records them
(`elapsed_s`), on a real CPU run made by kvgate's runners (tests/fixtures/cpu_run)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from junitparser import JUnitXml

from cpu_run_fixture import extract, matrix_of_the_run
from kvgate.gate import evaluation
from kvgate.gate import policy as policy_module
from kvgate.matrix import cells as matrix_module
from kvgate.report.junit_xml import render_junit
from kvgate.results.parsers.contract import parse_status, stage_duration
from kvgate.results.run_loader import KnownNames, load_run


def recorded_seconds(run: Path) -> dict[tuple[str, str], float]:
    """(cell id, stage) -> elapsed_s, straight from each cell's status.json."""
    seconds = {}
    for status in run.glob("*/status.json"):
        for stage, entry in json.loads(status.read_text()).items():
            if "elapsed_s" in entry:
                seconds[(status.parent.name, stage)] = entry["elapsed_s"]
    return seconds


def test_every_case_takes_the_recorded_seconds_of_its_stage(tmp_path):
    matrix = matrix_module.load(matrix_of_the_run(tmp_path / "matrix"))
    run = extract(tmp_path)
    verdict = evaluation.evaluate(load_run(run, KnownNames.from_matrix(matrix)),
                                  policy=policy_module.load(matrix=matrix), today=dt.date(2026, 11, 30))
    (tmp_path / "junit.xml").write_bytes(render_junit(verdict))
    recorded = recorded_seconds(run)
    assert recorded[("cpu_attn-fp8-cpu", "accuracy")] == 141.8 and recorded[("cpu_attn-fp8-cpu", "throughput")] == 670.2
    stage_of = {"accuracy": "accuracy", "accuracy_floor": "accuracy", "fp8_accuracy": "accuracy",
                "fp8_kv_cache": "accuracy", "throughput": "throughput", "fp8_throughput": "throughput"}
    xml = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    timed = 0
    for suite in xml:
        kind = suite.name.removeprefix("kvgate.")
        total = 0.0
        for case in suite:
            cell = case.name.split("[", 1)[0]
            expected = recorded.get((cell, stage_of.get(kind, kind)))
            print(kind, case.name, case.time, expected)
            assert case.time == expected, (kind, case.name)  # no time where the stage recorded none (the run's checks)
            timed += expected is not None
            total += case.time or 0.0
        assert suite.time == pytest.approx(total)  # the suite's time is its cases' sum
    assert timed >= 9  # accuracy, floor, comparisons and throughput of the three cells carry their stage's time


def test_elapsed_s_is_read_as_seconds_and_a_value_that_is_not_one_is_left_out():
    text = json.dumps({"accuracy": {"status": "ok", "elapsed_s": 141.8}, "throughput": {"status": "ok", "elapsed_s": 7},
                       "kernels": {"status": "ok", "elapsed_s": "12 s"}, "probe": {"status": "ok"}})
    statuses = parse_status(text, "status.json")
    assert {stage: s.elapsed_s for stage, s in statuses.items()} == {"accuracy": 141.8, "throughput": 7.0,
                                                                     "kernels": None, "probe": None}
    older_kernels = parse_status(json.dumps({"kernels": {"status": "ok", "seconds": 30.8}}), "status.json")
    assert older_kernels["kernels"].elapsed_s == 30.8  # kvgate's kernels stage wrote `seconds` before 1.8
    assert parse_status(json.dumps({"accuracy": {"status": "ok", "seconds": 3}}), "s")["accuracy"].elapsed_s is None
    assert [stage_duration(v) for v in (True, -1, float("nan"), float("inf"), 10**9, 0, 2.5)] == \
        [None, None, None, None, None, 0.0, 2.5]
