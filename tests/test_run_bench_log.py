"""kvgate.runners.engine.bench_output: the figures `vllm bench throughput` prints (output tokens/s is not in its JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.runners.engine.bench_output import BenchFigures, read_bench_figures

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"


def test_real_repeat_log_agrees_with_its_json():
    figures = read_bench_figures((FIXTURES / "bench-throughput-repeat.log").read_text(encoding="utf-8"))
    data = json.loads((FIXTURES / "bench-throughput-repeat.json").read_text(encoding="utf-8"))
    assert figures is not None
    assert figures.requests_per_second == pytest.approx(data["requests_per_second"], abs=0.01)
    assert figures.total_tokens_per_second == pytest.approx(data["tokens_per_second"], abs=0.01)
    assert figures.prompt_tokens + figures.output_tokens == data["total_num_tokens"]
    assert figures.output_tokens_per_second == pytest.approx(
        figures.output_tokens / data["elapsed_time"], rel=1e-3)


def test_the_last_throughput_line_counts():
    text = ("Throughput: 1.00 requests/s, 10.00 total tokens/s, 2.00 output tokens/s\n"
            "Throughput: 3.22 requests/s, 29668.09 total tokens/s, 3296.62 output tokens/s\n"
            "Total num prompt tokens:  819200\nTotal num output tokens:  102400\n")
    assert read_bench_figures(text) == BenchFigures(requests_per_second=3.22, total_tokens_per_second=29668.09,
                                                    output_tokens_per_second=3296.62, prompt_tokens=819200,
                                                    output_tokens=102400)


def test_no_throughput_line_is_none():
    assert read_bench_figures("INFO engine started\nTraceback (most recent call last):\n") is None
