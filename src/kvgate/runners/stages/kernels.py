"""The kernels stage of one cell, delegated to `python -m kvgate kernels --cell ID --run-dir DIR`
(exit 0 ok, 1 failed; it writes the cell's kernels/ and its status.json entry itself). This module only
runs it in a subprocess with the stage timeout and fills status.json where that command could not.
"""

from __future__ import annotations

import importlib.util
import json
import time

from kvgate.results import cell_folder
from kvgate.runners.context import CellContext
from kvgate.runners.outcome import StageOutcome
from kvgate.runners.stages.output_files import fresh_log
from kvgate.runners.stages.tool_process import describe_exit, run_logged

KERNELS_COMMAND_MODULE = "kvgate.cli.kernels_command"
OWN_TIMEOUT_MARGIN_SECONDS = 120.0


def kernels_available() -> bool:
    try:
        return importlib.util.find_spec(KERNELS_COMMAND_MODULE) is not None
    except ModuleNotFoundError:
        return False


def run_kernels(ctx: CellContext) -> StageOutcome:
    cell, cell_dir = ctx.cell, ctx.cell_dir
    start = time.monotonic()
    if not kernels_available():
        reason = "kernels stage not available (no `kvgate kernels` command in this kvgate)"
        cell_folder.write_status(cell_dir, "kernels", "error", reason)
        return StageOutcome(cell_id=ctx.label, stage="kernels", status="error", reason=reason)
    log = fresh_log(cell_dir, "kernels")
    argv = [ctx.python, "-m", "kvgate", "kernels", "--cell", cell.id, "--run-dir", str(ctx.run_dir)]
    if ctx.side is not None:  # an A/B run: the side's folder; its vLLM comes with ctx.env (PYTHONPATH)
        argv += ["--side", ctx.side]
    if ctx.matrix_dir is not None:
        argv += ["--matrix-dir", str(ctx.matrix_dir)]
    if ctx.timeout is not None:  # its own timeout first, so that it can record it itself
        argv += ["--timeout", f"{ctx.timeout:g}"]
    timeout = None if ctx.timeout is None else ctx.timeout + OWN_TIMEOUT_MARGIN_SECONDS
    result = run_logged(argv, env=ctx.env, logs=[log], timeout=timeout, echo=ctx.echo,
                        header=f"kvgate: {cell.id} kernels: {' '.join(argv[1:])}")
    elapsed = time.monotonic() - start
    entry = _status_entry(cell_dir)
    if result.timed_out:
        status, reason = "timeout", f"killed after its timeout of {ctx.timeout:.0f} s"
    elif result.returncode == 0:
        status, reason = entry.get("status"), entry.get("reason")
        if status not in ("ok", "skipped"):  # e.g. GPU kernel tests on a CPU machine are skipped
            status, reason = "error", "`kvgate kernels` exited 0 but status.json says neither ok nor skipped"
    elif result.returncode == 1:
        status = entry.get("status", "error") if entry.get("status") != "ok" else "error"
        reason = entry.get("reason") or "kernel tests failed"
    else:
        status, reason = "error", f"`kvgate kernels` {describe_exit(result.returncode)}"
    if status != entry.get("status") or (status not in ("ok", "skipped") and not entry.get("reason")):
        cell_folder.write_status(cell_dir, "kernels", status, reason, result.log_tail)
    return StageOutcome(cell_id=ctx.label, stage="kernels", status=status, elapsed=elapsed, reason=reason,
                        headline={"ok": "kernel tests passed", "skipped": reason or "skipped"}.get(status, ""))


def _status_entry(cell_dir) -> dict:
    try:
        data = json.loads((cell_dir / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entry = data.get("kernels") if isinstance(data, dict) else None
    return entry if isinstance(entry, dict) else {}
