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
    """An executable that fails its first `fails` starts printing the real log `log` of the H200 run."""
    folder = tmp_path / "engine"
    folder.mkdir()
    with tarfile.open(FIXTURES / "h200_run" / "run.tar.xz") as archive:
        member = archive.extractfile(f"run/{log}")
        assert member is not None
        (folder / "failed-start.log").write_bytes(member.read())
    (folder / "fails").write_text(str(fails))
    script = folder / "python"
    script.write_text(ENGINE.format(python=sys.executable))
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
    assert [(o.stage, o.status) for o in outcomes] == [("accuracy", "error"), ("probe", "error")]
    assert entries["accuracy"]["reason"].startswith(
        "infrastructure: the engine failed to start twice on this machine, not because of the change (vLLM's "
        "memory profiling saw another process free GPU memory")
    assert [retry["run"] for retry in entries["accuracy"]["infra_retries"]] == ["engine start"]


@pytest.mark.parametrize("stage", ["accuracy", "throughput"])
def test_an_engine_that_failed_on_the_cells_own_code_starts_only_once(tmp_path, stage):
    """The e5m2 cell's engine refused its KV cache dtype (a real H200 log): the cell's own failure, no second start."""
    python = engine(tmp_path, fails=1, log="triton_attn-fp8_e5m2-sm90/logs/accuracy.log")
    ctx = context(tmp_path, python)

    if stage == "accuracy":
        run_accuracy(ctx, with_probe=False)
    else:
        run_throughput(ctx)

    entry = status(ctx)[stage]
    print(entry["reason"])
    assert starts(python) == 1
    assert entry["status"] == "error" and "infra_retries" not in entry
    assert 'AssertionError: assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}' in entry["reason"]
