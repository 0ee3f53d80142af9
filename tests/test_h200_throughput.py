"""The throughput gate on the H200's real runs at the seed's shape (tests/fixtures/h200_throughput/, made by
benchmarks/h200_throughput/run.sh through `kvgate run throughput`), judged by today's gate under the repository's
policy: the -10 % and -20 % FP8 decode canaries fail head vs base, the -10 % one loses FP8's declared speedup over
auto, a -4.8 % one passes inside the 5 % tolerance; the A/A runs' throughput checks pass (MLA and non-MLA), and the
non-MLA FP8 cell keeps its declared speedup over auto."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import archives
from gate_in_process import gate

FIXTURE = Path(__file__).parent / "fixtures" / "h200_throughput"


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, tuple[int, dict[tuple[str, str], dict]]]:
    root = tmp_path_factory.mktemp("h200_throughput")
    archives.extract(FIXTURE / "runs.tar.xz", root)
    out = {}
    for run in sorted((root / "runs").iterdir()):
        code, printed = gate(str(run), "--require-baseline")
        assert code in (0, 1), printed
        verdict = json.loads((run / "gate" / "verdict.json").read_text())
        out[run.name] = (code, {(c["cell"], c["kind"]): c for c in verdict["checks"]})
    return out


def test_the_ten_percent_canary_fails_head_vs_base_and_fp8_over_auto(judged):
    code, checks = judged["slower-10"]
    fp8 = checks[("flashmla-fp8-sm90", "throughput")]
    print(fp8["detail"], fp8["notes"])
    assert code == 1
    assert fp8["status"] == "fail"
    assert fp8["figures"]["ratio"] == pytest.approx(0.903, abs=0.002)
    assert fp8["figures"]["power_at_10_percent"] > 0.9
    ratio = checks[("flashmla-fp8-sm90", "fp8_throughput")]
    assert ratio["status"] == "fail" and ratio["threshold"]["min_ratio"] == 1.10
    assert checks[("flashmla-auto-sm90", "throughput")]["status"] == "pass"  # the canary leaves auto alone


def test_the_aa_run_passes_head_vs_base(judged):
    code, checks = judged["aa-fp8"]
    fp8 = checks[("flashmla-fp8-sm90", "throughput")]
    assert fp8["status"] == "pass"
    assert fp8["figures"]["estimate"] == pytest.approx(1.0, abs=0.002)
    # the declared FP8/auto expectation needs the auto cell, which this run did not hold: fail closed
    assert checks[("flashmla-fp8-sm90", "fp8_throughput")]["status"] == "missing"
    assert code == 1


def test_the_canary_ladder_falls_where_the_tolerance_says(judged):
    """A slowdown past the 5 % tolerance fails; one of about the tolerance's size passes (it fails 5 % of the time at
    exactly 5 %, the policy's alpha); each run holds the fp8 cell alone, so FP8's declared speedup fails closed."""
    for run, status, ratio in (("slower-5-fp8", "pass", 0.952), ("slower-20-fp8", "fail", 0.807)):
        code, checks = judged[run]
        fp8 = checks[("flashmla-fp8-sm90", "throughput")]
        assert (fp8["status"], code) == (status, 1), run
        assert fp8["figures"]["estimate"] == pytest.approx(ratio, abs=0.002)
        assert checks[("flashmla-fp8-sm90", "fp8_throughput")]["status"] == "missing"
    assert judged["slower-5-fp8"][1][("flashmla-fp8-sm90", "throughput")]["interval"][1] > 0.95


def test_the_non_mla_cells_pass_their_aa_and_keep_fp8s_speedup(judged):
    _, checks = judged["llama-fp8-aa"]
    fp8 = checks[("flash_attn-fp8-sm90", "throughput")]
    assert fp8["status"] == "pass" and fp8["figures"]["estimate"] == pytest.approx(1.0, abs=0.002)
    _, checks = judged["llama"]  # one side: the release's FP8 and auto cells on one machine
    ratio = checks[("flash_attn-fp8-sm90", "fp8_throughput")]
    assert ratio["status"] == "pass" and ratio["threshold"]["min_ratio"] == 1.10, ratio["detail"]
    assert ratio["figures"]["estimate"] == pytest.approx(1.148, abs=0.002)


def test_every_engine_recorded_its_repeats_and_the_machine_under_them(judged, tmp_path):
    archives.extract(FIXTURE / "runs.tar.xz", tmp_path)
    for status in tmp_path.glob("runs/*/*/status.json"):
        entry = json.loads(status.read_text())["throughput"]
        assert entry["design"] == {"engines": 1, "repeats_per_engine": 3, "warmup_output_len": 32}
        (engine,) = entry["engines"]
        assert engine["repeats"] == [1, 2, 3]
        for repeat in engine["machine"]:
            (attempt,) = repeat["attempts"]  # no repeat was measured again: nothing disturbed the GPU
            assert attempt["other_processes"] == [] and "disturbed" not in attempt
            assert attempt["sm_clock_mhz"]["max"] <= 1980
