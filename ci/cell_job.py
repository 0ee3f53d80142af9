"""The cells job: run one planned cell's nox sessions into $KVGATE_RUN_DIR, then check it wrote its folder.

    KVGATE_CELL=flashinfer_mla-fp8-sm100 KVGATE_SESSIONS='["cell(flashinfer_mla-fp8-sm100)"]' \
    KVGATE_RUN_DIR=/tmp/run python ci/cell_job.py

Kernel tests on a runner with several GPUs: $KVGATE_KERNEL_WORKERS (read by `kvgate kernels`, one pytest-xdist
worker per GPU) is, in order: the repository variable (passed as $KVGATE_KERNEL_WORKERS_OVERRIDE), the
runner's own environment (its .env file), else the number of GPUs nvidia-smi lists when there are several.

A/B against a vLLM change (kvgate-vllm.yml): with $KVGATE_VLLM_HEAD and $KVGATE_VLLM_BASE (the two git checkouts of
the vLLM pull request) every session runs `-- --vllm SPEC --base-vllm SPEC`, each side's SPEC being, in order:
`wheel:$KVGATE_VLLM_HEAD_WHEEL` / `wheel:$KVGATE_VLLM_BASE_WHEEL` (vLLM's per-commit wheel of that side, which the
workflow downloads where vLLM published one: the side's own compiled kernels), else `source:CHECKOUT@REV`, REV being
$KVGATE_VLLM_OVERLAY_BASE (the commit the side's Python changes are counted from). A source head against a wheel
base goes over that wheel (the merge base's own kernels on both sides); a source side otherwise goes over the
installed release, which kvgate refuses unless REV and the release hold the same compiled sources. Both sides of
the cell then run on this machine into one results folder; run.json's vllm_under_test says which each side ran and
why.

A `cell(<id>)` session skips (exit 0) on a machine of another arch; here that is a failure: the runner's
label promised the cell's GPU. Every session runs even when one fails, so the artifact holds what there is;
the exit status is the first non-zero one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run isolated (python -I), Python puts no folder there
import ci_facts
from ci_facts import workflow_command

ROOT = Path(__file__).resolve().parents[1]


class CellJobError(Exception):
    """Bad job input; printed as one `ERROR` line, exit status 2."""


def read_environment(environ: dict[str, str]) -> tuple[str, list[str], Path]:
    cell = environ.get("KVGATE_CELL", "")
    if not cell:
        raise CellJobError("$KVGATE_CELL: not set. The workflow passes the matrix entry's `cell`")
    try:
        sessions = json.loads(environ.get("KVGATE_SESSIONS", ""))
    except (ValueError, RecursionError):  # not JSON, an integer of over 4300 digits, nested too deep
        raise CellJobError("$KVGATE_SESSIONS: not a JSON list of nox session names") from None
    if not isinstance(sessions, list) or not sessions or not all(isinstance(s, str) and s for s in sessions):
        raise CellJobError("$KVGATE_SESSIONS: expected a non-empty JSON list of nox session names")
    run_dir = environ.get("KVGATE_RUN_DIR", "")
    if not run_dir:
        raise CellJobError("$KVGATE_RUN_DIR: not set. Point it at the folder the artifact uploads")
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise CellJobError(f"$KVGATE_RUN_DIR: {run_dir[:200]!r} is not a folder. Point it at the folder the artifact "
                           "uploads")
    if Path(run_dir).is_dir() and any(Path(run_dir).iterdir()):
        raise CellJobError(f"$KVGATE_RUN_DIR: {run_dir[:200]!r} holds files already; the results folder must start "
                           "empty (its files are uploaded as this cell's results)")
    return cell, sessions, Path(run_dir)


def session_commands(nox: Sequence[str], sessions: Sequence[str], posargs: Sequence[str] = ()) -> list[list[str]]:
    return [[*nox, "-s", session, *(["--", *posargs] if posargs else [])] for session in sessions]


_REV = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def vllm_arguments(environ: dict[str, str]) -> list[str]:
    """`--vllm SPEC --base-vllm SPEC` for an A/B run of a vLLM change (a side's per-commit wheel where the workflow
    found one, else its checkout's Python over the release: source:CHECKOUT@REV); [] otherwise."""
    head, base = environ.get("KVGATE_VLLM_HEAD", ""), environ.get("KVGATE_VLLM_BASE", "")
    if not head and not base:
        return []
    if not head or not base:
        raise CellJobError("$KVGATE_VLLM_HEAD and $KVGATE_VLLM_BASE: set both (the vLLM checkouts of head and base), "
                           "or neither")
    rev = environ.get("KVGATE_VLLM_OVERLAY_BASE", "")
    if not _REV.fullmatch(rev) or ".." in rev:
        raise CellJobError(f"$KVGATE_VLLM_OVERLAY_BASE: {rev[:60]!r} is not a git revision (a commit SHA or a tag)")
    specs = []
    for name, value in (("KVGATE_VLLM_HEAD", head), ("KVGATE_VLLM_BASE", base)):
        if "@" in value or not Path(value).is_absolute():
            raise CellJobError(f"${name}: {value[:80]!r} must be an absolute path without '@'")
        wheel = environ.get(f"{name}_WHEEL", "")
        if wheel:
            if not Path(wheel).is_absolute() or not wheel.endswith(".whl"):
                raise CellJobError(f"${name}_WHEEL: {wheel[:80]!r} must be the absolute path of a .whl file")
            specs.append(f"wheel:{wheel}")
        else:
            specs.append(f"source:{value}@{rev}")
    return ["--vllm", specs[0], "--base-vllm", specs[1]]


WORKERS_ENV = "KVGATE_KERNEL_WORKERS"  # kvgate.kernels.gpus.WORKERS_ENV
WORKERS_OVERRIDE_ENV = "KVGATE_KERNEL_WORKERS_OVERRIDE"


def kernel_workers(environ: dict[str, str], gpu_count: int) -> str | None:
    """The KVGATE_KERNEL_WORKERS value for the cell's sessions; None leaves kvgate's default (one process)."""
    for value in (environ.get(WORKERS_OVERRIDE_ENV, ""), environ.get(WORKERS_ENV, "")):
        if value.strip():
            if not re.fullmatch(r"[0-9]+", value.strip()):  # str.isdigit() takes '²', which int() refuses
                raise CellJobError(f"KVGATE_KERNEL_WORKERS={value!r}: expected a whole number of pytest-xdist workers")
            return value.strip()
    return str(gpu_count) if gpu_count > 1 else None


def gpu_count(environ: dict[str, str]) -> int:
    """The GPUs this job may use: those CUDA_VISIBLE_DEVICES lists when set (CUDA reads it up to the first empty
    or -1 entry and hides the others), else every GPU nvidia-smi lists."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        entries = environ["CUDA_VISIBLE_DEVICES"].split(",")
        return len(list(itertools.takewhile(lambda d: d.strip() not in ("", "-1"), entries)))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def cell_folders(run_dir: Path) -> list[Path]:
    return sorted(p.parent for p in run_dir.glob("*/cell.json"))


def run_info(environ: dict[str, str]) -> dict[str, object]:
    """run.json for this job's slice of the run (docs/results-folder.md: free-form facts), where the runners wrote
    none: the CI's facts (ci/ci_facts.py: GitHub Actions or Buildkite) and the cell."""
    info: dict[str, object] = {"contract_version": 1, **ci_facts.run_facts(environ)}
    if environ.get("KVGATE_CELL"):
        info["cell"] = environ["KVGATE_CELL"]
    return info


def main() -> int:
    environ = dict(os.environ)
    try:
        cell, sessions, run_dir = read_environment(environ)
        posargs = vllm_arguments(environ)
        workers = kernel_workers(environ, gpu_count(environ))
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a file on its way (KVGATE_RUN_DIR=file/run), a folder this job may not write
            raise CellJobError(f"$KVGATE_RUN_DIR: {str(run_dir)[:200]!r} cannot be made ({error.strerror or error}). "
                               "Point it at the folder the artifact uploads") from None
    except CellJobError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    environ.pop(WORKERS_OVERRIDE_ENV, None)
    if workers is not None:
        environ[WORKERS_ENV] = workers
        print(f"kvgate cell job: kernel tests with {workers} pytest-xdist workers ({WORKERS_ENV})", flush=True)
    nox = environ.get("KVGATE_NOX", "nox").split()
    status = 0
    for argv in session_commands(nox, sessions, posargs):
        print(f"kvgate cell job: {' '.join(argv)}", flush=True)
        returncode = subprocess.run(argv, cwd=ROOT, env=environ, check=False).returncode
        if returncode != 0:
            print(workflow_command("error", f"{' '.join(argv)} exited {returncode}"), flush=True)
            status = status or returncode
    if not (run_dir / "run.json").exists():
        (run_dir / "run.json").write_text(json.dumps(run_info(environ), indent=2) + "\n", encoding="utf-8")
    if not cell_folders(run_dir):
        print(workflow_command("error", f"cell {cell}: no cell folder (cell.json) under {run_dir}. Did the session "
                                        "skip because this runner's GPU is not the cell's arch? Check the runner's "
                                        "labels"), flush=True)
        status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
