"""The head-vs-base probe of an A/B run: did the change move the FP8 cell away from its auto cell, compared with the
base side doing the same on the same prompts? Folders written in the contract's format (tests/synthetic_run.py),
judged through `kvgate gate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.cli import main
from kvgate.gate import policy as policy_module
from synthetic_run import paired_outcomes, write_accuracy, write_cell, write_probe, write_status

FILTERS = ("strict-match", "flexible-extract")
FP8 = "triton_mla-fp8-sm89"  # the matrix runs kvgate's tiny DeepSeek-V2 there (1619 questions planned)


def ab_run(tmp_path: Path, *, head_fp8: dict, base_fp8: dict | None = None) -> Path:
    """TRITON_MLA auto and fp8 on both sides, identical answers; the FP8 probes as given (write_probe's arguments)."""
    run = tmp_path / "run"
    ref = paired_outcomes(1619, reference_correct=1200, only_reference=0, only_candidate=0, seed=1)[0]
    probes = {("auto", "base"): {}, ("auto", "head"): {}, ("fp8", "base"): base_fp8 or {"decode_shift": 0.01},
              ("fp8", "head"): head_fp8}
    for (dtype, side), probe in probes.items():
        folder = f"triton_mla-{dtype}-sm89" + ("--base" if side == "base" else "")
        cell = write_cell(run, backend="TRITON_MLA", kv_cache_dtype=dtype, arch="sm89", folder=folder,
                          extra={"contract_version": "1.6", "side": side})
        write_accuracy(cell, {name: ref for name in FILTERS})
        evidence = {"element_bytes": [1 if dtype == "fp8" else 2], "layer_kv_cache_dtypes": [dtype],
                    "tokens": 200_000 if dtype == "fp8" else 100_000}
        write_status(cell, {"accuracy": {"status": "ok", "kv_cache": evidence}, "probe": {"status": "ok"}})
        write_probe(cell, generated=16, **{"shift": 0.0, **probe})
    return run


def probe_ab(run: Path) -> dict:
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    return next(c for c in verdict["checks"] if c["kind"] == "probe_ab")


def test_head_identical_to_base_is_said_and_passes(tmp_path):
    run = ab_run(tmp_path, head_fp8={"decode_shift": 0.01})
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 0
    check = probe_ab(run)
    assert check["status"] == "pass" and check["figures"]["head_equals_base"] is True
    assert check["detail"].startswith("head ≡ base: every probe logprob and token")


def test_a_divergence_that_doubled_fails_with_both_figures(tmp_path):
    run = ab_run(tmp_path, head_fp8={"decode_shift": 0.02})
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 1
    check = probe_ab(run)
    assert check["status"] == "fail" and check["headline"] == "the change moved FP8 away from auto"
    assert check["figures"]["decode_mean_abs_logprob_diff_growth"] == pytest.approx(2.0)
    assert "decode divergence from auto 0.01 (base) -> 0.02 (head), x2 > x1.5" in check["detail"]


def test_a_shorter_greedy_prefix_fails(tmp_path):
    run = ab_run(tmp_path, head_fp8={"decode_shift": 0.01, "diverge_at": 4})
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 1
    check = probe_ab(run)
    assert check["status"] == "fail"
    assert check["figures"]["greedy_prefix_drop"] == pytest.approx(0.75)
    assert "greedy prefix agreement with auto 1 (base) -> 0.25 (head), down 0.75 > 0.15" in check["detail"]


def test_a_small_move_within_the_limits_passes(tmp_path):
    run = ab_run(tmp_path, head_fp8={"decode_shift": 0.012})
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 0
    check = probe_ab(run)
    assert check["status"] == "pass" and check["figures"]["head_equals_base"] is False
    assert check["figures"]["decode_mean_abs_logprob_diff_growth"] == pytest.approx(1.2)


def test_a_lost_base_probe_is_missing_not_passed(tmp_path):
    run = ab_run(tmp_path, head_fp8={"decode_shift": 0.01})
    import shutil

    shutil.rmtree(run / f"{FP8}--base" / "probe")
    (run / f"{FP8}--base" / "status.json").write_text(json.dumps({"accuracy": {"status": "ok", "kv_cache": {
        "element_bytes": [1], "layer_kv_cache_dtypes": ["fp8"], "tokens": 200_000}}}))
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 1
    check = probe_ab(run)
    assert check["status"] == "missing" and "the base FP8 cell's probe is not run" in check["detail"]


def test_an_fp8_probe_of_other_prompts_errors_its_checks_and_the_report_stands(tmp_path, capsys):
    """The FP8 probe holds 3 prompts, its auto cell's 4: not comparable, so this cell's probe checks error (exit 1)
    with the reason, instead of the whole gate stopping at exit 2 with no report."""
    run = ab_run(tmp_path, head_fp8={"decode_shift": 0.01, "prompts": 3})
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 1
    assert "Traceback" not in capsys.readouterr().err
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    checks = {c["kind"]: c for c in verdict["checks"] if c["kind"] in ("probe", "probe_ab") and c["cell"] == FP8
              and c["status"] == "error"}
    assert set(checks) == {"probe", "probe_ab"}
    assert checks["probe"]["detail"].startswith("cannot compare logprobs with the auto cell: ")
    assert checks["probe_ab"]["detail"].startswith("cannot compare head with base: ")
    for check in checks.values():
        assert "3 prompts, but the reference" in check["detail"] and "has 4" in check["detail"]


def test_the_policy_states_its_limits_and_checks_them():
    policy = policy_module.load()
    limits = policy.probe_ab.limits("sm90")
    assert limits is not None and limits.growth_max > 1 and 0 < limits.greedy_prefix_drop_max < 1
    doc = {"growth_max": 0.5, "greedy_prefix_drop_max": 0.1}
    import tomllib

    text = (policy_module.default_policy_path()).read_text()
    parsed = tomllib.loads(text)
    parsed["probe_ab"] = doc
    with pytest.raises(Exception, match="probe_ab"):
        policy_module.parse(parsed)


def with_cached_context(run: Path, head_fresh_diverges_at: int | None, base_fresh_diverges_at: int | None = None
                        ) -> None:
    """Every probe gains two cached-context prompts answered alike on all four cells; the head FP8 cell's fresh
    prefill of them (the same prompt, the prefix cache not read) differs from its cached answer from
    `head_fresh_diverges_at` on, where given, and the base FP8 cell's from `base_fresh_diverges_at` on; everywhere
    else cached and fresh agree."""
    for probe in run.glob("*/probe/probe.json"):
        data = json.loads(probe.read_text())
        cell = probe.parent.parent.name
        diverges_at = {FP8: head_fresh_diverges_at, f"{FP8}--base": base_fresh_diverges_at}.get(cell)
        entries = []
        for i in range(2):
            answer = [600 + i * 10 + j for j in range(8)]
            fresh = list(answer)
            if diverges_at is not None:
                fresh[diverges_at:] = [599] * (8 - diverges_at)
            entries.append({"prompt": f"prefix + question {i}", "prompt_token_ids": list(range(1, 301)),
                            "cached_tokens": 256, "generated_token_ids": answer, "generated_logprobs": [-0.2] * 8,
                            "generated_top": [[[t, -0.2]] for t in answer], "generated_text": "",
                            "fresh_cached_tokens": 0, "fresh_generated_token_ids": fresh,
                            "fresh_generated_logprobs": [-0.2] * 8})
        data["cached_context"] = entries
        probe.write_text(json.dumps(data))


def test_a_cached_context_path_that_no_longer_matches_a_fresh_prefill_fails(tmp_path):
    """The head's FP8 cell answers its cached-context prompts differently from a fresh prefill of the same prompts,
    where the base side's agree: the change broke the cached-context path (a prefix-cache hit, a chunked prefill's
    later chunks), even where FP8 vs auto did not move."""
    run = ab_run(tmp_path, head_fp8={"decode_shift": 0.0101})
    with_cached_context(run, head_fresh_diverges_at=2)
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 1
    check = probe_ab(run)
    assert check["status"] == "fail"
    assert check["figures"]["head_cached_vs_fresh_greedy_prefix_match"] == pytest.approx(0.25)
    assert check["figures"]["base_cached_vs_fresh_greedy_prefix_match"] == 1.0
    assert ("cached-context greedy prefix shared with a fresh prefill 1 (base) -> 0.25 (head), down 0.75 > 0.15"
            in check["detail"])


def test_where_the_base_sides_cached_answers_already_left_their_fresh_prefill_the_split_point_is_not_judged(tmp_path):
    """On the H200 an FP8 cell's cached answers leave its fresh prefill's on the base side too (the cache read back
    against unquantised keys), and where they split moves between runs of unchanged code (an A/A run of FLASH_ATTN
    with CUDA graphs: 0.781 -> 0.578). Only the divergence over the common prefix is judged then."""
    run = ab_run(tmp_path, head_fp8={"decode_shift": 0.0101})
    with_cached_context(run, head_fresh_diverges_at=2, base_fresh_diverges_at=6)
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 0
    check = probe_ab(run)
    assert check["status"] == "pass"
    assert check["figures"]["cached_vs_fresh_prefix_drop"] == pytest.approx(0.5)
    assert ("not judged: cached-context greedy prefix shared with a fresh prefill 0.75 (base) -> 0.25 (head), down "
            "0.5 > 0.15, where the base side's own cached answers already left its fresh ones" in check["detail"])


def test_cached_context_that_matches_its_fresh_prefill_on_both_sides_passes(tmp_path):
    run = ab_run(tmp_path, head_fp8={"decode_shift": 0.0101})
    with_cached_context(run, head_fresh_diverges_at=None)
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 0
    check = probe_ab(run)
    assert check["status"] == "pass" and check["figures"]["cached_vs_fresh_growth"] == 1.0
    assert "cached context vs fresh prefill 0 -> 0, prefix 1 -> 1" in check["detail"]
