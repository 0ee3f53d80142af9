"""kvgate.runners.stages.tool_process: output teed to the log, the whole process group killed on timeout."""

from __future__ import annotations

import os
import sys
import time

from kvgate.runners.stages.tool_process import describe_exit, read_tail, run_logged

ENV = dict(os.environ)


def test_output_reaches_every_log_and_the_exit_status_is_kept(tmp_path):
    logs = [tmp_path / "stage.log", tmp_path / "repeat-1.log"]
    result = run_logged([sys.executable, "-c", "import sys; print('hello'); sys.exit(3)"], env=ENV, logs=logs,
                        timeout=60, echo=False, header="kvgate: header")
    assert (result.returncode, result.timed_out, result.ok) == (3, False, False)
    for log in logs:
        assert log.read_text() == "kvgate: header\nhello\n"
    assert result.log_tail == "kvgate: header\nhello"


def test_timeout_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    # A child that starts a grandchild (like vLLM's engine core) and then hangs.
    script = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(300)\n"
    )
    start = time.monotonic()
    result = run_logged([sys.executable, "-c", script], env=ENV, logs=[tmp_path / "log"], timeout=3, echo=False)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < 30
    grandchild = int(pid_file.read_text())
    assert not _alive(grandchild), "the grandchild outlived the timeout"
    assert "killed after its timeout of 3 s" in (tmp_path / "log").read_text()


def test_read_tail_keeps_the_last_state_of_progress_bars(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"a\nbar  10%\rbar  50%\rbar 100%\n\x1b[32mgreen\x1b[0m\n")
    assert read_tail(log) == "a\nbar 100%\ngreen"


def test_describe_exit():
    assert describe_exit(1) == "exited with status 1"
    assert describe_exit(-9) == "was killed by SIGKILL (out of memory?)"
    assert describe_exit(None) == "was killed at its timeout"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0): read its state
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False


def test_engine_starts_take_turns_through_the_lock(tmp_path, monkeypatch):
    """KVGATE_ENGINE_START_LOCK: a second engine start waits until the first one is up (two processes here, so the
    flock is the real one), and nothing is held when it is unset."""
    import subprocess
    import sys
    import time

    from kvgate.runners.stages import eval_process

    lock = tmp_path / "start.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        f"h = open({str(lock)!r}, 'a+'); fcntl.flock(h, fcntl.LOCK_EX); print('held', flush=True); time.sleep(1.5)")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    monkeypatch.setenv(eval_process.ENGINE_START_LOCK_ENV, str(lock))
    began = time.monotonic()
    with eval_process.engine_start_lock():
        waited = time.monotonic() - began
    holder.wait(timeout=10)
    holder.stdout.close()
    assert waited >= 1.0
    monkeypatch.delenv(eval_process.ENGINE_START_LOCK_ENV)
    began = time.monotonic()
    with eval_process.engine_start_lock():
        assert time.monotonic() - began < 0.5


def test_an_engine_ends_holding_the_start_lock(tmp_path, monkeypatch):
    """An engine that ends frees its memory, which breaks another engine's start that is measuring memory: with
    KVGATE_ENGINE_START_LOCK set, the engine core's shutdown runs while the lock is held (a second process cannot take
    it meanwhile); unset, nothing is stopped here (the process's exit does it)."""
    import fcntl
    import subprocess
    import sys
    from types import SimpleNamespace

    from kvgate.runners.stages import eval_process

    lock = tmp_path / "start.lock"
    seen: list[str] = []

    def shutdown():  # what vLLM's engine core client does, observed from another process
        probe = subprocess.run([sys.executable, "-c", (
            "import fcntl, sys\n"
            f"h = open({str(lock)!r}, 'a+')\n"
            "try:\n    fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(3)")])
        seen.append("held" if probe.returncode == 3 else f"free ({probe.returncode})")

    engine = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(shutdown=shutdown)))
    monkeypatch.delenv(eval_process.ENGINE_START_LOCK_ENV, raising=False)
    eval_process.stop_engine(engine)
    assert seen == []
    monkeypatch.setenv(eval_process.ENGINE_START_LOCK_ENV, str(lock))
    eval_process.stop_engine(engine)
    assert seen == ["held"]
    with open(lock, "a+") as handle:  # and it is free again afterwards
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    eval_process.stop_engine(SimpleNamespace())  # an engine without the client: nothing to call
    assert seen == ["held"]


def test_a_heartbeat_reads_the_output_and_beats_while_the_process_runs(tmp_path):
    """A process drawing lm-eval's and vLLM's bars (as the accuracy stage's worker does), then pausing: the heartbeat
    says how far it got while it waits, and a timeout still ends it on time."""
    from kvgate.runners.progress import Heartbeat

    script = (
        "import sys, time\n"
        "w = sys.stdout.write\n"
        "w('\\rRunning generate_until requests:   0%|          | 0/8 [00:00<?, ?it/s]\\n')\n"
        "w('\\rProcessed prompts:  38%|###8      | 3/8 [00:01<00:02]'); sys.stdout.flush()\n"
        "time.sleep(30)\n"
    )
    said = []
    heartbeat = Heartbeat("c accuracy", every=0.5, questions=8, count_questions=True, clock=time.monotonic,
                          say=said.append)
    start = time.monotonic()
    result = run_logged([sys.executable, "-c", script], env=ENV, logs=[tmp_path / "log"], timeout=4, echo=False,
                        heartbeat=heartbeat)
    assert result.timed_out and time.monotonic() - start < 30
    print(said)
    assert len(said) >= 2  # a line every poll (1 s) once half a second has passed, for about 4 s
    assert all(line.startswith("kvgate: c accuracy: ") for line in said)
    assert said[-1].startswith("kvgate: c accuracy: 3/8 questions, ") and ", ETA " in said[-1]
