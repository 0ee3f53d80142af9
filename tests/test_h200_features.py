"""The third GPU canary round's real outputs (benchmarks/h200_canaries/features.sh on the lent H200, vLLM 0.26.0,
2026-12-03): FLASHMLA on kvgate's tiny DeepSeek-V2 with CUDA graphs (enforce_eager = false, as matrix/workloads.toml
runs every GPU cell), plain and spec_decode cells (ngram speculative decoding, matrix/axes.toml), judged again by
today's gate (tests/fixtures/h200_canaries/features-runs.tar.xz, trimmed by benchmarks/h200_canaries/trim_runs.py).
The round's canaries did not finish in the session's device time (benchmarks/h200_canaries/README.md says why);
the fourth round's verdicts on them: tests/test_h200_features_round4.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import h200_matrix

ARCHIVE = Path(__file__).parent / "fixtures" / "h200_canaries" / "features-runs.tar.xz"


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, tuple[int, dict, Path]]:
    runs = (("graphs/FLASHMLA-aa2", ["--require-baseline"]), ("graphs/base-FLASHMLA", []),
            ("graphs-first-machine/base-FLASHMLA", []))
    return h200_matrix.gate_graph_runs(ARCHIVE, tmp_path_factory.mktemp("h200_features"), runs)


def checks(verdict: dict, cell: str) -> dict[str, str]:
    return {c["kind"]: c["status"] for c in verdict["checks"] if c["cell"] == cell
            and c.get("subject") in (None, "strict-match")}


def test_the_a_a_run_with_cuda_graphs_passes(judged):
    """Release against release, CUDA graphs captured: every check passes. Unlike the eager A/A runs (head ≡ base),
    the two engines' prompt logprobs differ a little (FP8 vs auto 0.0083 on the base, 0.0094 on the head: x1.14,
    inside probe_ab's x1.5), while decode divergence and every greedy token are the same."""
    code, verdict, _ = judged["graphs/FLASHMLA-aa2"]
    assert code == 0
    fp8 = checks(verdict, "flashmla-fp8-sm90")
    assert {k: fp8[k] for k in ("baseline_accuracy", "fp8_accuracy", "fp8_kv_cache", "probe", "probe_ab")} == dict.fromkeys(
        ("baseline_accuracy", "fp8_accuracy", "fp8_kv_cache", "probe", "probe_ab"), "pass")
    figures = next(c for c in verdict["checks"] if c["kind"] == "probe_ab")["figures"]
    assert figures["head_equals_base"] is False
    assert figures["fp8_head_vs_base_greedy_prefix_match"] == 1.0
    assert figures["decode_mean_abs_logprob_diff_growth"] == pytest.approx(1.0, abs=1e-3)
    assert 1.0 < figures["mean_abs_logprob_diff_growth"] < 1.5


@pytest.mark.parametrize("run", ["graphs/base-FLASHMLA", "graphs-first-machine/base-FLASHMLA"])
def test_spec_decode_cells_are_read_and_judged_like_plain_ones(judged, run):
    """Contract 1.11: run.json names the feature's cells by their ids (flashmla-fp8-sm90-spec_decode), which 1.10's
    reader refused (the gate exited 2 on these very folders). Each spec_decode cell that ran answered the policy's
    1,619 questions with ngram speculative decoding on."""
    _, verdict, root = judged[run]
    for dtype in ("auto", "fp8"):
        cell = f"flashmla-{dtype}-sm90-spec_decode"
        record = json.loads((root / cell / "cell.json").read_text())
        assert record["feature"] == "spec_decode"
        assert record["feature_engine_args"]["speculative_config"]["method"] == "ngram"
        assert checks(verdict, cell)["accuracy"] in ("pass", "error")


def test_fp8_with_speculative_decoding_passes_against_its_auto_cell(judged):
    """The first machine's spec_decode cells: FP8 0.786 against auto 0.800 on 1,619 questions, inside the FP8 tax."""
    _, verdict, root = judged["graphs-first-machine/base-FLASHMLA"]
    fp8 = checks(verdict, "flashmla-fp8-sm90-spec_decode")
    assert {k: fp8[k] for k in ("accuracy", "fp8_accuracy", "fp8_kv_cache", "probe")} == dict.fromkeys(
        ("accuracy", "fp8_accuracy", "fp8_kv_cache", "probe"), "pass")
    plan = json.loads((root / "flashmla-fp8-sm90-spec_decode" / "status.json").read_text())["accuracy"]["question_plan"]
    assert (plan["answered"], plan["questions"]) == (1619, 1619)


@pytest.mark.parametrize("run, cell", [("graphs-first-machine/base-FLASHMLA", "flashmla-fp8-sm90"),
                                       ("graphs/base-FLASHMLA", "flashmla-fp8-sm90-spec_decode")])
def test_an_engine_that_could_not_start_fails_the_run(judged, run, cell):
    """vLLM refused two starts of these cells (another engine freed its memory while they profiled theirs): an
    infrastructure error, which fails the run and never passes a cell."""
    code, verdict, _ = judged[run]
    assert code == 1
    assert checks(verdict, cell)["accuracy"] == "error"
    detail = next(c["detail"] for c in verdict["checks"] if c["cell"] == cell and c["kind"] == "accuracy")
    assert "infrastructure" in detail and "memory profiling" in detail
