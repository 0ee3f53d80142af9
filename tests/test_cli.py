"""The `kvgate` command as a user meets it first: its help, and a run outside a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvgate.cli import main

SRC = Path(__file__).resolve().parents[1] / "src"


def test_help_tells_a_user_what_kvgate_does_not_how_it_is_built(capsys):
    try:
        main(["--help"])
    except SystemExit as done:
        assert done.code == 0
    text = capsys.readouterr().out
    assert "Does FP8 KV cache still work on every vLLM attention backend and GPU it claims?" in text
    assert "kvgate gate reports/runs/x [--baseline DIR]" in text
    assert "only place" not in text  # a developer's note about the code, not for users


def test_outside_a_checkout_kvgate_uses_the_matrix_it_ships(tmp_path):
    """A copy of the package as pip installs it (the link kvgate/matrix/defaults -> matrix/ copied as files), run
    in an empty folder: the default matrix and policy are package data."""
    installed = tmp_path / "site"
    installed.mkdir()
    subprocess.run(["cp", "-r", "--dereference", str(SRC / "kvgate"), str(installed)], check=True)
    assert sorted(p.name for p in (installed / "kvgate" / "matrix" / "defaults").glob("*.toml")) == sorted(
        p.name for p in (SRC.parent / "matrix").glob("*.toml"))
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KVGATE_MATRIX_DIR"}
    env["PYTHONPATH"] = str(installed)
    done = subprocess.run([sys.executable, "-m", "kvgate", "matrix", "--format", "ids"], cwd=work, env=env,
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert "cpu_attn-fp8-cpu" in done.stdout.split()


def test_outside_a_checkout_the_missing_matrix_is_one_line_with_the_way_out(tmp_path):
    """A copy of the package without the matrix it ships, run in an empty folder: one hint, exit 2, no traceback."""
    installed = tmp_path / "site"
    installed.mkdir()
    subprocess.run(["cp", "-r", str(SRC / "kvgate"), str(installed)], check=True)
    (installed / "kvgate" / "matrix" / "defaults").unlink()
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KVGATE_MATRIX_DIR"}
    env["PYTHONPATH"] = str(installed)
    done = subprocess.run([sys.executable, "-m", "kvgate", "gate", "some-run"], cwd=work, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR ") and lines[0].endswith(
        "no kvgate matrix here (it holds axes.toml, backends.toml, exclusions.toml, waivers.toml, "
        "workloads.toml). kvgate looks in --matrix-dir, then $KVGATE_MATRIX_DIR, then the checkout it runs from, "
        "then the copy it ships (never the current directory): pass --matrix-dir DIR or set KVGATE_MATRIX_DIR to a "
        "kvgate checkout's matrix/ folder")
    # a matrix (and policy) in the folder a command runs in is never read: a results folder or a PR's checkout
    # cannot bring its own rules
    subprocess.run(["cp", "-r", str(SRC.parent / "matrix"), str(work / "matrix")], check=True)
    again = subprocess.run([sys.executable, "-m", "kvgate", "gate", "some-run"], cwd=work, env=env,
                           capture_output=True, text=True, check=False)
    assert (again.returncode, again.stderr) == (2, done.stderr)


def test_a_reader_that_goes_away_ends_kvgate_quietly():
    """`kvgate matrix | head -3`: the pipe's reader closes it before kvgate writes; kvgate stops as a command a closed
    pipe stops does (141 = 128 + SIGPIPE), with no traceback."""
    with subprocess.Popen([sys.executable, "-m", "kvgate", "matrix"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as process:
        process.stdout.close()  # the reader is gone before the table is written
        stderr = process.stderr.read().decode()
        assert (process.wait(timeout=120), stderr) == (141, "")


def kvgate_process(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """kvgate in a process of its own, so that a hang is a failed test, not a hung suite."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    try:
        return subprocess.run([sys.executable, "-m", "kvgate", *argv], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"kvgate {' '.join(argv)} hung (killed after {timeout:g} s)") from None


def test_a_policy_that_is_a_fifo_or_a_device_is_refused_unread(tmp_path):
    """--policy naming a FIFO blocked kvgate for ever, and /dev/zero read without end; now one line, exit 2."""
    fifo = tmp_path / "policy.toml"
    os.mkfifo(fifo)
    done = kvgate_process("power", "--policy", str(fifo), timeout=20)
    assert (done.returncode, done.stderr) == (2, f"ERROR {fifo}: not a regular file (a FIFO, socket or device). "
                                                 "Name the TOML file itself\n")
    done = kvgate_process("power", "--policy", "/dev/zero", timeout=20)
    assert (done.returncode, done.stderr) == (2, "ERROR /dev/zero: not a regular file (a FIFO, socket or device). "
                                                 "Name the TOML file itself\n")


def test_expected_cells_that_are_a_fifo_or_a_device_are_refused_unread(tmp_path):
    """`gate --expect-cells FIFO` blocked the gate for ever and /dev/zero was read without end; now one line, exit 2."""
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    for given, kind in ((fifo, "a FIFO, socket or device"), ("/dev/zero", "a FIFO, socket or device")):
        done = kvgate_process("gate", str(tmp_path / "run"), "--expect-cells", str(given), timeout=20)
        assert (done.returncode, done.stderr) == (2, f"ERROR {given}: not a regular file ({kind}), given as "
                                                     "--expect-cells. Pass the plan's matrix JSON or a list of cell "
                                                     "ids, saved to a file\n")


def test_a_log_url_file_that_is_a_fifo_or_a_device_is_refused_unread(tmp_path):
    """`gate --log-url @FIFO` blocked the gate for ever and @/dev/zero was read without end; now one line, exit 2."""
    from synthetic_run import write_seed_run

    run = write_seed_run(tmp_path / "run")
    fifo = tmp_path / "log-urls.json"
    os.mkfifo(fifo)
    for given in (fifo, "/dev/zero"):
        done = kvgate_process("gate", str(run), "--today", "2026-11-30", "--log-url", f"@{given}", timeout=30)
        assert "Traceback" not in done.stderr
        assert (done.returncode, done.stderr.splitlines()[-1]) == (
            2, f"ERROR {given}: not a regular file (a FIFO, socket or device), given as --log-url @FILE. Pass "
               "--log-url @FILE of a JSON object of cell id -> template")
