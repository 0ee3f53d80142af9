"""The GPU canary table's real outputs (benchmarks/h200_canaries/run.sh on the lent H200, vLLM 0.26.0, 2026-12-01),
judged again by today's gate with the policy they were run under (tests/fixtures/h200_canaries/: the results
folders with the sample logs' prompt text trimmed, and that policy.toml). Every canary gets its verdict, every A/A
run passes with head ≡ base, the x0.5 break stops at its first look and the x0.9 break fails on baseline accuracy
and on the head-vs-base probe."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import archives
from gate_in_process import gate
from kvgate.cli.canaries_command import judge, load_canaries

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "h200_canaries"


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, tuple[int, dict]]:
    root = tmp_path_factory.mktemp("h200_canaries")
    archives.extract(FIXTURE / "runs.tar.xz", root)
    matrix = root / "matrix"  # run.sh setup: the repository's matrix with the tiny models' workloads
    matrix.mkdir()
    for toml in (REPO / "matrix").glob("*.toml"):
        shutil.copy(toml, matrix / toml.name)
    shutil.copy(REPO / "benchmarks" / "h200_engine" / "workloads.toml", matrix / "workloads.toml")
    shutil.copy(FIXTURE / "policy.toml", matrix / "policy.toml")
    out = {}
    for run in sorted((root / "ab").iterdir()):
        code, printed = gate(str(run), "--require-baseline", "--matrix-dir", str(matrix), "--policy",
                             str(matrix / "policy.toml"), "--today", "2026-12-01")
        assert code in (0, 1), printed
        out[run.name] = (code, json.loads((run / "gate" / "verdict.json").read_text()))
    return out


def check(verdict: dict, cell: str, kind: str) -> dict:
    return next(c for c in verdict["checks"] if c["cell"] == cell and c["kind"] == kind
                and c.get("subject") in (None, "strict-match"))


def test_every_gpu_canary_gets_its_verdict(judged):
    # the first round's canaries; the second round's (triton-mla-context-dequant-x2): tests/test_h200_paths.py
    canaries = {c.name: c for c in load_canaries(REPO / "canaries")
                if c.vllm == "0.26.0" and f"TRITON_MLA-{c.name}" in judged}
    assert sorted(canaries) == ["triton-mla-harmless", "triton-mla-kv-scale-x05", "triton-mla-kv-scale-x08",
                                "triton-mla-kv-scale-x09"]
    for name, canary in canaries.items():
        status, verdict = judged[f"TRITON_MLA-{name}"]
        assert judge(canary, verdict, status) == (True, judge(canary, verdict, status)[1]), name


def test_a_a_runs_pass_with_head_identical_to_base(judged):
    runs = [name for name in judged if "-aa" in name]
    assert len(runs) == 6
    for name in runs:
        status, verdict = judged[name]
        assert status == 0, name
        fp8 = "flash_attn-fp8-sm90" if name.startswith("FLASH_ATTN") else "triton_mla-fp8-sm90"
        assert check(verdict, fp8, "probe_ab")["figures"]["head_equals_base"] is True


def test_the_half_scale_break_stops_at_the_first_look_and_the_0_9_break_fails_on_two_counts(judged):
    _, half = judged["TRITON_MLA-triton-mla-kv-scale-x05"]
    figures = check(half, "triton_mla-fp8-sm90", "baseline_accuracy")["figures"]
    assert (figures["look"], figures["n"]) == (1, 373)
    status, tenth = judged["TRITON_MLA-triton-mla-kv-scale-x09"]
    assert status == 1
    baseline = check(tenth, "triton_mla-fp8-sm90", "baseline_accuracy")
    assert baseline["status"] == "fail" and baseline["figures"]["look"] == 2
    assert 4 < baseline["figures"]["drop_points"] < 7
    moved = check(tenth, "triton_mla-fp8-sm90", "probe_ab")
    assert moved["status"] == "fail" and moved["figures"]["decode_mean_abs_logprob_diff_growth"] > 2


def test_the_measured_rows_say_what_the_policy_sees(judged):
    """x0.95 (a 1.6-point drop) passes; FLASH_ATTN's k or v descale x0.9 costs ~1.3 points, within the margin, and
    fails the head-vs-base probe only."""
    assert judged["TRITON_MLA-triton-mla-kv-scale-x095"][0] == 0
    for name in ("FLASH_ATTN-flash-attn-k-scale-x09", "FLASH_ATTN-flash-attn-v-scale-x09"):
        status, verdict = judged[name]
        failing = {(c["cell"], c["kind"]) for c in verdict["checks"] if c["status"] in ("fail", "error", "missing")}
        assert (status, failing) == (1, {("flash_attn-fp8-sm90", "probe_ab")}), name
