"""Run the kernel tests of selected cells, one pytest process per cell, into the results folder.

For each cell: ``<run dir>/<cell id>/cell.json``; then either
- the cell has no kernel family here (kvgate.kernels.families) or needs another arch: status
  ``skipped`` with the reason, and a ``kernels/junit.xml`` holding one skipped test case that says why
  (so a reader of the JUnit sees a skip, not a gap); or
- ``python -m pytest tests/kernels --kvgate-cell ID --junitxml kernels/junit.xml -o junit_family=xunit1``
  (figures as JUnit properties), its log in ``logs/kernels.log``, its speed entries merged into
  ``kernels/timings.json`` (kvgate.kernels.timings). Status: ``ok`` when every selected test passed or
  skipped and at least one ran; ``error`` on any failure, a crash, no JUnit, no test selected, or no test run
  (all skipped: the reasons joined, e.g. a kernel library that does not import); ``timeout`` past ``timeout_s``.

Stdlib only (torch loads in the pytest process, which pins its GPU per xdist worker: kvgate.kernels.gpus).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from kvgate.kernels import timings as timings_file
from kvgate.kernels.families import kernels_for_cell
from kvgate.matrix.cells import Cell
from kvgate.results import cell_folder

STAGE = "kernels"
DEFAULT_TIMEOUT_S = 3600
REPO_ROOT = Path(__file__).resolve().parents[3]
TESTS_DIR = REPO_ROOT / "tests" / "kernels"


@dataclass(frozen=True, kw_only=True, slots=True)
class JUnitCounts:
    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0
    skip_reasons: tuple[str, ...] = ()
    failed_names: tuple[str, ...] = ()

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped


@dataclass(frozen=True, kw_only=True, slots=True)
class CellOutcome:
    cell_id: str
    status: str  # ok | error | timeout | skipped
    reason: str | None = None
    counts: JUnitCounts = field(default_factory=JUnitCounts)
    seconds: float = 0.0


def read_junit(path: Path) -> JUnitCounts:
    """Counts from a pytest JUnit file (raises ValueError when unreadable)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as error:
        raise ValueError(f"{path}: unreadable JUnit ({error})") from None
    tests = failures = errors = skipped = 0
    reasons: list[str] = []
    failed: list[str] = []
    for case in root.iter("testcase"):
        tests += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            failures += 1
            failed.append(name)
        elif case.find("error") is not None:
            errors += 1
            failed.append(name)
        elif (skip := case.find("skipped")) is not None:
            skipped += 1
            reason = (skip.get("message") or "").strip()
            if reason and reason not in reasons:
                reasons.append(reason)
    return JUnitCounts(tests=tests, failures=failures, errors=errors, skipped=skipped,
                       skip_reasons=tuple(reasons), failed_names=tuple(failed))


def timings_document(fragments: Path, cell_id: str | None) -> dict | None:
    """timings.json's content from the tests' fragment folder; None when no speed test wrote one."""
    entries = timings_file.merge_fragments(fragments) if Path(fragments).is_dir() else []
    if not entries:
        return None
    device = timings_file.read_device_fragment(fragments)
    return timings_file.document(entries, cell_id=cell_id, device=device.get("device", {}),
                                 method=device.get("method", {}))


def skipped_junit(cell_id: str, reason: str) -> str:
    return ('<?xml version="1.0" encoding="utf-8"?>\n'
            f'<testsuites><testsuite name="kvgate-kernels" tests="1" skipped="1" failures="0" errors="0">'
            f'<testcase classname="kvgate.kernels" name={quoteattr(cell_id)}>'
            f'<skipped type="pytest.skip" message={quoteattr(reason)}>{escape(reason)}</skipped>'
            '</testcase></testsuite></testsuites>\n')


def pytest_argv(cell_id: str, out_dir: Path, *, workers: int, python: str, extra: Sequence[str],
                basetemp: Path | None = None) -> list[str]:
    """`basetemp`: pytest's temporary folder of this run's own (its default, /tmp/pytest-of-<user>, is shared with
    every pytest run on the host, and the xdist controller deletes old runs' folders there as it ends; a tree left
    there that Python cannot delete turned a cell's passing tests into pytest's exit 1). `extra` comes last and wins."""
    argv = [python, "-m", "pytest", str(TESTS_DIR), "--kvgate-cell", cell_id,
            "--junitxml", str(out_dir / "junit.xml"), "-o", "junit_family=xunit1",
            "--kvgate-timings-dir", str(out_dir / ".timings"), "-p", "no:cacheprovider",
            # pytest-benchmark (in the CUDA images) warns when xdist is active, and kvgate's warnings-as-errors
            # turns that into an INTERNALERROR before any test runs; kvgate's speed tests do not use it.
            "-p", "no:benchmark", "-q", "-rs"]
    if basetemp is not None:
        argv += ["--basetemp", str(basetemp)]
    if workers > 0:
        argv += ["-n", str(workers)]
    return [*argv, *extra]


def run_cell(cell: Cell, run_dir: Path, *, local_arch: str, workers: int = 0, pytest_args: Sequence[str] = (),
             python: str = sys.executable, timeout_s: float = DEFAULT_TIMEOUT_S, side: str | None = None,
             env: Mapping[str, str] | None = None) -> CellOutcome:
    """The kernels stage of one cell; never raises for a failing or crashing test run.

    `side` names the side of an A/B run (its folder is then kvgate's for that side); `env` is the environment
    the tests run in (default this process's), e.g. with a vLLM overlay first on PYTHONPATH."""
    record = cell.as_record() if side is None else {**cell.as_record(), "side": side}
    cell_dir = cell_folder.prepare_cell(run_dir, record)
    plan = kernels_for_cell(cell.backend, cell.kv_cache_dtype, cell.arch, cell.mla)
    reason = plan.skip_reason
    if reason is None and cell.arch != local_arch:
        reason = f"cell {cell.id} needs {cell.arch}; this machine is {local_arch}"
    if reason is not None:
        with cell_folder.stage_output(cell_dir, STAGE) as out:
            (out / "junit.xml").write_text(skipped_junit(cell.id, reason), encoding="utf-8")
        cell_folder.write_status(cell_dir, STAGE, "skipped", reason=reason)
        return CellOutcome(cell_id=cell.id, status="skipped", reason=reason)

    started = time.monotonic()
    log = cell_folder.log_path(cell_dir, STAGE)
    with cell_folder.stage_output(cell_dir, STAGE) as out, \
            tempfile.TemporaryDirectory(prefix="kvgate-kernels-", ignore_cleanup_errors=True) as scratch:
        argv = pytest_argv(cell.id, out, workers=workers, python=python, extra=pytest_args,
                           basetemp=Path(scratch) / "pytest")
        env = dict(os.environ if env is None else env)
        src = str(REPO_ROOT / "src")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        timed_out = False
        with open(log, "a", encoding="utf-8") as handle:  # `kvgate run cell` may be writing our stdout here too
            handle.write("$ " + " ".join(argv) + "\n")
            handle.flush()
            try:
                returncode = subprocess.run(argv, cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                            timeout=timeout_s, check=False).returncode
            except subprocess.TimeoutExpired:
                timed_out, returncode = True, -1
        document = timings_document(out / ".timings", cell.id)
        if document is not None:
            cell_folder.write_json_atomic(out / "timings.json", document)
        _remove_tree(out / ".timings")
        junit = out / "junit.xml"
        counts = None
        problem = None
        if junit.exists():
            try:
                counts = read_junit(junit)
            except ValueError as error:
                problem = str(error)
    seconds = time.monotonic() - started
    log_tail = cell_folder.tail(log.read_text(encoding="utf-8", errors="replace"))
    status, reason = _judge(returncode, timed_out, counts, problem, timeout_s)
    cell_folder.write_status(cell_dir, STAGE, status, reason=reason,
                             log_tail=log_tail if status in ("error", "timeout") else None,
                             elapsed_s=round(seconds, 1), **_count_fields(counts))
    return CellOutcome(cell_id=cell.id, status=status, reason=reason, counts=counts or JUnitCounts(),
                       seconds=seconds)


def refuse_cell(cell: Cell, run_dir: Path, reason: str, *, side: str | None = None) -> CellOutcome:
    """A cell this host must not run (CI sent it to the wrong runner): its kernels stage is an error with the
    reason, and no test runs."""
    record = cell.as_record() if side is None else {**cell.as_record(), "side": side}
    cell_dir = cell_folder.prepare_cell(run_dir, record)
    cell_folder.write_status(cell_dir, STAGE, "error", reason=reason)
    return CellOutcome(cell_id=cell.id, status="error", reason=reason)


def _judge(returncode: int, timed_out: bool, counts: JUnitCounts | None, problem: str | None,
           timeout_s: float) -> tuple[str, str | None]:
    if timed_out:
        return "timeout", f"kernel tests ran past {timeout_s:.0f} s"
    if problem:
        return "error", problem
    if counts is None:
        return "error", f"pytest exited {returncode} without writing junit.xml"
    if counts.tests == 0 or returncode == 5:
        return "error", "no kernel test was selected for this cell (kvgate's family table and tests disagree)"
    if counts.failures or counts.errors or returncode != 0:
        names = ", ".join(counts.failed_names[:3]) + (" ..." if len(counts.failed_names) > 3 else "")
        return "error", (f"{counts.failures} failed, {counts.errors} errors of {counts.tests} kernel tests"
                         + (f": {names}" if names else f" (pytest exit status {returncode})"))
    if counts.passed == 0:  # a planned kernels stage that tested nothing proves nothing: an error, never a skip
        return "error", (f"no kernel test ran: all {counts.tests} skipped ("
                         + ("; ".join(counts.skip_reasons) or "no reason given") + ")")
    return "ok", None


def _count_fields(counts: JUnitCounts | None) -> dict[str, int]:
    if counts is None:
        return {}
    return {"tests": counts.tests, "passed": counts.passed, "failed": counts.failures + counts.errors,
            "skipped": counts.skipped}


def _remove_tree(path: Path) -> None:
    if path.is_dir():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
