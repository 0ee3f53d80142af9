"""kvgate.gate.policy: matrix/policy.toml loads, its thresholds mean what the comments say, bad files are named."""

from __future__ import annotations

import copy
import dataclasses
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest

from kvgate import InputError, InputErrors
from kvgate.cli import main
from kvgate.gate import policy as policy_module
from kvgate.matrix import cells as matrix_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def matrix() -> matrix_module.Matrix:
    return matrix_module.load()


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    with (ROOT / "matrix" / "policy.toml").open("rb") as handle:
        return tomllib.load(handle)


def test_the_repository_policy_loads(matrix: matrix_module.Matrix) -> None:
    policy = policy_module.load(matrix=matrix)
    accuracy = policy.accuracy
    print(policy)
    assert (accuracy.fp8_tax_points, accuracy.baseline_margin_points) == (3.0, 1.0)
    assert (accuracy.alpha, accuracy.multiplicity) == (0.01, "none")
    assert (accuracy.primary_filter, accuracy.filters) == ("strict-match", ("strict-match", "flexible-extract"))
    assert (accuracy.questions, accuracy.sequential.max_questions) == (3005, 3226)
    assert policy.fp8_tax_points("deepseek-ai/DeepSeek-V2-Lite-Chat") == 3.0
    assert policy.fp8_tax_points("some/other-model") == accuracy.fp8_tax_points
    assert (policy.throughput.tolerance, policy.throughput.alpha, policy.throughput.rounds) == (0.05, 0.05, 7)
    assert policy.throughput.run_to_run_sd == 0.03
    floor = policy.floor_for("deepseek-ai/DeepSeek-V2-Lite-Chat", "sm100", "kvgate_gsm8k_test_train")
    assert floor is not None and floor.floor("strict-match") == pytest.approx(0.671 * 0.92)
    assert policy.floor_for("deepseek-ai/DeepSeek-V2-Lite-Chat", "cpu", "kvgate_gsm8k_test_train") is None
    assert policy.kernels.min_executed_tests == 1


def test_per_model_fp8_tax_overrides_the_default(document: dict[str, Any], matrix: matrix_module.Matrix) -> None:
    doc = copy.deepcopy(document)
    doc["accuracy"]["fp8_tax_points_by_model"] = {"meta-llama/Llama-3.1-8B-Instruct": 2.0}
    policy = policy_module.parse(doc, matrix=matrix)
    assert policy.fp8_tax_points("meta-llama/Llama-3.1-8B-Instruct") == 2.0
    assert policy.fp8_tax_points("deepseek-ai/DeepSeek-V2-Lite-Chat") == 3.0


# Probe figures (mean abs prompt-logprob diff, max abs diff, top-1 agreement) vs a first auto run, 16 prompts.
# The default limits (archs without their own, e.g. sm100): the random tiny Llama of
# docs/facts/vllm-cpu.md#probe-figures-of-a-random-tiny-llama.
RANDOM_MODEL_PROBE = {
    "auto again": ("auto", 0.0, 0.0, 1.00),
    "fp8": ("fp8", 0.050, 0.145, 0.81),
    "fp8_e4m3": ("fp8_e4m3", 0.050, 0.145, 0.81),
    "fp8_e5m2": ("fp8_e5m2", 0.094, 0.415, 0.67),
}
RANDOM_MODEL_BROKEN_INT8 = (0.651, 1.67, 0.19)
# The cpu arch's limits: the trained tiny-llama the CPU default runs (benchmarks/probe_figures.py, 2026-12-01).
TRAINED_CPU_PROBE = {
    "auto again": ("auto", 0.0, 0.0, 1.00),
    "fp8": ("fp8", 0.2120, 3.8658, 0.965),
    "fp8_e4m3": ("fp8_e4m3", 0.2120, 3.8658, 0.965),
    "fp8_e5m2": ("fp8_e5m2", 0.3971, 4.2984, 0.923),
}
TRAINED_CPU_BROKEN_INT8 = (2.6237, 16.4521, 0.468)
# The sm90 arch's limits: the trained tiny models on the H200 (tests/fixtures/h200_run/), each FP8 backend's figures;
# no broken FP8 engine was measured on a GPU, so the CPU's broken path stands in for one.
H200_FP8_PROBE = {
    "FLASH_ATTN": ("fp8", 0.129669, 2.051938, 0.978351),
    "FLASHINFER": ("fp8", 0.12533, 2.065232, 0.974227),
    "TRITON_ATTN": ("fp8", 0.134394, 1.939015, 0.978351),
    "FLASHMLA": ("fp8", 0.004634, 0.41997, 1.0),
    "TRITON_MLA": ("fp8", 0.0, 0.0, 1.0),
}
CASES = [(arch, *figures, broken) for arch, table, broken in (
    ("sm100", RANDOM_MODEL_PROBE, RANDOM_MODEL_BROKEN_INT8), ("cpu", TRAINED_CPU_PROBE, TRAINED_CPU_BROKEN_INT8),
    ("sm90", H200_FP8_PROBE, TRAINED_CPU_BROKEN_INT8))
    for figures in table.values()]


def _passes(limits: policy_module.ProbeThresholds, mean: float, worst: float, top1: float) -> bool:
    return (mean <= limits.mean_abs_logprob_diff_max and worst <= limits.max_abs_logprob_diff_max
            and top1 >= limits.top1_agreement_min)


@pytest.mark.parametrize("arch, dtype, mean, worst, top1, broken", CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_probe_thresholds_pass_the_measured_healthy_paths_and_fail_the_broken_one(
        arch: str, dtype: str, mean: float, worst: float, top1: float, broken: tuple[float, float, float],
        matrix: matrix_module.Matrix) -> None:
    limits = policy_module.load(matrix=matrix).probe.thresholds(dtype, arch)
    assert _passes(limits, mean, worst, top1)
    # headroom: the healthy figure is at least 1.5x inside each limit (top-1 by its disagreement) ...
    assert mean * 1.5 <= limits.mean_abs_logprob_diff_max or mean == 0
    assert worst * 1.5 <= limits.max_abs_logprob_diff_max or worst == 0
    assert (1 - top1) * 1.5 <= 1 - limits.top1_agreement_min or top1 == 1
    # ... and a broken path (int8 through the same check) misses every one of the three limits by 1.4x+
    bad_mean, bad_worst, bad_top1 = broken
    assert bad_mean > 1.4 * limits.mean_abs_logprob_diff_max
    assert bad_worst > 1.4 * limits.max_abs_logprob_diff_max
    assert 1 - bad_top1 > 1.4 * (1 - limits.top1_agreement_min)


def test_probe_thresholds_per_arch_override_only_what_they_name(document: dict[str, Any],
                                                                matrix: matrix_module.Matrix) -> None:
    doc = copy.deepcopy(document)
    doc["probe"]["fp8"]["by_arch"] = {"sm90": {"top1_agreement_min": 0.9}}
    probe = policy_module.parse(doc, matrix=matrix).probe
    assert probe.thresholds("fp8", "sm90").top1_agreement_min == 0.9
    assert probe.thresholds("fp8", "sm90").mean_abs_logprob_diff_max == probe.thresholds("fp8", "sm100").mean_abs_logprob_diff_max
    assert probe.thresholds("fp8", "sm100").top1_agreement_min == 0.60


def test_fp8_over_auto_is_only_checked_where_declared(document: dict[str, Any], matrix: matrix_module.Matrix) -> None:
    seed_cell = matrix.cell("flashinfer_mla-fp8-sm100")
    assert policy_module.load(matrix=matrix).throughput.fp8_over_auto_expectation(seed_cell) is None
    doc = copy.deepcopy(document)
    doc["throughput"]["fp8_over_auto"] = [
        {"match": {"backend": "FLASHINFER_MLA", "arch": "sm100"}, "min_ratio": 1.0, "reason": "seed PR: +10 %"},
        {"cell": "flashmla-fp8-sm90", "min_ratio": 0.3, "reason": "fp8 decode is slower on SM90"},
    ]
    throughput = policy_module.parse(doc, matrix=matrix).throughput
    found = throughput.fp8_over_auto_expectation(seed_cell)
    assert found is not None and (found.min_ratio, found.where) == (1.0, "throughput.fp8_over_auto[0]")
    assert throughput.fp8_over_auto_expectation(matrix.cell("flashmla-fp8-sm90")).min_ratio == 0.3
    assert throughput.fp8_over_auto_expectation(matrix.cell("flashinfer_mla-auto-sm100")) is None
    assert throughput.fp8_over_auto_expectation(matrix.cell("cutlass_mla-fp8-sm100")) is None


# ---------------------------------------------------------------------------------------------- bad files

def _set(*path: str, value: Any):
    def edit(doc: dict[str, Any]) -> None:
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value
    return edit


def _rename(table: str, old: str, new: str):
    def edit(doc: dict[str, Any]) -> None:
        doc[table][new] = doc[table].pop(old)
    return edit


BAD_POLICIES = {
    "a contract newer than this kvgate reads": (
        _set("results", "oldest_contract", value="1.19"),
        ['matrix/policy.toml: expected a contract version from "1.0" to "1.18" (a string), got the string \'1.19\' in '
         'results.oldest_contract']),
    "probe_ab growth below 1": (
        _set("probe_ab", "growth_max", value=0.5),
        ["matrix/policy.toml: expected a number >= 1 and <= 1000, got the number 0.5 in probe_ab.growth_max"]),
    "design flips of a kind the gate does not have": (
        _set("accuracy", "design_flips_by_model", value={"kvgate:tiny-llama": {"fp8": 0.03, "source": "x"}}),
        ["matrix/policy.toml: unknown key 'fp8' in accuracy.design_flips_by_model.kvgate:tiny-llama. Known: "
         "baseline_accuracy, fp8_accuracy, source"]),
    "measured noise of a cell the matrix does not have": (
        _set("throughput", "measured_noise", value=[{"workload": "llama-3_1-8b", "cell": "flash_attn-fp8-sm91",
                                                    "repeat_sd": 0.2, "engines": 5, "repeats": 5, "date": "2026-12-02",
                                                    "source": "x"}]),
        ["matrix/policy.toml: unknown cell 'flash_attn-fp8-sm91' in throughput.measured_noise[0].cell. Did you mean "
         "flash_attn-fp8-sm90?"]),
    "an engine SD from one engine": (
        _set("throughput", "measured_noise", value=[{"workload": "llama-3_1-8b", "cell": "flash_attn-fp8-sm90",
                                                    "repeat_sd": 0.002, "engine_sd": 0.01, "engines": 1, "repeats": 3,
                                                    "date": "2026-12-02", "source": "x"}]),
        ["matrix/policy.toml: an engine-to-engine SD needs at least 2 engines in throughput.measured_noise[0].engines. "
         "Measure in several engine starts, or leave engine_sd out"]),
    "misspelt key": (
        _rename("accuracy", "fp8_tax_points", "fp8_tax_point"),
        ["matrix/policy.toml: unknown key 'fp8_tax_point' in accuracy. Did you mean fp8_tax_points?",
         "matrix/policy.toml: missing key 'fp8_tax_points' in accuracy"]),
    "alpha out of range": (
        _set("accuracy", "alpha", value=5),
        ["matrix/policy.toml: expected a number > 0 and < 0.5, got the number 5 in accuracy.alpha"]),
    "multiplicity in capitals": (
        _set("accuracy", "multiplicity", value="Holm"),
        ["matrix/policy.toml: unknown multiplicity method 'Holm' in accuracy.multiplicity. Did you mean holm?"]),
    "unknown multiplicity": (
        _set("throughput", "multiplicity", value="bonferroni"),
        ["matrix/policy.toml: unknown multiplicity method 'bonferroni' in throughput.multiplicity. "
         "Known: bh, holm, none"]),
    "model not in the matrix": (
        _set("accuracy", "fp8_tax_points_by_model", value={"deepseek-ai/DeepSeek-V2-Lite": 4.0}),
        ["matrix/policy.toml: unknown model 'deepseek-ai/DeepSeek-V2-Lite' in accuracy.fp8_tax_points_by_model. "
         "Did you mean deepseek-ai/DeepSeek-V2-Lite-Chat?"]),
    "filter with an underscore": (
        _set("accuracy", "filters", value=["strict_match", "flexible-extract"]),
        ["matrix/policy.toml: unknown gsm8k filter 'strict_match' in accuracy.filters[0]. Did you mean strict-match?"]),
    "fractional min_n": (
        _set("accuracy", "min_n", value=200.5),
        ["matrix/policy.toml: expected an integer >= 1, got the number 200.5 in accuracy.min_n"]),
    "probe dtype typo": (
        _rename("probe", "fp8_e5m2", "fp8_e4m2"),
        ["matrix/policy.toml: unknown kv_cache_dtype 'fp8_e4m2' in probe.fp8_e4m2. Did you mean fp8_e5m2?",
         "matrix/policy.toml: no thresholds for kv_cache_dtype 'fp8_e5m2' in probe. Add [probe.fp8_e5m2] with "
         "mean_abs_logprob_diff_max, max_abs_logprob_diff_max, top1_agreement_min"]),
    "probe arch typo": (
        _set("probe", "fp8", "by_arch", value={"sm9": {"top1_agreement_min": 0.5}}),
        ["matrix/policy.toml: unknown arch 'sm9' in probe.fp8.by_arch.sm9. Did you mean sm90?"]),
    "top-1 as a percentage": (
        _set("probe", "fp8", "top1_agreement_min", value=60),
        ["matrix/policy.toml: expected a number >= 0 and <= 1, got the number 60 in probe.fp8.top1_agreement_min"]),
    "expectation for a cell id typo": (
        _set("throughput", "fp8_over_auto",
             value=[{"cell": "flashinfer_mla-fp8-sm10", "min_ratio": 1.0, "reason": "seed PR"}]),
        ["matrix/policy.toml: unknown FP8 cell 'flashinfer_mla-fp8-sm10' in throughput.fp8_over_auto[0].cell. "
         "Did you mean flashinfer_mla-fp8-sm100?"]),
    "expectation for a backend typo": (
        _set("throughput", "fp8_over_auto",
             value=[{"match": {"backend": "FLASHINFR_MLA"}, "min_ratio": 1.0, "reason": "seed PR"}]),
        ["matrix/policy.toml: unknown backend 'FLASHINFR_MLA' in throughput.fp8_over_auto[0].match.backend. "
         "Did you mean FLASHINFER_MLA?"]),
    "expectation on auto cells": (
        _set("throughput", "fp8_over_auto",
             value=[{"match": {"kv_cache_dtype": "auto"}, "min_ratio": 1.0, "reason": "seed PR"}]),
        ["matrix/policy.toml: matches no FP8 cell in throughput.fp8_over_auto[0].match. Fix its names or delete it"]),
    "expectation with cell and match": (
        _set("throughput", "fp8_over_auto",
             value=[{"cell": "flashinfer_mla-fp8-sm100", "match": {"arch": "sm100"}, "min_ratio": 1.0,
                     "reason": "seed PR"}]),
        ["matrix/policy.toml: give exactly one of 'cell' or 'match' in throughput.fp8_over_auto[0]"]),
    "primary filter unknown": (
        _set("accuracy", "primary_filter", value="strict"),
        ["matrix/policy.toml: unknown gsm8k filter 'strict' in accuracy.primary_filter. Did you mean strict-match?"]),
    "primary filter not reported": (
        _set("accuracy", "filters", value=["flexible-extract"]),
        ["matrix/policy.toml: the primary filter 'strict-match' is not among the reported filters in "
         "accuracy.filters. Add 'strict-match'"]),
    "looks that do not end at 1": (
        _set("accuracy", "sequential", "looks", value=[0.5, 0.9]),
        ["matrix/policy.toml: expected increasing fractions in (0, 1] ending at 1, got a list in "
         "accuracy.sequential.looks"]),
    "flips as a percentage": (
        _set("accuracy", "design_flips", value=15),
        ["matrix/policy.toml: expected a number > 0 and < 1, got the number 15 in accuracy.design_flips"]),
    "run-to-run SD without a source": (
        lambda doc: doc["throughput"].pop("run_to_run_sd_source"),
        ["matrix/policy.toml: missing key 'run_to_run_sd_source' in throughput"]),
    "a single round": (
        _set("throughput", "rounds", value=1),
        ["matrix/policy.toml: expected an integer >= 2, got the number 1 in throughput.rounds"]),
    "no kernels table": (
        lambda doc: doc.pop("kernels"),
        ["matrix/policy.toml: missing key 'kernels' in policy.toml"]),
    # Values each in range that make no design: the gate's question plan met them as a ValueError traceback, or ran
    # out of memory sizing 10^22 questions
    "alpha of one half": (  # the sequential design needs alpha < 0.5
        _set("accuracy", "alpha", value=0.5),
        ["matrix/policy.toml: expected a number > 0 and < 0.5, got the number 0.5 in accuracy.alpha"]),
    "power of one half": (  # beta = 0.5
        _set("accuracy", "power", value=0.5),
        ["matrix/policy.toml: expected a number > 0.5 and < 1, got the number 0.5 in accuracy.power"]),
    "a gap of a billionth of a point": (
        _set("accuracy", "gap_points", value=1e-9),
        ["matrix/policy.toml: catching a drop of 3 points over a margin of 3 (accuracy.fp8_tax_points) at 15 % noise "
         "flips with alpha 0.01 and power 0.9 needs about 2.33e+22 questions, more than 1000000 in "
         "accuracy.gap_points. Widen gap_points, or ask less (alpha, power)"]),
    "a gap lost in rounding": (
        _set("accuracy", "gap_points", value=1e-300),
        ["matrix/policy.toml: catching a drop of 3 points over a margin of 3 (accuracy.fp8_tax_points) at 15 % noise "
         "flips with alpha 0.01 and power 0.9 needs unboundedly many questions, more than 1000000 in "
         "accuracy.gap_points. Widen gap_points, or ask less (alpha, power)"]),
    "alpha that 1 - alpha rounds away": (
        _set("accuracy", "alpha", value=1e-20),
        ["matrix/policy.toml: alpha 1e-20 is too near 0 to compute a design with in accuracy.alpha. Write e.g. "
         "alpha = 0.01"]),
    "noise that leaves no room for the drop": (
        _set("accuracy", "design_flips", value=0.99),
        ["matrix/policy.toml: a drop of 6 points (accuracy.fp8_tax_points + gap_points) on top of 99 % noise flips "
         "breaks more answers than there are questions in accuracy.design_flips. Lower the margin, gap_points or "
         "the noise"]),
    "a beta spending rho with no boundaries": (
        _set("accuracy", "sequential", "beta_spending_rho", value=1e-6),
        ["matrix/policy.toml: the sequential design has no boundaries at alpha 0.01, power 0.9 and beta_spending_rho "
         "1e-06 (no root in [1.8039497197927206, 7.215798879170882]: f = 0.6095131276792072 and "
         "6.74126439392797e-09) in accuracy.sequential. kvgate's design uses beta_spending_rho = 2.0"]),
}


@pytest.mark.parametrize("edit, messages", BAD_POLICIES.values(), ids=BAD_POLICIES.keys())
def test_bad_policy_documents_name_the_file_the_key_and_the_fix(
        edit, messages: list[str], document: dict[str, Any], matrix: matrix_module.Matrix) -> None:
    doc = copy.deepcopy(document)
    edit(doc)
    with pytest.raises(InputErrors) as caught:
        policy_module.parse(doc, "matrix/policy.toml", matrix=matrix)
    assert [str(e) for e in caught.value.errors] == messages


def test_a_bad_policy_file_is_one_error_line_per_problem_and_exit_2(tmp_path: Path, capsys) -> None:
    text = (ROOT / "matrix" / "policy.toml").read_text(encoding="utf-8")
    bad = tmp_path / "policy.toml"
    bad.write_text(text.replace('multiplicity = "none"', 'multiplicity = "None"', 1)
                   .replace("alpha = 0.01", "alpha = 0", 1), encoding="utf-8")
    status = main(["power", "--n", "1319", "--discordance", "0.1", "--policy", str(bad)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.splitlines() == [
        f"ERROR {bad}: expected a number > 0 and < 0.5, got the number 0 in accuracy.alpha",
        f"ERROR {bad}: unknown multiplicity method 'None' in accuracy.multiplicity. Did you mean none?",
    ]


def test_unreadable_policy_files(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        policy_module.load(tmp_path / "nope.toml")
    assert str(caught.value) == f"{tmp_path / 'nope.toml'}: file is missing. Pass --policy or restore matrix/policy.toml"
    broken = tmp_path / "broken.toml"
    broken.write_text("[accuracy\nalpha = 1\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"broken.toml: invalid TOML: Expected ']' at the end of a table declaration"):
        policy_module.load(broken)


def test_a_kv_dtype_without_probe_thresholds_is_an_input_error(document: dict[str, Any]) -> None:
    doc = copy.deepcopy(document)
    del doc["probe"]["fp8_e5m2"]
    probe = policy_module.parse(doc, "custom/policy.toml").probe  # without a matrix nothing says it is needed
    with pytest.raises(InputError) as caught:
        probe.thresholds("fp8_e5m2", "sm90")
    assert str(caught.value) == ("custom/policy.toml: no probe thresholds for kv_cache_dtype 'fp8_e5m2' in probe. "
                                 "Add a [probe.fp8_e5m2] table")


def test_the_policy_states_the_questions_and_repeats_its_goals_need(matrix: matrix_module.Matrix) -> None:
    """accuracy.questions, sequential.max_questions and throughput.rounds are what kvgate.statistics.power computes for
    the policy's own goals (change a goal and this says which number to update)."""
    from kvgate.statistics import power, sequential

    policy = policy_module.load(matrix=matrix)
    acc, tput = policy.accuracy, policy.throughput
    needs = {margin: power.questions_needed(margin_points=margin, target_points=margin + acc.gap_points,
                                            flips=acc.design_flips, alpha=acc.alpha, power=acc.power)
             for margin in (acc.fp8_tax_points, acc.baseline_margin_points)}
    print(needs)
    assert acc.questions == max(needs.values())
    bounds = sequential.boundaries(acc.sequential.looks, alpha=acc.alpha, beta=1 - acc.power,
                                   rho=acc.sequential.beta_spending_rho)
    assert acc.sequential.max_questions == math.ceil(bounds.inflation * acc.questions)
    assert tput.rounds == power.rounds_needed(repeat_sd=tput.run_to_run_sd, tolerance=tput.tolerance, slowdown=0.10,
                                              alpha=tput.alpha, power=0.9)


def test_a_workload_floor_must_name_the_primary_filter(document: dict[str, Any], matrix: matrix_module.Matrix) -> None:
    doc = copy.deepcopy(document)
    doc["accuracy"]["primary_filter"] = "flexible-extract"
    doc["accuracy"]["filters"] = ["flexible-extract"]
    assert policy_module.parse(doc, matrix=matrix).accuracy.primary_filter == "flexible-extract"  # declared: fine
    workloads = dict(matrix.workloads)
    seed = workloads["deepseek-v2-lite"]
    workloads["deepseek-v2-lite"] = dataclasses.replace(seed, expected_accuracy=dataclasses.replace(
        seed.expected_accuracy, values={"strict-match": 0.671}))
    with pytest.raises(InputErrors) as caught:
        policy_module.parse(doc, "matrix/policy.toml", matrix=dataclasses.replace(matrix, workloads=workloads))
    assert [str(e) for e in caught.value.errors] == [
        "matrix/policy.toml: workload 'deepseek-v2-lite' declares no expected accuracy for the primary filter "
        "'flexible-extract' in accuracy.primary_filter. Add flexible-extract to "
        "workloads.deepseek-v2-lite.expected_accuracy"]
