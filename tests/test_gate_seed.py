"""The seed PR's case end to end through `kvgate gate`: folder in, verdict + reports + exit status out."""

from __future__ import annotations

import json

import pytest
from junitparser import JUnitXml

from kvgate.cli import main
from synthetic_run import planned_questions, write_accuracy, write_cell, write_seed_run

FP8 = "flashinfer_mla-fp8-sm100"


def test_seed_case_passes_but_reads_neutral_without_a_baseline(tmp_path, capsys):
    run = write_seed_run(tmp_path / "run")
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    # the accuracy and throughput stages ran with nothing to judge them (no baseline): counted apart, never as passes
    # (said by the report's totals line: the first line keeps to a commit status's 140 characters)
    assert first == "⚪ kvgate: NEUTRAL — 4 checks passed, but the change was compared with nothing (no base side, no --baseline)"
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    strict = next(c for c in verdict["checks"] if c["kind"] == "fp8_accuracy" and c["subject"] == "strict-match")
    print(json.dumps(strict, indent=1))
    assert strict["status"] == "pass"
    assert (strict["figures"]["reference"], strict["figures"]["candidate"]) == (0.644428, 0.626232)
    assert strict["threshold"] == {"margin_points": 3.0, "alpha": 0.01}
    # the test is against the 3-point margin, not against 0: a 1.82-point tax is far from evidence beyond it
    assert strict["interval"][0] < strict["figures"]["drop_points"] < strict["interval"][1]
    assert strict["interval"][0] < 3.0 and strict["p_value"] > 0.5
    flexible = next(c for c in verdict["checks"] if c["kind"] == "fp8_accuracy" and c["subject"] == "flexible-extract")
    assert flexible["status"] == "info"  # one decision per cell: strict-match (policy.toml says why)
    floor = next(c for c in verdict["checks"] if c["kind"] == "accuracy_floor")
    assert (floor["cell"], floor["status"], floor["threshold"]["floor"]) == ("flashinfer_mla-auto-sm100", "pass",
                                                                            round(0.671 * 0.92, 6))
    ratio = next(c for c in verdict["checks"] if c["kind"] == "fp8_throughput")
    assert ratio["status"] == "info" and ratio["figures"]["ratio"] == round(3.55 / 3.22, 6)
    report = (run / "gate" / "report.md").read_text()
    assert report.splitlines()[0] == first
    assert "0.6444 -> 0.6262, drop 1.82 pts" in report


def test_seed_case_with_a_seven_point_drop_fails_and_names_the_cell(tmp_path, capsys):
    run = write_seed_run(tmp_path / "run", fp8_drop_points=7.1)
    out = tmp_path / "out"
    assert main(["gate", str(run), "--out", str(out), "--today", "2026-11-30"]) == 1
    first = (out / "report.md").read_text().splitlines()[0]
    assert first == (f"❌ kvgate: 1 of 4 checks failed — {FP8} fp8_accuracy [strict-match] drop 7.1 pts, lower "
                     "bound 5.0 > margin 3.0 (p<0.001)")
    assert capsys.readouterr().out.splitlines()[0] == first
    assert not (run / "gate").exists()  # --out elsewhere leaves the run folder alone
    junit = JUnitXml.fromfile(str(out / "junit.xml"))
    failures = [(case.classname, case.name, case.result[0].message) for suite in junit for case in suite
                if case.result and case.result[0]._tag == "failure"]
    assert [f[:2] for f in failures] == [("kvgate.fp8_accuracy", f"{FP8}[strict-match]")]
    assert failures[0][2].startswith("FAIL: drop 7.1 pts, lower bound 5.0 > margin 3.0; 0.6444 -> 0.5732, p<0.001")
    strict = next(c for c in json.loads((out / "verdict.json").read_text())["checks"]
                  if c["kind"] == "fp8_accuracy" and c["subject"] == "strict-match")
    assert strict["p_value"] == 3.24264e-06  # 6 significant digits, never rounded to 0


def test_the_report_goes_to_the_github_step_summary_too(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    run = write_seed_run(tmp_path / "run")
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    assert summary.read_text() == "earlier step\n" + (run / "gate" / "report.md").read_text()


def test_requiring_every_stage_fails_a_run_without_probes(tmp_path, capsys):
    run = write_seed_run(tmp_path / "run")
    assert main(["gate", str(run), "--require", "all", "--today", "2026-11-30"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "❌ kvgate: 2 of 6 checks failed — flashinfer_mla-auto-sm100 probe stage never ran, but the gate "
        "requires it (--require) (+1 more)")


def test_seed_case_against_a_baseline_is_a_plain_pass(tmp_path, capsys):
    """With the questions the policy plans for the matrix's cell (DeepSeek-V2-Lite on gsm8k's test and train splits)."""
    n = planned_questions("FLASHINFER_MLA", "fp8", "sm100")
    run = write_seed_run(tmp_path / "run", contract="1.6", n=n)
    base = write_seed_run(tmp_path / "base", contract="1.6", n=n)
    assert main(["gate", str(run), "--baseline", str(base), "--require-baseline", "--today", "2026-11-30"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("✅ kvgate: all ")


def test_without_a_baseline_ci_fails_the_run(tmp_path, capsys):
    run = write_seed_run(tmp_path / "run", contract="1.6", n=planned_questions("FLASHINFER_MLA", "fp8", "sm100"))
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "❌ kvgate: 1 of 6 checks failed — (run) baseline no baseline: the change was compared with nothing")


def test_results_of_an_older_contract_cannot_pass_a_gate_that_requires_a_baseline(tmp_path, capsys):
    """Relabelling a folder as an older contract (before planned stages and question plans were recorded) does not
    buy a green check: under --require-baseline it fails, named; without it, a note."""
    n = planned_questions("FLASHINFER_MLA", "fp8", "sm100")
    run = write_seed_run(tmp_path / "run", contract="1.5", n=n)
    base = write_seed_run(tmp_path / "base", contract="1.6", n=n)
    assert main(["gate", str(run), "--baseline", str(base), "--require-baseline", "--today", "2026-11-30"]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("❌ kvgate: 1 of ") and "(run) contract results older than contract 1.6" in first
    assert main(["gate", str(run), "--baseline", str(base), "--today", "2026-11-30"]) == 0


@pytest.mark.parametrize(("n", "status"), [(1, "error"), (4, "error"), (5, "fail"), (200, "fail")])
def test_an_accuracy_floor_too_few_questions_can_test_is_never_a_pass(tmp_path, n, status):
    """The auto cell answered none of n questions right, against a floor of 0.617: at n = 1 the floor test's p is
    0.38, so 0 of 1 read PASS (as 0 of 4 did: a test that cannot fail at alpha 0.01 below 5 questions). Too few
    questions to test the floor are its error, naming how many it takes; from 5 questions none right fails."""
    run = tmp_path / "run"
    for dtype in ("auto", "fp8"):
        cell = write_cell(run, backend="FLASHINFER_MLA", kv_cache_dtype=dtype, arch="sm100")
        write_accuracy(cell, {"strict-match": [False] * n, "flexible-extract": [False] * n})
    assert main(["gate", str(run), "--out", str(tmp_path / "out"), "--today", "2026-11-30"]) == 1
    floor = next(c for c in json.loads((tmp_path / "out" / "verdict.json").read_text())["checks"]
                 if c["kind"] == "accuracy_floor")
    assert floor["status"] == status
    if status == "error":
        assert floor["detail"] == (f"only {n} question(s): the floor 0.6173 cannot be tested, even none right would "
                                   "pass at alpha 0.01 (it takes at least 5)")


def test_a_repeated_require_adds_its_stages_never_drops_the_earlier_ones(tmp_path, capsys):
    """`--require probe --require accuracy` requires both: argparse's last-one-wins dropped the probe, and a run
    without probes passed a gate that was asked to fail it."""
    run = write_seed_run(tmp_path / "run")
    assert main(["gate", str(run), "--require", "probe", "--require", "accuracy", "--today", "2026-11-30"]) == 1
    assert "probe stage never ran, but the gate requires it (--require)" in capsys.readouterr().out
