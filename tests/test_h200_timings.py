"""The H200's kernel timing repeatability (issue 12 item 3), from its three real speed-only runs.

benchmarks/h200_engine/timings/run{1,2,3}.json are the timings.json documents of three `pytest tests/kernels -k speed`
processes run one after the other on a quiet H200 (2026-12-01, vLLM 0.26.0, FlashInfer 0.6.14); spread.md beside
them is what `spread_report` printed there. The timing tolerance kvgate states is derived from them.
"""

from __future__ import annotations

from pathlib import Path

from kvgate.kernels import timings

RUNS = [Path(__file__).parents[1] / "benchmarks" / "h200_engine" / "timings" / f"run{i}.json" for i in (1, 2, 3)]


def test_the_three_h200_runs_time_the_same_entries() -> None:
    spreads, missing = timings.spread([timings.read(path) for path in RUNS])
    assert missing == []
    assert len(spreads) == 31
    families = {s.key[0] for s in spreads}
    assert families == {"flashinfer_decode", "vllm_flash_attn", "vllm_flash_attn_mla", "vllm_flashmla",
                        "vllm_flex_attn", "vllm_triton_attn", "vllm_triton_mla"}


def test_the_stated_tolerance_is_the_one_the_h200_runs_give() -> None:
    spreads, _ = timings.spread([timings.read(path) for path in RUNS])
    worst = max(spreads, key=lambda s: s.spread)
    assert worst.key == ("vllm_flash_attn_mla", "auto", "b128-h16-kv4096")
    assert 0.05 < worst.spread < 0.06
    assert sorted(s.spread for s in spreads)[-2] < 0.015  # every other entry repeats within 1.5 %
    assert timings.tolerance_from_spreads(spreads) == 0.17
    assert timings.tolerance_from_spreads(spreads) == timings.KERNEL_TIME_TOLERANCE


def test_the_report_written_on_the_h200_is_what_the_runs_give_now() -> None:
    report = timings.spread_report(RUNS)
    kept = (RUNS[0].parents[1] / "spread.md").read_text(encoding="utf-8")
    table = lambda text: [line for line in text.splitlines() if line.startswith("| ")]  # noqa: E731
    assert table(report) == table(kept)
    assert "= 17 %" in report
