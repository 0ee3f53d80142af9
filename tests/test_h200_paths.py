"""The second GPU canary round's real outputs (benchmarks/h200_canaries/paths.sh on the lent H200, vLLM 0.26.0,
2026-12-02), judged again by today's gate (tests/fixtures/h200_canaries/paths-runs.tar.xz: the results folders with
the sample logs' prompt text trimmed). Two roots: the matrix as it is (MLA's context path, which the probe's
cached-context prompts reach through the prefix cache) and the FP8 cells computing their k/v scales from the data
(calculate_kv_scales = true)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import archives
import h200_matrix
from gate_in_process import gate

REPO = Path(__file__).resolve().parents[1]
ARCHIVE = Path(__file__).parent / "fixtures" / "h200_canaries" / "paths-runs.tar.xz"
FP8 = "triton_mla-fp8-sm90"


def calculated_scales(workloads: str) -> str:
    """run.sh setup with KVGATE_CANARY_CALCULATE_KV_SCALES=1: the FP8 cells compute their k/v scales from the data."""
    for name in ("tiny-llama-any", "tiny-deepseek-v2-any"):
        workloads = workloads.replace(f"[workloads.{name}]\n", f"[workloads.{name}]\ncalculate_kv_scales = true\n")
    return workloads


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, tuple[int, dict, Path]]:
    root = tmp_path_factory.mktemp("h200_paths")
    archives.extract(ARCHIVE, root)
    out = {}
    for name in ("context", "calculated"):
        matrix = h200_matrix.matrix_folder(root / f"matrix-{name}",
                                           calculated_scales if name == "calculated" else lambda w: w)
        for run in sorted((root / name / "ab").iterdir()):
            code, printed = gate(str(run), "--require-baseline", "--matrix-dir", str(matrix), "--policy",
                                 str(matrix / "policy.toml"), "--today", "2026-12-02")
            assert code in (0, 1), printed
            out[f"{name}/{run.name}"] = (code, json.loads((run / "gate" / "verdict.json").read_text()), run)
    return out


def status(verdict: dict, kind: str) -> str:
    return next(c["status"] for c in verdict["checks"] if c["cell"] == FP8 and c["kind"] == kind
                and c.get("subject") in (None, "strict-match"))


@pytest.mark.parametrize("run", ["context/TRITON_MLA-aa1", "calculated/TRITON_MLA-aa1"])
def test_the_a_a_runs_pass_with_head_equal_to_base(judged, run):
    code, verdict, _ = judged[run]
    assert code == 0
    probe_ab = next(c for c in verdict["checks"] if c["kind"] == "probe_ab")
    assert probe_ab["status"] == "pass" and probe_ab["figures"]["head_equals_base"] is True


def test_the_context_dequantization_break_fails_on_accuracy(judged):
    """gsm8k reached MLA's context path; the head-vs-base probe, cached-context prompts included, did not fail it."""
    from kvgate.cli.canaries_command import judge, load_canaries

    code, verdict, run = judged["context/TRITON_MLA-triton-mla-context-dequant-x2"]
    canary = next(c for c in load_canaries(REPO / "canaries") if c.name == "triton-mla-context-dequant-x2")
    assert judge(canary, verdict, code)[0] is True
    assert code == 1
    assert status(verdict, "baseline_accuracy") == status(verdict, "fp8_accuracy") == "fail"
    assert status(verdict, "probe_ab") == "pass"
    probe = json.loads((run / FP8 / "probe" / "probe.json").read_text())
    assert [p["cached_tokens"] for p in probe["cached_context"]] == [0, 736, 736, 736, 736, 736]


def test_a_calculated_scale_break_fails_everything_at_the_first_look(judged):
    code, verdict, run = judged["calculated/TRITON_MLA-triton-mla-calculated-scale-div8"]
    assert code == 1
    assert {kind: status(verdict, kind) for kind in ("baseline_accuracy", "fp8_accuracy", "probe", "probe_ab")} == {
        "baseline_accuracy": "fail", "fp8_accuracy": "fail", "probe": "fail", "probe_ab": "fail"}
    plan = json.loads((run / FP8 / "status.json").read_text())["accuracy"]["question_plan"]
    assert (plan["answered"], plan["questions"]) == (405, 1619)


def test_the_calculated_scales_are_the_evidence_that_the_path_ran(judged):
    """With calculate_kv_scales the FP8 layers held scales computed from the data; without it, 1.0."""
    _, _, calculated = judged["calculated/TRITON_MLA-aa1"]
    _, _, plain = judged["context/TRITON_MLA-aa1"]
    for run, computed in ((calculated, True), (plain, False)):
        cell = json.loads((run / FP8 / "cell.json").read_text())
        evidence = json.loads((run / FP8 / "status.json").read_text())["accuracy"]["kv_cache"]
        assert cell["calculate_kv_scales"] is computed
        assert (evidence["k_scales"] != [1.0]) is computed and (evidence["v_scales"] != [1.0]) is computed
