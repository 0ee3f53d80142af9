"""FP8 cells that load k/v scales shipped with the checkpoint (matrix/workloads.toml fp8_kv_scales = "checkpoint").

The CPU default's FP8 cells run kvgate's tiny Llama as an FP8 checkpoint ships it (compressed-tensors
kv_cache_scheme, one k_scale and v_scale per layer), so vLLM's KV-scale loaders run; the auto cell runs the plain
model. The shipped scales are what the calibration gives; the variant is built from the same weights; the matrix
refuses what it cannot build; the engine's layers are read for the scales they used, and the gate's fp8_kv_cache
check fails a cell whose checkpoint scales never reached the layers. The real engine loading them: tests/test_run_engine.py.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from kvgate import InputErrors
from kvgate.gate import evaluation as gate
from kvgate.gate import policy as policy_module
from kvgate.matrix import cells as kvmatrix
from kvgate.results.parsers.contract import parse_status
from kvgate.results.records import KvCacheEvidence
from kvgate.results.run_loader import KnownNames, load_run
from kvgate.runners.engine.layers import layer_kv_cache_facts
from kvgate.workloads import kv_scales, tiny_models

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "src" / "kvgate" / "workloads" / "models" / "tiny-llama" / kv_scales.SCALES_FILE


@pytest.fixture(scope="module")
def real_matrix() -> kvmatrix.Matrix:
    return kvmatrix.load(ROOT / "matrix")


def test_the_cpu_defaults_fp8_cell_loads_the_checkpoint_scales_and_its_auto_cell_does_not(real_matrix):
    cells = {cell.id: cell for cell in real_matrix.cells}
    fp8, auto = cells["cpu_attn-fp8-cpu"], cells["cpu_attn-auto-cpu"]
    assert fp8.loads_checkpoint_kv_scales and not auto.loads_checkpoint_kv_scales
    assert fp8.as_record()["checkpoint_kv_scales"] is True and "checkpoint_kv_scales" not in auto.as_record()
    assert fp8.model == auto.model == "kvgate:tiny-llama"  # one identity: FP8 vs auto compares the same weights
    assert not any(cell.loads_checkpoint_kv_scales for cell in real_matrix.cells if cell.arch != "cpu")


def test_the_shipped_scales_are_the_calibrations(tmp_path):
    """Calibrated again from the shipped weights on the same training problems: the same figures (6 digits)."""
    shipped = json.loads(SHIPPED.read_text())
    assert shipped["kv_cache_scheme"] == kv_scales.KV_CACHE_SCHEME
    model = tiny_models.ensure_model("tiny-llama", tmp_path)
    again = kv_scales.calibrate(model, kv_scales.calibration_texts())
    assert again.keys() == shipped["scales"].keys() and len(again) == 12  # 6 layers, k and v
    for name, value in again.items():
        assert value == pytest.approx(shipped["scales"][name], rel=1e-4), name
        assert 0.005 < value < 0.05  # |K|, |V| of a few units, far below e4m3's 448: a scale of 1.0 wastes its range


def test_the_calibration_uses_training_problems_never_test_questions():
    from kvgate.workloads.gsm8k_local import load

    test = {row["question"] for row in load("test")}
    texts = kv_scales.calibration_texts()
    assert len(texts) == kv_scales.CALIBRATION_PROBLEMS
    assert not any(text.removeprefix("Question: ").split("\nAnswer: ")[0] in test for text in texts)


def test_the_variant_is_the_same_weights_with_the_scales_and_the_scheme(tmp_path):
    from safetensors import safe_open

    plain = tiny_models.ensure_model("tiny-llama", tmp_path)
    variant = tiny_models.ensure_model("tiny-llama", tmp_path, kv_scales=True)
    assert variant != plain and variant.name.startswith(plain.name + "-kv-scales-")
    assert (variant / "model.safetensors").read_bytes() == (plain / "model.safetensors").read_bytes()
    config = json.loads((variant / "config.json").read_text())
    assert config["quantization_config"] == kv_scales.QUANTIZATION_CONFIG
    assert "quantization_config" not in json.loads((plain / "config.json").read_text())
    with safe_open(str(variant / kv_scales.WEIGHTS_FILE), "pt") as tensors:
        stored = {name: tensors.get_tensor(name).item() for name in tensors.keys()}  # noqa: SIM118
    assert stored == pytest.approx(json.loads(SHIPPED.read_text())["scales"])
    assert json.loads((variant / tiny_models.MARKER).read_text())["kv_scales"] == pytest.approx(stored)
    assert tiny_models.ensure_model("tiny-llama", tmp_path, kv_scales=True) == variant  # built once


def test_a_model_without_shipped_scales_or_a_hub_model_cannot_have_them(tmp_path):
    with pytest.raises(Exception, match="ships no FP8 KV scales"):
        tiny_models.ensure_model("tiny-deepseek-v2", tmp_path, kv_scales=True)
    with pytest.raises(Exception, match="only for its own models"):
        tiny_models.resolve_model("meta-llama/Llama-3.1-8B-Instruct", kv_scales=True)
    assert tiny_models.resolve_model("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(("edit", "message"), [
    ('fp8_kv_scales = "yes"', "expected one of 'none', 'checkpoint', got the string 'yes' in "
                              "workloads.tiny-llama.fp8_kv_scales"),
    ('fp8_kv_scales = "checkpoint"\ncalculate_kv_scales = true',
     "the scales come from the checkpoint or from the data, not both in "
     "workloads.tiny-llama.fp8_kv_scales"),
])
def test_the_matrix_refuses_what_it_cannot_build(tmp_path, edit, message):
    for path in (ROOT / "matrix").glob("*.toml"):
        shutil.copy(path, tmp_path / path.name)
    workloads = tmp_path / "workloads.toml"
    workloads.write_text(workloads.read_text().replace('fp8_kv_scales = "checkpoint"', edit))
    with pytest.raises(InputErrors) as errors:
        kvmatrix.load(tmp_path)
    assert any(message in str(error) for error in errors.value.errors), [str(e) for e in errors.value.errors]


def test_a_hub_model_cannot_claim_kvgates_scales(tmp_path):
    for path in (ROOT / "matrix").glob("*.toml"):
        shutil.copy(path, tmp_path / path.name)
    workloads = tmp_path / "workloads.toml"
    text = workloads.read_text()
    marker = 'gsm8k = { add_bos_token = true }\ntimeouts = { accuracy = 8300'
    assert marker in text
    workloads.write_text(text.replace(marker, 'gsm8k = { add_bos_token = true }\nfp8_kv_scales = "checkpoint"\n'
                                              'timeouts = { accuracy = 8300', 1))
    with pytest.raises(InputErrors) as errors:
        kvmatrix.load(tmp_path)
    assert any("kvgate ships FP8 KV scales for its own models only" in str(e) for e in errors.value.errors)


class _Layer:
    """What vLLM's attention layer exposes to kvgate's reader (attn_backend, kv_cache_dtype, the float scales)."""

    def __init__(self, k: float, v: float):
        self.attn_backend, self.kv_cache_dtype, self.kv_cache = object(), "fp8", None
        self._k_scale_float, self._v_scale_float = k, v


class _Model:
    def __init__(self, layers):
        self.layers = layers

    def modules(self):
        return [object(), *self.layers]


def test_the_layer_reader_records_the_distinct_scales():
    facts = layer_kv_cache_facts(_Model([_Layer(0.0141656, 0.00901864), _Layer(0.02, 0.01), _Layer(0.02, 0.01)]))
    assert facts["k_scales"] == [0.0141656, 0.02] and facts["v_scales"] == [0.00901864, 0.01]
    assert layer_kv_cache_facts(_Model([_Layer(1.0, 1.0)]))["k_scales"] == [1.0]


@pytest.mark.parametrize(("value", "problem"), [
    ([0.0], "accuracy.kv_cache.k_scales[0]: expected a scale in (0, 1e+06], got number 0.0"),
    (["0.01"], "accuracy.kv_cache.k_scales[0]: expected a scale in (0, 1e+06], got string '0.01'"),
    ([True], "accuracy.kv_cache.k_scales[0]: expected a scale in (0, 1e+06], got boolean true"),
    (0.01, "accuracy.kv_cache.k_scales: expected a list, got number 0.01"),
    ([0.01] * 1025, "accuracy.kv_cache.k_scales: 1025 entries, more than 1024"),
])
def test_hostile_scales_are_named_by_the_reader(value, problem):
    status = parse_status(json.dumps({"accuracy": {"status": "ok", "kv_cache": {"k_scales": value}}}), "status.json")
    assert status["accuracy"].kv_cache == KvCacheEvidence(problem=problem)


def _cpu_pair(tmp_path: Path, matrix: kvmatrix.Matrix, *, fp8_scales: dict | None, declared: bool = True) -> Path:
    """A run of the two CPU_ATTN cells written as kvgate's runner writes them (contract 1.7), with the FP8 cell's
    recorded scales as given."""
    import synthetic_run

    run = tmp_path / "run"
    outcomes = {"strict-match": [True, False] * 120, "flexible-extract": [True, False] * 120}
    for dtype in ("auto", "fp8"):
        extra = {"contract_version": "1.7", "workload": "tiny-llama"}
        if dtype == "fp8":
            extra.update(calculate_kv_scales=False, checkpoint_kv_scales=declared)
        folder = synthetic_run.write_cell(run, backend="CPU_ATTN", kv_cache_dtype=dtype, arch="cpu",
                                          model="kvgate:tiny-llama", task="kvgate_gsm8k_local", extra=extra)
        synthetic_run.write_accuracy(folder, outcomes, task="kvgate_gsm8k_local", model="kvgate:tiny-llama")
        evidence = {"layers": 6, "layer_kv_cache_dtypes": [dtype], "tensor_dtypes": ["uint8" if dtype == "fp8" else
                                                                                     "bfloat16"],
                    "element_bytes": [1 if dtype == "fp8" else 2], "tokens": 349440 if dtype == "fp8" else 174720}
        if dtype == "fp8" and fp8_scales is not None:
            evidence.update(fp8_scales)
        synthetic_run.write_status(folder, {"accuracy": {"status": "ok", "kv_cache": evidence}})
    return run


def _fp8_kv_cache(run: Path, matrix: kvmatrix.Matrix) -> gate.Check:
    policy = policy_module.load(ROOT / "matrix" / "policy.toml", matrix=matrix)
    verdict = gate.evaluate(load_run(run, KnownNames.from_matrix(matrix)), policy=policy, today=dt.date(2026, 12, 2))
    (check,) = [c for c in verdict.checks if c.kind == "fp8_kv_cache"]
    return check


def test_checkpoint_scales_that_reached_the_layers_pass_with_their_range(tmp_path, real_matrix):
    check = _fp8_kv_cache(_cpu_pair(tmp_path, real_matrix, fp8_scales={"k_scales": [0.0141656, 0.0227456],
                                                                       "v_scales": [0.00901864, 0.0138687]}),
                          real_matrix)
    assert check.status == "pass", check.detail
    assert "k/v scales from the checkpoint (k 0.01417-0.02275, v 0.009019-0.01387)" in check.detail
    assert check.figures["k_scales"] == [0.0141656, 0.0227456]


@pytest.mark.parametrize(("scales", "said"), [
    ({"k_scales": [1.0], "v_scales": [1.0]}, "the checkpoint's k/v scales were not loaded: every layer wrote and "
                                             "read its FP8 cache with scale 1.0"),
    (None, "the cell was to load its checkpoint's k/v scales, but accuracy.kv_cache records no k_scales or "
           "v_scales"),
])
def test_checkpoint_scales_that_never_reached_the_layers_fail(tmp_path, real_matrix, scales, said):
    check = _fp8_kv_cache(_cpu_pair(tmp_path, real_matrix, fp8_scales=scales), real_matrix)
    assert check.status == "fail" and said in check.detail


def test_a_cell_that_loads_no_checkpoint_scales_is_not_asked_for_them(tmp_path, real_matrix):
    """The check itself, given a cell that loads none (what the trusted side holds cell.json to is
    tests/test_trusted_side.py's)."""
    check = _fp8_kv_cache(_cpu_pair(tmp_path, real_matrix, fp8_scales={"k_scales": [1.0], "v_scales": [1.0]},
                                    declared=False), real_matrix)
    assert check.status == "pass" and "scales" not in check.detail and check.figures["k_scales"] == [1.0]


def test_the_accuracy_stage_records_the_layers_scales_in_its_evidence():
    from kvgate.runners.stages.accuracy import kv_cache_evidence

    layers = {"layers": 6, "layer_kv_cache_dtypes": ["fp8"], "tensor_dtypes": ["uint8"], "element_bytes": [1],
              "k_scales": [0.0141656], "v_scales": [0.00901864], "unknown": 1}
    assert kv_cache_evidence(layers, [1000, 349440]) == {
        "layers": 6, "layer_kv_cache_dtypes": ["fp8"], "tensor_dtypes": ["uint8"], "element_bytes": [1],
        "k_scales": [0.0141656], "v_scales": [0.00901864], "tokens": 349440}
    assert "k_scales" not in kv_cache_evidence({**layers, "k_scales": [], "v_scales": []}, [])
