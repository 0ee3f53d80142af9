"""kvgate.runners.progress: the per-stage lines and the summary table."""

from __future__ import annotations

from kvgate.runners.outcome import StageOutcome
from kvgate.runners.progress import end_line, format_seconds, start_line, summary_table

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
