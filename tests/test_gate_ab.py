"""A/B runs (base and head of each cell in one folder), the required baseline, and planned-means-required.

Folders are written in the contract's format by tests/synthetic_run.py, then judged through `kvgate gate`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvgate.cli import main
from synthetic_run import (
    paired_outcomes,
    planned_questions,
    write_accuracy,
    write_cell,
    write_seed_run,
    write_status,
    write_throughput,
)

BACKEND, ARCH = "FLASHMLA", "sm90"
AUTO, FP8 = "flashmla-auto-sm90", "flashmla-fp8-sm90"
FILTERS = ("strict-match", "flexible-extract")


def write_side(run: Path, dtype: str, side: str | None, correct: list[bool]) -> Path:
    cell_id = f"flashmla-{dtype}-sm90"
    folder = cell_id if side in (None, "head") else f"{cell_id}--{side}"
    cell = write_cell(run, backend=BACKEND, kv_cache_dtype=dtype, arch=ARCH, folder=folder,
                      extra={"contract_version": "1.6", **({"side": side} if side else {})})
    write_accuracy(cell, {name: correct for name in FILTERS})
    evidence = {"element_bytes": [1 if dtype == "fp8" else 2], "layer_kv_cache_dtypes": [dtype],
                "tokens": 200_000 if dtype == "fp8" else 100_000}
    write_status(cell, {"accuracy": {"status": "ok", "kv_cache": evidence}})
    return cell


# the questions the policy plans for the matrix's flashmla cells of an A/B run (DeepSeek-V2-Lite, gsm8k test + train)
N = planned_questions(BACKEND, "fp8", ARCH)


def outcomes(drop: int = 0, n: int = N) -> list[bool]:
    """0.65 accuracy with 10 % of questions flipping against the reference; `drop` more lost (of 1319)."""
    flips = round(0.05 * n)
    return paired_outcomes(n, reference_correct=round(0.65 * n), only_reference=flips + round(drop * n / 1319),
                           only_candidate=flips, seed=1)[1]


def reference(n: int = N) -> list[bool]:
    flips = round(0.05 * n)
    return paired_outcomes(n, reference_correct=round(0.65 * n), only_reference=flips, only_candidate=flips,
                           seed=1)[0]


def ab_run(tmp_path: Path, *, head_fp8_drop: int = 0, base_cells=("auto", "fp8")) -> Path:
    run = tmp_path / "run"
    for dtype in base_cells:
        write_side(run, dtype, "base", reference())
    write_side(run, "auto", "head", reference())
    write_side(run, "fp8", "head", outcomes(head_fp8_drop) if head_fp8_drop else reference())
    return run


def verdict(run: Path) -> dict:
    return json.loads((run / "gate" / "verdict.json").read_text())


def checks(run: Path, kind: str) -> dict[tuple[str, str | None], dict]:
    return {(c["cell"], c["subject"]): c for c in verdict(run)["checks"] if c["kind"] == kind}


def test_an_ab_run_judges_head_against_its_own_base_side(tmp_path, capsys):
    run = ab_run(tmp_path)
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("✅ kvgate: all ")
    compared = checks(run, "baseline_accuracy")
    assert sorted(compared) == [(AUTO, "flexible-extract"), (AUTO, "strict-match"), (FP8, "flexible-extract"),
                                (FP8, "strict-match")]
    assert {c["reference"] for c in compared.values()} == {"base side"}
    # one decision per cell, on the primary filter; the other filter is reported
    assert {k[1]: c["status"] for k, c in compared.items()} == {"strict-match": "pass", "flexible-extract": "info"}
    assert not any(c["cell"].endswith("--base") for c in verdict(run)["checks"])  # the base side is the reference


def test_a_head_that_regressed_against_its_base_fails(tmp_path):
    run = ab_run(tmp_path, head_fp8_drop=80)
    assert main(["gate", str(run), "--require-baseline", "--today", "2026-11-30"]) == 1
    assert checks(run, "baseline_accuracy")[(FP8, "strict-match")]["status"] == "fail"
    assert checks(run, "baseline_accuracy")[(AUTO, "strict-match")]["status"] == "pass"


def test_in_an_ab_run_a_head_cell_without_its_base_fails_closed(tmp_path):
    run = ab_run(tmp_path, base_cells=("auto",))
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    missing = checks(run, "baseline_accuracy")[(FP8, None)]
    assert (missing["status"], missing["detail"]) == ("missing", "the base side of this A/B run has no such cell")


def test_in_an_ab_run_a_failed_base_stage_fails_the_comparison(tmp_path):
    run = ab_run(tmp_path)
    write_status(run / f"{FP8}--base", {"accuracy": {"status": "error", "reason": "engine crashed"}})
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    failed = checks(run, "baseline_accuracy")[(FP8, None)]
    assert (failed["status"], failed["detail"]) == ("error", "cannot compare: the base side's accuracy stage is error")


def test_an_ab_run_cannot_take_a_second_baseline(tmp_path, capsys):
    run = ab_run(tmp_path)
    other = shutil.copytree(run, tmp_path / "other")
    assert main(["gate", str(run), "--baseline", str(other)]) == 2
    assert capsys.readouterr().err.strip() == (f"ERROR --baseline: {run} is an A/B run: it holds its own base side. "
                                               "Judge it alone, or judge a run of one side against --baseline")


@pytest.mark.parametrize("given", ["its path", "through ..", "a link"])
def test_attack_the_run_itself_as_its_baseline_is_refused(tmp_path, capsys, given):
    """Every cell compared with itself passes every baseline check (a 20-point FP8 drop against the base included):
    the run folder, however it is named (through `..`, a link to it), cannot be its own --baseline."""
    run = write_seed_run(tmp_path / "run", fp8_drop_points=20)
    (tmp_path / "link").symlink_to(run)
    baseline = {"its path": run, "through ..": run / ".." / "run", "a link": tmp_path / "link"}[given]
    assert main(["gate", str(run), "--baseline", str(baseline), "--today", "2026-11-30"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ERROR {baseline}: the baseline is the run folder itself, given as --baseline: every cell would be compared "
        "with itself, a comparison that cannot fail. Pass the results folder of the vLLM the change is compared with")
    assert not (run / "gate").exists()


def test_an_unknown_side_is_bad_input(tmp_path, capsys):
    run = ab_run(tmp_path)
    record = json.loads((run / AUTO / "cell.json").read_text())
    (run / AUTO / "cell.json").write_text(json.dumps({**record, "side": "left"}))
    assert main(["gate", str(run)]) == 1  # that cell errors; the run is judged
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR ")] == [
        f"ERROR {run}/{AUTO}/cell.json: expected \"head\" or \"base\", got string 'left' in side"]


def test_the_same_cell_twice_on_one_side_is_a_duplicate(tmp_path, capsys):
    run = ab_run(tmp_path)
    write_side(run, "fp8", "base", reference()).rename(run / "copy-of-fp8-base")
    write_side(run, "fp8", "base", reference())
    assert main(["gate", str(run)]) == 2
    assert ("duplicate cell flashmla-fp8-sm90 (model deepseek-ai/DeepSeek-V2-Lite-Chat, task kvgate_gsm8k_test_train, "
            "base side)") in capsys.readouterr().err


def one_sided_run(tmp_path: Path, planned: list[str]) -> Path:
    run = tmp_path / "run"
    write_side(run, "auto", None, reference())
    (run / "run.json").write_text(json.dumps({"contract_version": "1.1", "cells": planned, "sides": ["head"],
                                              "invocations": [{"cells": planned, "sides": ["head"]}]}))
    return run


def test_a_planned_cell_that_left_no_folder_fails_by_name(tmp_path, capsys):
    run = one_sided_run(tmp_path, [AUTO, FP8])
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    missing = checks(run, "cell")[(FP8, None)]
    assert missing["status"] == "missing"
    assert missing["detail"] == ("planned but no folder of this run holds it: the cell never started, or its results "
                                 "were lost on the way to the gate")
    assert capsys.readouterr().out.splitlines()[0].startswith("❌ kvgate: 1 of ")


@pytest.mark.parametrize("sides", [["head"], ["base", "head"]])
def test_a_run_whose_planned_cells_all_left_no_folder_fails_by_name_with_its_report(tmp_path, capsys, sides):
    """Every planned cell of run.json absent (every cell job died, the artifacts were lost): the gate judged one absent
    cell of two as a failure with its report, but none of two as bad input (exit 2, "no cell folders") with no
    report naming them. It fails the run (exit 1) naming each cell on each planned side, in every output."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"contract_version": "1.6", "cells": [AUTO, FP8], "sides": sides}))
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    missing = [(c["cell"], c["reference"], c["headline"]) for c in verdict(run)["checks"] if c["kind"] == "cell"]
    headline = {"head": "planned, but absent from the run", "base": "planned (base side), but absent from the run"}
    assert sorted(missing, key=str) == sorted(((cell, side if side == "base" else None, headline[side])
                                               for cell in (AUTO, FP8) for side in sides), key=str)
    assert verdict(run)["summary"]["missing"] == len(missing) == verdict(run)["summary"]["failed"]
    assert capsys.readouterr().out.splitlines()[0].startswith(f"❌ kvgate: {len(missing)} of {len(missing)} checks "
                                                               "failed")
    for name in ("report.md", "report.html", "junit.xml"):
        assert FP8 in (run / "gate" / name).read_text(encoding="utf-8")


def test_an_empty_folder_with_expected_cells_fails_them_by_name(tmp_path):
    (tmp_path / "run").mkdir()
    plan = tmp_path / "plan"
    plan.write_text(f"{FP8}\n")
    assert main(["gate", str(tmp_path / "run"), "--expect-cells", str(plan), "--today", "2026-11-30"]) == 1
    assert checks(tmp_path / "run", "cell")[(FP8, None)]["status"] == "missing"


@pytest.mark.parametrize("run_json", [None, {"contract_version": "1.6", "cells": []}, {"contract_version": "1.6"}],
                         ids=["no run.json", "no cells planned", "cells not said"])
def test_a_folder_that_plans_no_cell_and_holds_none_is_still_no_run(tmp_path, capsys, run_json):
    run = tmp_path / "run"
    run.mkdir()
    if run_json is not None:
        (run / "run.json").write_text(json.dumps(run_json))
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 2
    assert "no cell folders" in capsys.readouterr().err
    assert not (run / "gate").exists()


@pytest.mark.parametrize("form", ["json", "lines"])
def test_expected_cells_from_the_plan_must_all_be_there(tmp_path, form):
    run = one_sided_run(tmp_path, [AUTO])
    plan = tmp_path / "plan"
    plan.write_text(json.dumps({"include": [{"cell": AUTO}, {"cell": FP8}]}) if form == "json" else f"{AUTO}\n{FP8}\n")
    assert main(["gate", str(run), "--expect-cells", str(plan), "--today", "2026-11-30"]) == 1
    assert checks(run, "cell")[(FP8, None)]["status"] == "missing"


def test_an_expected_cell_of_a_feature_is_a_cell_id(tmp_path):
    """A feature's cell ends in the feature (flashmla-fp8-sm90-spec_decode): a plan naming one is read, and the cell,
    absent from the run, is missing."""
    run = one_sided_run(tmp_path, [AUTO])
    plan = tmp_path / "plan"
    plan.write_text(f"{AUTO}\nflashmla-fp8-sm90-spec_decode\n")
    assert main(["gate", str(run), "--expect-cells", str(plan), "--today", "2026-11-30"]) == 1
    assert checks(run, "cell")[("flashmla-fp8-sm90-spec_decode", None)]["status"] == "missing"


@pytest.mark.parametrize(("text", "message"), [
    ('{"include": [{"runner": "x"}]}', 'expected {"include": [{"cell": "<id>", ...}, ...]} in include. Pass the plan '
                                       "job's matrix output as it is"),
    ('{"include": [', "not valid JSON (Expecting value) in line 1 column 14"),
    ("flashmla-fp8-sm90\nrm -rf /\n", "'rm -rf /' is not a cell id. Write one id per line, e.g. flashmla-fp8-sm90"),
])
def test_a_bad_expected_cells_file_is_one_error(tmp_path, capsys, text, message):
    run = one_sided_run(tmp_path, [AUTO])
    plan = tmp_path / "plan"
    plan.write_text(text)
    assert main(["gate", str(run), "--expect-cells", str(plan)]) == 2
    assert capsys.readouterr().err.strip() == f"ERROR {plan}: {message}"


DRIFT = [1.00, 0.97, 1.03, 0.95, 1.05, 0.99, 1.01]


def ab_throughput(tmp_path: Path, head_scale: float, *, interleaved: bool = True, drift: list[float] = DRIFT,
                  rounds_said: int | None = None) -> Path:
    """auto only, both sides, 7 repeats; the machine drifts over the rounds and both sides share the drift.
    rounds_said: the rounds status.json claims (default: as many as there are)."""
    run = tmp_path / "run"
    for side in ("base", "head"):
        cell = write_cell(run, backend=BACKEND, kv_cache_dtype="auto", arch=ARCH,
                          folder=AUTO if side == "head" else f"{AUTO}--base", extra={"side": side})
        scale = head_scale if side == "head" else 1.0
        write_throughput(cell, [3.2 * d * scale * (1.002 if i % 2 else 0.998) for i, d in enumerate(drift)])
        entry = {"status": "ok"}
        if interleaved:
            entry["interleaved"] = {"order": ["base", "head"], "rounds": rounds_said or len(drift)}
        write_status(cell, {"throughput": entry})
    return run


def test_interleaved_ab_throughput_pairs_rounds_so_shared_drift_cancels(tmp_path):
    run = ab_throughput(tmp_path, 1.0)
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    check = checks(run, "throughput")[(AUTO, "requests_per_second")]
    assert check["status"] == "pass"
    assert "interleaved A/B: paired by round (7 rounds)" in check["notes"]


def test_a_throughput_check_states_the_power_its_own_repeats_leave(tmp_path):
    """At the GPU's measured repeat noise (15-22 %: matrix/policy.toml throughput.measured_noise) a pass says how
    little it shows; without noise it states full power."""
    quiet = ab_throughput(tmp_path / "quiet", 1.0)
    assert main(["gate", str(quiet), "--today", "2026-11-30"]) == 0
    check = checks(quiet, "throughput")[(AUTO, "requests_per_second")]
    assert "this run's repeats vary 0 % (SD of log requests_per_second); at that noise the test catches a 10 % " \
           "slowdown 100 % of the time" in check["notes"]
    noisy = ab_throughput(tmp_path / "noisy", 1.0)
    jitter = [1.0, 1.25, 0.8, 1.1, 0.85, 1.2, 0.92]
    write_throughput(noisy / AUTO, [3.2 * j for j in jitter])
    assert main(["gate", str(noisy), "--today", "2026-11-30"]) == 0
    check = checks(noisy, "throughput")[(AUTO, "requests_per_second")]
    assert check["status"] == "pass"
    stated = [n for n in check["notes"] if n.startswith("this run's repeats vary")]
    assert len(stated) == 1 and stated[0].endswith("a pass is weak evidence (matrix/policy.toml "
                                                   "throughput.measured_noise)")
    assert check["figures"]["repeat_sd_log"] > 0.1 and check["figures"]["power_at_10_percent"] < 0.5


def test_a_throughput_check_against_a_stored_baseline_states_the_power_the_run_to_run_sd_leaves(tmp_path):
    """Runs not interleaved (a stored baseline) add the policy's run-to-run SD (3 %), which no number of repeats
    averages away: a 10 % slowdown is caught at most ~15 % of the time (kvgate power), and the pass says so."""
    both = ab_throughput(tmp_path, 1.0, interleaved=False)
    run, baseline = tmp_path / "head", tmp_path / "stored"
    for folder, side in ((run, AUTO), (baseline, f"{AUTO}--base")):
        folder.mkdir()
        (both / side).rename(folder / AUTO)
        record = json.loads((folder / AUTO / "cell.json").read_text())
        record.pop("side")
        (folder / AUTO / "cell.json").write_text(json.dumps(record))
    assert main(["gate", str(run), "--baseline", str(baseline), "--today", "2026-11-30"]) == 0
    check = checks(run, "throughput")[(AUTO, "requests_per_second")]
    assert check["status"] == "pass" and 0.05 < check["figures"]["power_at_10_percent"] < 0.16
    assert any(n.startswith("this run's repeats vary") and n.endswith("a pass is weak evidence (matrix/policy.toml "
                                                                      "throughput.measured_noise)")
               for n in check["notes"])


def test_a_pass_after_an_infrastructure_retry_says_so(tmp_path):
    run = ab_throughput(tmp_path, 1.0)
    status = json.loads((run / AUTO / "status.json").read_text())
    status["throughput"]["infra_retries"] = [{"run": "repeat 3/7", "reason": "Error in memory profiling"}]
    (run / AUTO / "status.json").write_text(json.dumps(status))
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    check = checks(run, "throughput")[(AUTO, "requests_per_second")]
    assert check["status"] == "pass"
    assert "started again after an infrastructure failure (repeat 3/7: Error in memory profiling)" in check["notes"]


def test_interleaved_ab_throughput_catches_a_ten_percent_slowdown_under_drift(tmp_path):
    run = ab_throughput(tmp_path / "slow", 0.90)
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    assert checks(run, "throughput")[(AUTO, "requests_per_second")]["status"] == "fail"


# ------------------------------------------------------------------------------------------------ the trusted design

def test_attack_an_ab_run_not_interleaved_cannot_pick_the_unpaired_test(tmp_path, capsys):
    """The A/B design is the policy's (interleaved rounds, paired): status.json without `interleaved` does not turn
    it into the unpaired test, whose run-to-run SD would let a 12.5 % drop pass; the cell errors, named."""
    run = ab_throughput(tmp_path, 0.875, interleaved=False)
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    refused = checks(run, "cell")[(AUTO, None)]
    assert refused["status"] == "error"
    assert f"{run}/{AUTO}/status.json throughput.interleaved is absent, but an A/B run's throughput runs both sides " \
           "by turns" in refused["detail"]
    assert not checks(run, "throughput")  # nothing of the refused cell is judged
    assert capsys.readouterr().out.startswith(f"❌ kvgate: 1 of 1 checks failed — {AUTO} cell disagrees with the "
                                              "trusted side")


@pytest.mark.parametrize(("rounds_said", "said"), [(None, "2"), (7, "7")])
def test_attack_two_interleaved_rounds_do_not_pass_a_twelve_percent_drop(tmp_path, rounds_said, said):
    """Two rounds, said as two or claimed as seven: fewer rounds than the policy's is the cell's error, naming
    the field, what the folder says and the policy's number; never a pass of a 12.5 % drop."""
    run = ab_throughput(tmp_path, 0.875, drift=[1.0, 1.0], rounds_said=rounds_said)
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    detail = checks(run, "cell")[(AUTO, None)]["detail"]
    if said == "2":
        assert f"{run}/{AUTO}--base/status.json throughput.interleaved.rounds is 2, but the policy needs at least 7 " \
               "(matrix/policy.toml throughput.rounds)" in detail
    assert f"{run}/{AUTO}/throughput: 2 rounds pair with the base side's repeats (repeat-N.json), but the policy " \
           "needs at least 7 (matrix/policy.toml throughput.rounds)" in detail
    assert not checks(run, "throughput")


def test_under_require_baseline_a_stored_comparison_needs_the_policys_repeats(tmp_path):
    run, stored = tmp_path / "run", tmp_path / "stored"
    for folder in (run, stored):
        cell = write_cell(folder, backend=BACKEND, kv_cache_dtype="auto", arch=ARCH)
        write_throughput(cell, [3.2, 3.21, 3.19])
    assert main(["gate", str(run), "--baseline", str(stored), "--require-baseline", "--today", "2026-11-30"]) == 1
    assert checks(run, "cell")[(AUTO, None)]["detail"].startswith(
        f"not judged: the results folder disagrees with the trusted side: {run}/{AUTO}/throughput: 3 measured repeats, "
        "but --require-baseline needs at least 7 (matrix/policy.toml throughput.rounds)")
    assert main(["gate", str(run), "--baseline", str(stored), "--today", "2026-11-30"]) == 0  # locally: judged


def test_rounds_that_all_show_one_ratio_report_a_power_not_nan(tmp_path):
    """Each round's head at exactly half its base (the rounds' log ratios agree to 1e-16): the throughput fails, and
    its note states the power (100 %), where scipy's noncentral t gave NaN: "catches a 10 % slowdown nan % of the
    time" in report.md and power_at_10_percent null in verdict.json."""
    from synthetic_run import write_ab_run

    run = write_ab_run(tmp_path / "run", [("FLASHINFER", "auto", "sm90"), ("FLASHINFER", "fp8", "sm90")],
                       slower={"flashinfer-fp8-sm90": 0.5})
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    check = checks(run, "throughput")[("flashinfer-fp8-sm90", "requests_per_second")]
    assert check["status"] == "fail"
    assert check["figures"]["power_at_10_percent"] == 1.0
    report = (run / "gate" / "report.md").read_text(encoding="utf-8")
    assert "catches a 10 % slowdown 100 % of the time" in report
    assert " nan " not in report.lower()
