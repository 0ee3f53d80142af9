"""kvgate.runners.stages.output_files: a re-run's stage replaces the old folder whole; a failed one leaves it as it was."""

from __future__ import annotations

import os
import stat

import pytest

from kvgate.runners.stages.output_files import commit_stage, fresh_log


def test_rerun_replaces_the_stage_folder_whole(tmp_path):
    cell = tmp_path / "cell"
    cell.mkdir()
    first, second = tmp_path / "first", tmp_path / "second"
    (first / "model").mkdir(parents=True)
    (first / "model" / "results_1.json").write_text("{}")
    second.mkdir()
    (second / "repeat-1.json").write_text("{}")
    commit_stage(cell, "throughput", first)
    commit_stage(cell, "throughput", second)
    assert sorted(p.relative_to(cell).as_posix() for p in cell.rglob("*")) == ["throughput", "throughput/repeat-1.json"]
    assert stat.S_IMODE((cell / "throughput").stat().st_mode) == 0o755


def test_a_failure_while_committing_keeps_the_previous_folder(tmp_path, monkeypatch):
    cell = tmp_path / "cell"
    cell.mkdir()
    good = tmp_path / "good"
    good.mkdir()
    (good / "repeat-1.json").write_text("old")
    commit_stage(cell, "throughput", good)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "repeat-1.json").write_text("new")

    real_replace = os.replace

    def replace_failing_into_the_new_folder(src, dst, *args, **kwargs):
        if ".partial-" in str(dst):
            raise OSError("disk gone")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace_failing_into_the_new_folder)
    with pytest.raises(OSError):
        commit_stage(cell, "throughput", bad)
    assert (cell / "throughput" / "repeat-1.json").read_text() == "old"
    assert [p.name for p in cell.iterdir()] == ["throughput"]


def test_fresh_log_keeps_the_previous_runs_log(tmp_path):
    first = fresh_log(tmp_path, "accuracy")
    first.write_text("run 1\n")
    second = fresh_log(tmp_path, "accuracy")
    assert second == first and second.read_text() == ""
    assert (tmp_path / "logs" / "accuracy.previous.log").read_text() == "run 1\n"


def test_the_accuracy_headline_says_when_a_cell_stopped_at_a_look():
    from kvgate.runners.stages.accuracy import accuracy_headline

    figures = {"strict_match": 0.8138, "flexible_extract": 0.8138, "questions": 333}
    assert accuracy_headline(figures) == "gsm8k strict 0.814 flexible 0.814 (n=333)"
    plan = {"design": "kvgate-gs/1", "questions": 1331, "looks": [333, 666, 999, 1331], "answered": 333,
            "questions_saved": 998, "seconds_saved_estimate": 26.3}
    assert accuracy_headline(figures, plan) == ("gsm8k strict 0.814 flexible 0.814 (n=333 of 1331: decided at a "
                                                "look, 998 questions (~26 s) saved)")
