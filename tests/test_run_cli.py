"""`kvgate run` without an engine: bad input (one ERROR line, exit 2) and cells of another machine (skipped)."""

from __future__ import annotations

import json

import pytest

from kvgate.cli import main


@pytest.mark.parametrize(("argv", "error"), [
    (["run", "cell", "--run-dir", "x"],
     "ERROR kvgate run cell: no cell named. Pass --cell ID (see `kvgate matrix`)"),
    (["run", "accuracy", "--run-dir", "x", "--stages", "kernels"],
     "ERROR --stages: only `kvgate run cell` takes --stages. `kvgate run accuracy` runs the accuracy stage"),
    (["run", "cell", "--run-dir", "x", "--cell", "cpu_attn-auto-cpu", "--stages", "kernel"],
     "ERROR --stages: unknown stage 'kernel'. Did you mean kernels?"),
    (["run", "accuracy", "--run-dir", "x", "--arch-default", "sm91"],
     "ERROR --arch-default: unknown arch 'sm91'. Did you mean sm90?"),
    (["run", "accuracy", "--run-dir", "x", "--cell", "cpu_attn-fp9-cpu"],
     "ERROR --cell: unknown cell 'cpu_attn-fp9-cpu'. Did you mean cpu_attn-fp8-cpu?"),
    (["run", "throughput", "--run-dir", "x", "--timeout", "0"],
     "ERROR --timeout: expected a positive number of seconds, got 0"),
    (["run", "cell", "--run-dir", "x", "--cell", "cpu_attn-auto-cpu", "--limit", "5"],
     "ERROR kvgate run cell: unrecognized arguments: --limit 5. Pass-through flags go to one tool: use "
     "`kvgate run accuracy` (lm_eval) or `kvgate run throughput` (vllm bench throughput)"),
])
def test_bad_input_is_one_error_line_and_exit_2(argv, error, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == error
    assert not (tmp_path / "x").exists()


def test_cells_of_another_arch_are_skipped_with_the_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVGATE_ARCH", "cpu")
    assert main(["run", "throughput", "--run-dir", str(tmp_path / "run"), "--cell", "flashinfer_mla-fp8-sm100"]) == 0
    status = json.loads((tmp_path / "run" / "flashinfer_mla-fp8-sm100" / "status.json").read_text())
    reason = "cell flashinfer_mla-fp8-sm100 needs sm100; this machine is cpu (set KVGATE_ARCH to override)"
    assert status == {"throughput": {"status": "skipped", "reason": reason}}
    cell = json.loads((tmp_path / "run" / "flashinfer_mla-fp8-sm100" / "cell.json").read_text())
    assert (cell["backend"], cell["kv_cache_dtype"], cell["arch"], cell["task"]) == ("FLASHINFER_MLA", "fp8", "sm100", "gsm8k")
    assert "1 stage runs, 0 ok, 0 failed, 1 skipped" in capsys.readouterr().out
