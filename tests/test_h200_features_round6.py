"""The sixth GPU canary round's real outputs (benchmarks/h200_canaries/features.sh start graphs on the lent H200,
vLLM 0.26.0, 2026-12-03 18:16-18:30 UTC; kvgate at 7f58029 with features.sh's A/A head), judged again by today's gate
(tests/fixtures/h200_canaries/features-round6-runs.tar.xz, trimmed by benchmarks/h200_canaries/trim_runs.py; the
round's table and what it found: benchmarks/h200_canaries/README.md, "Sixth round").

One root: FLASHMLA on kvgate's tiny DeepSeek-V2 with CUDA graphs, plain and spec_decode cells (ngram, 3 tokens), a
fresh base side; heads: the fixed verify-only spec canary (flashmla-spec-verify-only-k-x09) on the four cells it
declares, and an A/A run of the same four cells. The canary's verdict is held against its declaration in
canaries/canaries.toml by the code `kvgate canaries` judges with (kvgate.cli.canaries_command.judge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import h200_matrix
from h200_matrix import failing, figures, judged_checks
from kvgate.cli.canaries_command import REPO_ROOT, judge, load_canaries

ARCHIVE = Path(__file__).parent / "fixtures" / "h200_canaries" / "features-round6-runs.tar.xz"
BASE, AA, SPEC = "h200g/base-FLASHMLA", "h200g/ab/FLASHMLA-aa1", "h200g/ab/FLASHMLA-flashmla-spec-verify-only-k-x09"
CELLS = ("flashmla-auto-sm90", "flashmla-fp8-sm90", "flashmla-auto-sm90-spec_decode", "flashmla-fp8-sm90-spec_decode")


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, tuple[int, dict, Path]]:
    return h200_matrix.gate_graph_runs(ARCHIVE, tmp_path_factory.mktemp("h200_features_round6"),
                                       [(BASE, []), (AA, ["--require-baseline"]), (SPEC, ["--require-baseline"])])


def strict(root: Path) -> dict[str, tuple[float, int]]:
    out = {}
    for cell in root.iterdir():
        if (cell / "status.json").is_file():
            accuracy = json.loads((cell / "status.json").read_text())["accuracy"]
            out[cell.name] = (round(accuracy["strict_match"], 4), accuracy["question_plan"]["answered"])
    return out


def test_the_fresh_base_side_answers_every_question_on_the_four_cells(judged):
    """The release with CUDA graphs, each cell in a process of its own (--powered: 1,619 questions): the figures of
    round 5's base side again (auto 0.801 and 0.800, FP8 0.779 and 0.788), and FP8 passes against auto on both."""
    code, verdict, root = judged[BASE]
    assert code == 0 and failing(verdict) == set()
    assert strict(root) == {"flashmla-auto-sm90": (0.8011, 1619), "flashmla-fp8-sm90": (0.7795, 1619),
                            "flashmla-auto-sm90-spec_decode": (0.8005, 1619),
                            "flashmla-fp8-sm90-spec_decode": (0.7875, 1619)}
    assert {key for key, status in judged_checks(verdict).items() if status == "pass"} >= {
        ("flashmla-fp8-sm90", "fp8_accuracy"), ("flashmla-fp8-sm90-spec_decode", "fp8_accuracy")}


def test_the_a_a_run_passes_every_check_on_the_device_and_here(judged):
    """Release against release on the four cells: every check passes (the device's gate said so too, with today's
    probe_ab rule). Under CUDA graphs the heads are not identical to the base (the auto cell answered one question of
    1,619 differently), and the probe's decode divergence did not grow (x1.00)."""
    code, verdict, root = judged[AA]
    assert code == 0 and failing(verdict) == set()
    assert {cell for cell, kind in judged_checks(verdict) if kind == "baseline_accuracy"} == set(CELLS)
    for cell in ("flashmla-fp8-sm90", "flashmla-fp8-sm90-spec_decode"):
        probe = figures(verdict, cell, "probe_ab")
        assert probe["cached_vs_fresh_prefix_drop"] == 0.0
        assert probe["decode_mean_abs_logprob_diff_growth"] == pytest.approx(1.0, abs=0.005)
    assert figures(verdict, "flashmla-fp8-sm90-spec_decode", "baseline_accuracy")["drop_points"] == pytest.approx(
        -0.25, abs=0.01)
    assert strict(root)["flashmla-auto-sm90"] == (0.8017, 1619)


def test_the_fixed_verify_only_canary_fails_the_spec_cell_and_leaves_the_plain_fp8_cell_alone(judged):
    """The spec_decode FP8 cell falls from 0.7827 to 0.5605 at the first look (405 questions), 22.2 points against the
    base (lower bound 10.7) and 23.5 below auto, and its probe fails. The plain FP8 cell, which crashed in round 5,
    now runs and passes every check: 0.25 points against the base (one answer of 405, as the A/A run's auto cell
    moved one), and its probe figures equal the A/A run's. Both auto cells pass. That is what canaries.toml declares,
    and `kvgate canaries`' judge says so."""
    code, verdict, root = judged[SPEC]
    assert code == 1
    assert failing(verdict) == {("flashmla-fp8-sm90-spec_decode", "baseline_accuracy"),
                                ("flashmla-fp8-sm90-spec_decode", "fp8_accuracy"),
                                ("flashmla-fp8-sm90-spec_decode", "probe_ab")}
    broken = figures(verdict, "flashmla-fp8-sm90-spec_decode", "baseline_accuracy")
    assert (broken["look"], broken["n"]) == (1, 405)
    assert broken["drop_points"] == pytest.approx(22.22, abs=0.01) and broken["lower_bound_points"] > 10
    assert figures(verdict, "flashmla-fp8-sm90-spec_decode", "fp8_accuracy")["drop_points"] == pytest.approx(
        23.46, abs=0.01)
    plain = {kind: status for (cell, kind), status in judged_checks(verdict).items() if cell == "flashmla-fp8-sm90"}
    assert plain and set(plain.values()) == {"pass"} and {"baseline_accuracy", "fp8_accuracy", "probe_ab"} <= set(plain)
    assert figures(verdict, "flashmla-fp8-sm90", "baseline_accuracy")["drop_points"] == pytest.approx(0.25, abs=0.01)
    aa_probe = figures(judged[AA][1], "flashmla-fp8-sm90", "probe_ab")
    assert figures(verdict, "flashmla-fp8-sm90", "probe_ab") == aa_probe
    assert strict(root)["flashmla-fp8-sm90"] == (0.7802, 405)
    for cell in ("flashmla-auto-sm90", "flashmla-auto-sm90-spec_decode"):
        assert judged_checks(verdict)[(cell, "baseline_accuracy")] == "pass"
    canary = next(c for c in load_canaries(REPO_ROOT / "canaries") if c.name == "flashmla-spec-verify-only-k-x09")
    assert judge(canary, verdict, code) == (True, "failing: flashmla-fp8-sm90-spec_decode baseline_accuracy, "
                                                  "flashmla-fp8-sm90-spec_decode fp8_accuracy, "
                                                  "flashmla-fp8-sm90-spec_decode probe_ab")
