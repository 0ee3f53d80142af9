"""The fourth GPU canary round's real outputs (benchmarks/h200_canaries/features.sh start graphs train on the lent
H200, vLLM 0.26.0, 2026-12-03 13:09-13:27 UTC): FLASHMLA on kvgate's tiny DeepSeek-V2 with CUDA graphs, the base side
of the plain and spec_decode cells and three A/B runs against it (the CUDA-graph canary, the spec-verify canary, an
A/A run of the spec_decode cells), judged again by today's gate (tests/fixtures/h200_canaries/
features-round4-runs.tar.xz, trimmed by benchmarks/h200_canaries/trim_runs.py; the round's table and what it found:
benchmarks/h200_canaries/README.md). Each canary's verdict is held against its declaration in canaries/canaries.toml
(the spec-verify canary's, retired since: benchmarks/h200_canaries/retired/canaries.toml) by the code `kvgate
canaries` judges with (kvgate.cli.canaries_command.judge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import h200_matrix
from h200_matrix import failing, figures, judged_checks
from kvgate.cli.canaries_command import REPO_ROOT, judge, load_canaries

ARCHIVE = Path(__file__).parent / "fixtures" / "h200_canaries" / "features-round4-runs.tar.xz"
BASE = "h200g/base-FLASHMLA"
AA = "h200g/ab/FLASHMLA-aa1"
GRAPH = "h200g/ab/FLASHMLA-flashmla-cuda-graph-k-x09"
SPEC = "h200g/ab/FLASHMLA-flashmla-spec-verify-k-x09"
JUDGED = ("baseline_accuracy", "fp8_accuracy")  # the gsm8k comparisons (strict-match decides)


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, tuple[int, dict, Path]]:
    runs = ((BASE, []), *((run, ["--require-baseline"]) for run in (AA, GRAPH, SPEC)))
    return h200_matrix.gate_graph_runs(ARCHIVE, tmp_path_factory.mktemp("h200_features_round4"), runs)


def canary(name: str):
    """A shipped canary (canaries/), or a retired one (benchmarks/h200_canaries/retired/: the spec-verify canary)."""
    retired = REPO_ROOT / "benchmarks" / "h200_canaries" / "retired"
    return next(c for c in load_canaries(REPO_ROOT / "canaries") + load_canaries(retired) if c.name == name)


def test_the_base_side_answered_everything_after_three_refused_starts(judged):
    """Three trainers shared the GPU with the base side's four engine starts: vLLM refused three of them (two
    memory-profiling errors while a trainer's memory changed, one with no memory left for the KV cache), the accuracy
    stage started each again, and every cell answered the policy's 1,619 questions; FP8 passes against auto, plain
    and with speculative decoding."""
    code, verdict, root = judged[BASE]
    assert code == 0
    assert failing(verdict) == set()
    for cell in ("flashmla-fp8-sm90", "flashmla-fp8-sm90-spec_decode"):
        assert judged_checks(verdict)[(cell, "fp8_accuracy")] == "pass"
    accuracy = {cell.name: json.loads((cell / "status.json").read_text())["accuracy"]
                for cell in root.iterdir() if (cell / "status.json").is_file()}
    assert {cell: round(a["strict_match"], 3) for cell, a in accuracy.items()} == {
        "flashmla-auto-sm90": 0.802, "flashmla-fp8-sm90": 0.779, "flashmla-auto-sm90-spec_decode": 0.800,
        "flashmla-fp8-sm90-spec_decode": 0.788}
    assert {a["question_plan"]["answered"] for a in accuracy.values()} == {1619}
    retried = {cell: [r["reason"] for r in a.get("infra_retries", [])] for cell, a in accuracy.items()}
    assert {cell: len(reasons) for cell, reasons in retried.items()} == {
        "flashmla-auto-sm90": 0, "flashmla-fp8-sm90": 1, "flashmla-auto-sm90-spec_decode": 1,
        "flashmla-fp8-sm90-spec_decode": 1}
    assert "Initial free memory 17.51 GiB, current free memory 68.6 GiB" in retried["flashmla-fp8-sm90"][0]
    assert "Initial free memory 25.43 GiB, current free memory 36.2 GiB" in retried["flashmla-auto-sm90-spec_decode"][0]
    assert "No available memory for the cache blocks" in retried["flashmla-fp8-sm90-spec_decode"][0]
    assert all(a["elapsed_s"] > 500 for a in accuracy.values())  # 8.7-10.1 min, waiting for the GPU and the lock


def test_the_a_a_run_on_the_spec_decode_cells_passes(judged):
    """Release against release on the spec_decode cells, CUDA graphs captured: every check passes; the FP8 head is
    decided at the first look (405 of 1,619). Prompt divergence from auto is the same on both sides, decode
    divergence moves a little (x1.07: not bit-identical under graphs, as the plain A/A of 2026-12-03 found)."""
    code, verdict, _ = judged[AA]
    assert code == 0
    assert failing(verdict) == set()
    assert {key for key, status in judged_checks(verdict).items() if status == "pass"} == {
        ("flashmla-auto-sm90-spec_decode", "accuracy"), ("flashmla-auto-sm90-spec_decode", "baseline_accuracy"),
        ("flashmla-auto-sm90-spec_decode", "probe"), ("flashmla-fp8-sm90-spec_decode", "accuracy"),
        ("flashmla-fp8-sm90-spec_decode", "fp8_kv_cache"), ("flashmla-fp8-sm90-spec_decode", "fp8_accuracy"),
        ("flashmla-fp8-sm90-spec_decode", "baseline_accuracy"), ("flashmla-fp8-sm90-spec_decode", "probe"),
        ("flashmla-fp8-sm90-spec_decode", "probe_ab")}
    base = figures(verdict, "flashmla-fp8-sm90-spec_decode", "baseline_accuracy")
    assert (base["look"], base["n"]) == (1, 405)
    probe = figures(verdict, "flashmla-fp8-sm90-spec_decode", "probe_ab")
    assert probe["head_equals_base"] is False
    assert probe["mean_abs_logprob_diff_growth"] == pytest.approx(1.0, abs=1e-3)
    assert 1.0 < probe["decode_mean_abs_logprob_diff_growth"] < 1.5


def test_the_cuda_graph_canary_fails_the_fp8_cell_and_gets_its_declared_verdict(judged):
    """FLASHMLA's FP8 decode read with 0.9 x its scale while captured into a CUDA graph: the FP8 cell fails on
    accuracy at the second look (810 questions: 8.5 points below auto, lower bound 4.5 > 3; 6.3 below the base's FP8
    cell, lower bound 2.4 > 1) and on the head-vs-base probe (decode divergence x2.05); the auto cell passes. That is
    what canaries.toml declares, judged by the code `kvgate canaries` uses."""
    code, verdict, _ = judged[GRAPH]
    assert code == 1
    assert failing(verdict) == {("flashmla-fp8-sm90", "fp8_accuracy"), ("flashmla-fp8-sm90", "baseline_accuracy"),
                                ("flashmla-fp8-sm90", "probe_ab")}
    assert {status for (cell, _), status in judged_checks(verdict).items() if cell == "flashmla-auto-sm90"} == {"pass"}
    tax = figures(verdict, "flashmla-fp8-sm90", "fp8_accuracy")
    assert (tax["look"], tax["n"]) == (2, 810)
    assert tax["drop_points"] == pytest.approx(8.52, abs=0.01) and tax["lower_bound_points"] > 3.0
    base = figures(verdict, "flashmla-fp8-sm90", "baseline_accuracy")
    assert base["drop_points"] == pytest.approx(6.30, abs=0.01) and base["lower_bound_points"] > 1.0
    assert figures(verdict, "flashmla-fp8-sm90", "probe_ab")["decode_mean_abs_logprob_diff_growth"] > 1.5
    assert judge(canary("flashmla-cuda-graph-k-x09"), verdict, code) == (
        True, "failing: flashmla-fp8-sm90 baseline_accuracy, flashmla-fp8-sm90 fp8_accuracy, flashmla-fp8-sm90 probe_ab")


def test_the_spec_verify_canary_moves_prompts_not_answers_and_misses_its_declared_check(judged):
    """Its patch (FP8 descale x0.9 when FlashMLA's decode path gets several query tokens a sequence) fails the run on
    the head-vs-base probe of both FP8 cells, plain and spec_decode, through the prompt's divergence from auto (x2.5,
    x3.2; decode divergence x0.99, x1.05): short uniform prefills take that path too, so the patch is not
    speculative-decoding-only. Every gsm8k comparison passes (FP8 0.7827 -> 0.7827 plain, -> 0.7852 with spec decode,
    at the first look), so the check canaries.toml declares, the spec_decode FP8 cell's baseline accuracy, does not
    fail: `kvgate canaries`' judge says NO. Its successor, flashmla-spec-verify-only-k-x09, got its declared verdict in
    the sixth round (tests/test_h200_features_round6.py), and this one was retired."""
    code, verdict, _ = judged[SPEC]
    assert code == 1
    assert failing(verdict) == {("flashmla-fp8-sm90", "probe_ab"), ("flashmla-fp8-sm90-spec_decode", "probe_ab")}
    gsm8k = {key: status for key, status in judged_checks(verdict).items() if key[1] in JUDGED}
    assert len(gsm8k) == 6 and set(gsm8k.values()) == {"pass"}
    for cell, prompt in (("flashmla-fp8-sm90", 2.51), ("flashmla-fp8-sm90-spec_decode", 3.24)):
        probe = figures(verdict, cell, "probe_ab")
        assert probe["mean_abs_logprob_diff_growth"] == pytest.approx(prompt, abs=0.01)
        assert probe["decode_mean_abs_logprob_diff_growth"] < 1.1
        assert figures(verdict, cell, "baseline_accuracy")["look"] == 1
    assert judge(canary("flashmla-spec-verify-k-x09"), verdict, code) == (
        False, "flashmla-fp8-sm90-spec_decode baseline_accuracy did not fail")
