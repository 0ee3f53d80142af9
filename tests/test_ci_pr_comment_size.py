"""ci/pr_comment.py at the sizes a large matrix gives: the gate's own verdict.json of a run of a thousand compared
cells is read (the comment's heading comes from it), and one past the cap is refused by its size, not as broken JSON.
(Kept apart from test_ci_pr_comment.py, whose sanitising another branch works on.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci_scripts import load_ci_script
from kvgate.cli import main
from synthetic_run import write_ab_run

HEAD = "0123456789abcdef0123456789abcdef01234567"
pr_comment = load_ci_script("pr_comment")
AXES = [(backend, dtype, "sm90") for backend in ("FLASHINFER", "TRITON_ATTN") for dtype in ("auto", "fp8")]


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory) -> Path:
    """The gate's outputs of an A/B run of 4 cells, and the artifact's pull_request.json."""
    root = tmp_path_factory.mktemp("size")
    run = write_ab_run(root / "run", AXES, head_drop={"triton_attn-fp8-sm90": 40})
    assert main(["gate", str(run), "--out", str(root / "gate"), "--today", "2026-11-30"]) == 1
    (root / "gate" / "pull_request.json").write_text(json.dumps({"number": 17, "head_sha": HEAD}))
    return root / "gate"


def test_the_verdict_of_a_run_of_2000_compared_cells_is_within_what_the_comment_reads(gate_dir):
    """A run of 1,072 A/B cells (every backend, dtype and arch the matrix declares, with 18 features) wrote a
    16.0 MB verdict.json, at the 16 MiB the comment read: past it, every larger run got no comment at all (exit 2,
    "not JSON the verdict schema allows"). The gate writes about the same bytes a cell whatever the run's size."""
    per_cell = (gate_dir / "verdict.json").stat().st_size / len(AXES)
    assert 2000 * per_cell < pr_comment.VERDICT_READ_LIMIT


def test_a_verdict_past_the_cap_is_refused_by_its_size(gate_dir, tmp_path, monkeypatch, capsys):
    size = (gate_dir / "verdict.json").stat().st_size
    environ = {"GATE_DIR": str(gate_dir), "COMMENT_FILE": str(tmp_path / "comment.json"), "HEAD_SHA": HEAD,
               "RUN_CONCLUSION": "failure"}
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(pr_comment, "VERDICT_READ_LIMIT", size)
    assert pr_comment.main() == 0
    assert json.loads((tmp_path / "comment.json").read_text())["body"].count("kvgate gate failed") == 1
    monkeypatch.setattr(pr_comment, "VERDICT_READ_LIMIT", size - 1)
    assert pr_comment.main() == 2
    limit = (size - 1) >> 20
    assert capsys.readouterr().err.strip() == f"ERROR verdict.json: larger than {limit} MiB, the most kvgate reads"
