"""One tool run as a subprocess: its own process group, output teed to the terminal and log files,
the whole group killed on timeout (an engine leaves worker processes behind that would otherwise hang on).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.runners.progress import Heartbeat

KILL_GRACE_SECONDS = 10.0
HEARTBEAT_POLL_SECONDS = 1.0  # how often a waiting run asks its heartbeat whether a line is due
TAIL_LINES = 40
_RUNNING: set[subprocess.Popen] = set()  # every run's process in this process, for stop_every_run
_RUNNING_LOCK = threading.Lock()


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessResult:
    returncode: int | None  # None: killed after its timeout
    timed_out: bool
    elapsed: float
    log_tail: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_logged(argv: Sequence[str], *, env: Mapping[str, str], logs: Sequence[Path], timeout: float | None,
               cwd: Path | None = None, echo: bool = True, header: str | None = None,
               heartbeat: Heartbeat | None = None) -> ProcessResult:
    """Run argv to the end or to its timeout; every byte it prints goes to each log (appended) and,
    with echo, to this process's stdout, so progress bars stay visible. A heartbeat reads the output too and says
    its line every so often while the process runs."""
    sinks = []
    for path in logs:
        path.parent.mkdir(parents=True, exist_ok=True)
        sinks.append(open(path, "ab"))  # noqa: SIM115  (closed below)
    try:
        if header:
            _write(sinks, echo, header.encode() + b"\n")
        start = time.monotonic()
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=dict(env), cwd=cwd, start_new_session=True)
        assert proc.stdout is not None
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        reader = threading.Thread(target=_pump, args=(proc.stdout.fileno(), sinks, echo, heartbeat), daemon=True)
        reader.start()
        timed_out = False
        try:
            timed_out = not _wait(proc, timeout, heartbeat)
        except BaseException:  # Ctrl-C: take the engine down with us
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc)  # also reaps stragglers of a finished run (engine core, compile workers)
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
        reader.join(timeout=KILL_GRACE_SECONDS)
        proc.stdout.close()
        elapsed = time.monotonic() - start
        if timed_out:
            _write(sinks, echo, f"\nkvgate: killed after its timeout of {timeout:.0f} s\n".encode())
    finally:
        for sink in sinks:
            sink.close()
    return ProcessResult(returncode=None if timed_out else proc.returncode, timed_out=timed_out,
                         elapsed=elapsed, log_tail=read_tail(logs[0]) if logs else "")


def heartbeat_for(what: str, *, echo: bool, questions: int | None = None, count_questions: bool = False,
                  alone: bool = False) -> Heartbeat | None:
    """A heartbeat that prints to this process's stdout, when the tool's output goes there too (echo); its line
    starts on a line of its own, since a progress bar's redraw ends with a carriage return, not a newline. alone:
    the tool's output stays in its log and the heartbeat's lines are all the terminal gets of it."""
    if not echo and not alone:
        return None
    before = "" if alone else "\n"
    return Heartbeat(what, questions=questions, count_questions=count_questions, clock=time.monotonic,
                     say=lambda line: _write([], True, f"{before}{line}\n".encode()))


def stop_every_run() -> None:
    """Take down the process group of every tool this process is running (Ctrl-C or SIGTERM reaches only the main
    thread; runs that other threads wait on end with their groups killed)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        _kill_group(proc)


def _wait(proc: subprocess.Popen, timeout: float | None, heartbeat: Heartbeat | None) -> bool:
    """Wait for the process to end (True) or for its timeout (False), beating the heartbeat meanwhile."""
    if heartbeat is None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return False
        try:
            proc.wait(timeout=HEARTBEAT_POLL_SECONDS if remaining is None else min(remaining, HEARTBEAT_POLL_SECONDS))
            return True
        except subprocess.TimeoutExpired:
            heartbeat.beat()


def _pump(fd: int, sinks: list, echo: bool, heartbeat: Heartbeat | None = None) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        _write(sinks, echo, chunk)
        if heartbeat is not None:
            heartbeat.feed(chunk)


def _write(sinks: list, echo: bool, data: bytes) -> None:
    for sink in sinks:
        sink.write(data)
        sink.flush()
    if echo:
        out = getattr(sys.stdout, "buffer", None)
        with contextlib.suppress(OSError, ValueError):
            if out is not None:
                out.write(data)
                out.flush()
            else:
                sys.stdout.write(data.decode("utf-8", "replace"))
                sys.stdout.flush()


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL what is left after a grace period."""
    pgid = proc.pid  # start_new_session: the child leads its own group
    if not _group_alive(pgid):
        proc.poll()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_SECONDS
    while time.monotonic() < deadline:
        proc.poll()
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_SECONDS)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def read_tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = 256 * 1024) -> str:
    """The last lines of a log, progress-bar redraws (\\r) and colour codes removed."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return ""
    text = _ANSI.sub(b"", data).decode("utf-8", "replace")
    kept = []
    for line in text.split("\n"):
        line = line.rstrip("\r").rsplit("\r", 1)[-1].rstrip()
        if line:
            kept.append(line)
    return "\n".join(kept[-lines:])


def describe_exit(returncode: int | None) -> str:
    """'exited with status 1', 'was killed by SIGKILL (out of memory?)'."""
    if returncode is None:
        return "was killed at its timeout"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {returncode}"
