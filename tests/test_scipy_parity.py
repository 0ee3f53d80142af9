"""benchmarks/scipy_parity.py --compare: what counts as the gate's outputs being unchanged (decisions and strings
identical, figures to 6 significant digits, log-space values as the gate reports them)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scipy_parity.py"


@pytest.fixture(scope="module")
def parity():
    spec = importlib.util.spec_from_file_location("scipy_parity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VERDICT = {"status": "fail", "checks": [
    {"cell": "flashinfer-fp8-sm90", "kind": "fp8_accuracy", "status": "fail",
     "figures": {"drop_points": 5.6107, "p_value": 0.0012345678, "lower_points": 3.28, "n": 1319}},
    {"cell": "flashinfer-auto-sm90", "kind": "throughput", "status": "pass", "figures": {"p_value": 2.2e-308}}]}
REPORT = "# kvgate: FAIL\n\n| flashinfer-fp8-sm90 | fp8_accuracy | fail | drop 5.61 pts, p=0.00123 |\n"
GRID = {"t_log_cdf": [[-50.0, 1e6, -1253.27], [-3.0, 5.0, -4.1964]], "noncentral_t_cdf": [[-3.0, 1.0, -4.0, 0.7940987]]}


def captured(folder: Path, verdict: dict = VERDICT, report: str = REPORT, grid: dict = GRID) -> Path:
    case = folder / "cases" / "generated" / "fp8-1319-1-6"
    case.mkdir(parents=True)
    (case / "verdict.json").write_text(json.dumps(verdict))
    (case / "report.md").write_text(report)
    (folder / "grid.json").write_text(json.dumps(grid))
    return folder


def edited(verdict: dict, figure: str, value) -> dict:
    copy = json.loads(json.dumps(verdict))
    copy["checks"][0]["figures"][figure] = value
    return copy


def test_the_same_outputs_are_equal(parity, tmp_path, capsys):
    before = captured(tmp_path / "before")
    after = Path(shutil.copytree(before, tmp_path / "after"))
    assert parity.compare(before, after) == 0
    assert capsys.readouterr().out == ("equal: 1 gated cases, 3 files, 20 numbers (0 log-space values differ only below "
                                       "log(TINY_P)); largest relative difference: none\n")


def test_figures_agreeing_to_6_significant_digits_are_equal_and_the_largest_difference_is_named(parity, tmp_path,
                                                                                                capsys):
    before = captured(tmp_path / "before")
    after = captured(tmp_path / "after", verdict=edited(VERDICT, "p_value", 0.0012345679),
                     report=REPORT.replace("5.61", "5.610000001"))
    assert parity.compare(before, after) == 0
    out = capsys.readouterr().out
    assert out.startswith("equal: 1 gated cases")
    assert "largest relative difference: gate 8.10e-08 (cases/generated/fp8-1319-1-6/verdict.json.checks[0]" in out


def test_a_figure_that_moved_in_its_fifth_digit_is_named(parity, tmp_path, capsys):
    before = captured(tmp_path / "before")
    after = captured(tmp_path / "after", verdict=edited(VERDICT, "lower_points", 3.2801))
    assert parity.compare(before, after) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("DIFFERENT cases/generated/fp8-1319-1-6/verdict.json.checks[0].figures.lower_points: 3.28 before, "
                     "3.2801 after (relative difference 3.05e-05)")


def test_a_changed_decision_or_wording_is_a_difference(parity, tmp_path, capsys):
    before = captured(tmp_path / "before")
    decision = json.loads(json.dumps(VERDICT))
    decision["checks"][0]["status"] = "pass"
    assert parity.compare(before, captured(tmp_path / "decision", verdict=decision)) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "DIFFERENT cases/generated/fp8-1319-1-6/verdict.json.checks[0].status: 'fail' before, 'pass' after")
    assert parity.compare(before, captured(tmp_path / "words", report=REPORT.replace("fail |", "pass |"))) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "DIFFERENT cases/generated/fp8-1319-1-6/report.md, line 3: the text differs (not only in its numbers)")


def test_log_space_values_are_compared_as_the_gate_reports_them(parity, tmp_path, capsys):
    """Below log(TINY_P) every p-value is reported as TINY_P: -inf and -1253.27 are the same figure there."""
    before = captured(tmp_path / "before")
    underflow = {**GRID, "t_log_cdf": [[-50.0, 1e6, -math.inf], GRID["t_log_cdf"][1]]}
    assert parity.compare(before, captured(tmp_path / "after", grid=underflow)) == 0
    assert "(1 log-space values differ only below log(TINY_P))" in capsys.readouterr().out
    moved = {**GRID, "noncentral_t_cdf": [[-3.0, 1.0, -4.0, 0.7940979]]}
    assert parity.compare(before, captured(tmp_path / "moved", grid=moved)) == 1
    assert capsys.readouterr().out.splitlines()[0].startswith("DIFFERENT grid.json:noncentral_t_cdf[0][3]: 0.7940987 before")
