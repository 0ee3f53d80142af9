"""CPU accuracy engines side by side (kvgate.runners.side_by_side): which runs may, the cores each engine gets, and
the order: a cell-side starts only after what it is compared with has answered, the others at once."""

from __future__ import annotations

import threading
import time

import pytest

from kvgate.runners.side_by_side import core_groups, run_side_by_side, why_one_at_a_time


@pytest.mark.parametrize(("allowed", "jobs", "groups"), [
    ({0, 1}, 2, ["0", "1"]),
    ({0, 1}, 1, ["0,1"]),
    ({0}, 2, ["0"]),
    ({3, 5, 7}, 2, ["3", "5,7"]),
    (set(range(16)), 2, ["0,1,2,3,4,5,6,7", "8,9,10,11,12,13,14,15"]),
])
def test_the_cores_are_split_into_one_group_per_engine(allowed, jobs, groups):
    assert core_groups(allowed, jobs) == groups


def test_only_cpu_accuracy_runs_on_a_host_of_several_cores_go_side_by_side():
    ok = dict(jobs=2, archs={"cpu"}, stages=["accuracy"], environ={}, allowed={0, 1})
    assert why_one_at_a_time(**ok) is None
    assert why_one_at_a_time(**{**ok, "jobs": 1}) == ""
    assert "GPU" in why_one_at_a_time(**{**ok, "archs": {"cpu", "sm90"}})
    assert "throughput and kernel stages run alone" in why_one_at_a_time(**{**ok, "stages": ["accuracy", "throughput"]})
    assert "throughput and kernel stages run alone" in why_one_at_a_time(**{**ok, "stages": ["kernels"]})
    assert why_one_at_a_time(**{**ok, "environ": {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}}) == (
        "VLLM_CPU_OMP_THREADS_BIND is set, so the engines keep the cores it names, one at a time")
    assert why_one_at_a_time(**{**ok, "allowed": {3}}) == "this host lends one core, so the engines start one at a time"


def test_a_unit_waits_for_what_it_is_compared_with_and_the_others_run_together():
    """base ∥ base-fp8 run together (each waits on a barrier only the other can open); head waits for base; each
    running unit has cores of its own."""
    barrier = threading.Barrier(2, timeout=10)
    events: list[tuple[str, str]] = []
    cores_in_use: dict[str, str] = {}
    lock = threading.Lock()

    def run(unit: str, cores: str) -> str:
        with lock:
            assert cores not in cores_in_use.values(), f"{unit} got cores {cores} that another unit holds"
            cores_in_use[unit] = cores
        if unit in ("auto/base", "fp8/base"):
            barrier.wait()  # a BrokenBarrierError here: they did not run at once
        time.sleep(0.05)
        with lock:
            del cores_in_use[unit]
        return f"{unit} on {cores}"

    finished: dict[str, str] = {}
    run_side_by_side(["auto/base", "fp8/base", "auto/head", "fp8/head"], key=lambda u: u,
                     after={"auto/head": {"auto/base"},
                            "fp8/head": {"fp8/base", "auto/head"}},
                     cores=["0", "1"], run=run, started=lambda u: events.append(("start", u)),
                     finished=lambda u, r: (events.append(("end", u)), finished.__setitem__(u, r)),
                     interrupted=lambda running: pytest.fail(f"interrupted {running}"))
    assert set(finished) == {"auto/base", "fp8/base", "auto/head", "fp8/head"}
    assert events.index(("end", "auto/base")) < events.index(("start", "auto/head"))
    assert events.index(("end", "auto/head")) < events.index(("start", "fp8/head"))
    assert events.index(("end", "fp8/base")) < events.index(("start", "fp8/head"))
    assert events[:2] == [("start", "auto/base"), ("start", "fp8/base")]


def test_a_dependency_outside_the_run_does_not_hold_a_unit_back():
    """An FP8 cell whose auto cell another invocation runs: it starts (and answers all its questions: looks_plan)."""
    order = []
    run_side_by_side(["fp8"], key=lambda u: u, after={"fp8": {"auto (not in this run)"}}, cores=["0", "1"],
                     run=lambda u, c: order.append(u), started=lambda u: None, finished=lambda u, r: None,
                     interrupted=lambda running: None)
    assert order == ["fp8"]


def test_an_interruption_stops_the_running_units_and_goes_on():
    """Ctrl-C or SIGTERM reaches the main thread only: the units still running are handed to `interrupted`, which
    stops them; their threads are waited for; the KeyboardInterrupt is raised again."""
    release = threading.Event()
    stopped = []

    def run(unit: str, cores: str) -> str:
        if unit == "a":
            time.sleep(0.05)
            raise KeyboardInterrupt("signal 15")
        assert release.wait(10), "never released"
        return unit

    def interrupted(running):
        stopped.extend(running)
        release.set()

    with pytest.raises(KeyboardInterrupt):
        run_side_by_side(["a", "b", "c"], key=lambda u: u, after={}, cores=["0", "1"], run=run,
                         started=lambda u: None, finished=lambda u, r: None, interrupted=interrupted)
    assert stopped == ["b"]  # c never started


def test_the_run_command_refuses_a_bad_jobs_count(tmp_path, capsys):
    from kvgate.cli import main

    assert main(["run", "accuracy", "--run-dir", str(tmp_path / "run"), "--jobs", "0"]) == 2
    assert "--jobs: expected engines side by side from 1 to 64, got 0" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
