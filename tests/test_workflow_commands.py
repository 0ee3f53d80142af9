"""The gate's GitHub Actions annotations: `::error title=<check>::<reason>` per failing check, printed only under
GitHub Actions (GITHUB_ACTIONS=true), escaped as GitHub's toolkit escapes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.cli import main
from kvgate.gate.verdict import Check, Verdict
from kvgate.report.workflow_commands import error_line, workflow_commands
from synthetic_run import write_seed_run

FP8_CELL = "flashinfer_mla-fp8-sm100"


@pytest.fixture
def failing_run(tmp_path: Path) -> Path:
    return write_seed_run(tmp_path / "run", fp8_drop_points=7.1)


def gate_stdout(run: Path, capsys) -> list[str]:
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    return capsys.readouterr().out.splitlines()


def test_failing_checks_are_annotated_under_github_actions(failing_run, capsys, monkeypatch):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    out = gate_stdout(failing_run, capsys)
    print("\n".join(out))
    annotations = [line for line in out if line.startswith("::")]
    # the one failing check (strict-match decides; flexible-extract is reported, not judged), with its reason
    assert annotations == [f"::error title={FP8_CELL} fp8_accuracy [strict-match]::drop 7.1 pts, lower bound 5.0 > "
                           "margin 3.0 (p<0.001)"]
    assert out[0].startswith("❌ kvgate")  # the headline stays the first line


def test_no_annotations_outside_github_actions(failing_run, capsys, monkeypatch):
    for value in (None, "false"):
        if value is None:
            monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
        else:
            monkeypatch.setenv("GITHUB_ACTIONS", value)
        assert not [line for line in gate_stdout(failing_run, capsys) if line.startswith("::")]


def test_a_reason_stays_one_annotation():
    assert error_line("a-fp8-sm90 accuracy [x, y]", "stage error: 50% done\nTraceback: boom") == (
        "::error title=a-fp8-sm90 accuracy [x%2C y]::stage error: 50%25 done%0ATraceback: boom")


@pytest.mark.parametrize(("title", "message", "line"), [
    # a value with a newline, a carriage return or `::` of its own cannot print a command of its own
    ("m\n::warning::forged", "x\r\n::error::forged2 :: %0A",
     "::error title=m%0A%3A%3Awarning%3A%3Aforged::x%0D%0A%3A%3Aerror%3A%3Aforged2 %3A%3A %250A"),
    ("a:b,c", "::stop-commands::token", "::error title=a%3Ab%2Cc::%3A%3Astop-commands%3A%3Atoken"),
])
def test_attack_workflow_command_data_is_escaped(title, message, line):
    assert error_line(title, message) == line
    assert line.count("\n") == 0 and line.count("::") == 2  # the command's own two separators, no other


def test_more_failures_than_github_shows_end_with_a_count():
    checks = tuple(Check(cell=f"c{n:02d}-fp8-sm90", kind="accuracy", status="error", detail=f"reason {n}")
                   for n in range(12))
    verdict = Verdict(checks=checks, run="r", baseline="b", today="2026-12-02", multiplicity={})
    lines = workflow_commands(verdict)
    assert len(lines) == 10
    assert lines[0] == "::error title=c00-fp8-sm90 accuracy::reason 0"
    assert lines[-1] == "::error title=kvgate::3 more failing checks: see the gate's report.md"


def test_a_neutral_verdict_is_one_warning(tmp_path, capsys, monkeypatch):
    """A passing run compared with nothing: no error, one warning that carries the gate's first line."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    run = write_seed_run(tmp_path / "run")
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("::")] == [f"::warning title=kvgate::{out[0]}"]
    assert out[0].startswith("⚪ kvgate: NEUTRAL")
