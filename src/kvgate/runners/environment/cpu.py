"""The CPU of the host that runs the cells, as vLLM sees it, and which cells that host can run.

    read_host_cpu()          HostCpu: machine, model, instruction sets (kvgate's names: avx2, avx512, amx, neon,
                             ...) and where they were read: torch (what vLLM asks: torch.cpu._is_avx512_supported(),
                             _is_amx_tile_supported()) in the engine environment, else /proc/cpuinfo's flags
    plan_for_host(cells, ...) HostPlan: the cells this host runs, and those planned out with the reason (a CPU
                             without the instruction sets a cell needs, fewer GPUs than its feature needs)

Always read on the host that runs, never taken from a results folder or a flag. One variable may take
instruction sets away, to try what a smaller CPU gets on a bigger one: KVGATE_HOST_CPU_WITHOUT=avx512,amx. It
can only remove, so it can only plan more cells out, never run one this host cannot; run.json records it.

Stdlib only at import (the noxfile imports it to skip `cell(<id>)` sessions a host cannot run); torch is asked
inside read_host_cpu() when it is importable.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvgate import InputError, unknown_name_hint
from kvgate.matrix.cells import Cell
from kvgate.matrix.host_requirements import CPU_ISA_NAMES, HostRequirement, isa_words

WITHOUT_ENV = "KVGATE_HOST_CPU_WITHOUT"
RUNNER_LABEL_ENV = "KVGATE_RUNNER_LABEL"  # set by CI: the label that sent this job here
CPUINFO = Path("/proc/cpuinfo")
# machine (platform.machine()) -> the ISA every CPU of that architecture has, for vLLM's purposes (CpuArchEnum)
ARCHITECTURE_ISA = {"aarch64": "neon", "arm64": "neon", "ppc64le": "vsx", "s390x": "vxe"}


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCpu:
    machine: str  # platform.machine(): x86_64, aarch64, ...
    model: str | None  # "AMD EPYC 7B13"
    isa: frozenset[str]  # kvgate's names (matrix.host_requirements.CPU_ISA_NAMES)
    read_from: str  # "torch 2.13.0+cpu" or "/proc/cpuinfo"
    without: tuple[str, ...] = ()  # taken away by KVGATE_HOST_CPU_WITHOUT (a simulation)
    gpus: int | None = None  # GPUs this process may use, counted when a cell needs more than one; None: not counted
    cores: int | None = None  # CPU cores this process may use, counted when a CPU cell needs more than one

    def describe(self) -> str:
        """'AMD EPYC 7B13 (x86_64; AVX2)' and, when simulated, what was taken away."""
        shown = f"{self.model or 'an unnamed CPU'} ({self.machine}; {isa_words(self.isa)})"
        if self.gpus is not None:
            shown += f", {self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        if self.cores is not None:
            shown += f", {self.cores} core{'s' if self.cores != 1 else ''}"
        if self.without:
            shown += f", simulated without {', '.join(CPU_ISA_NAMES[n] for n in self.without)} ({WITHOUT_ENV})"
        return shown

    def as_record(self) -> dict[str, Any]:
        """run.json `host_cpu`."""
        return {"machine": self.machine, "model": self.model, "isa": sorted(self.isa), "read_from": self.read_from,
                "simulated_without": list(self.without), **({"gpus": self.gpus} if self.gpus is not None else {}),
                **({"cores": self.cores} if self.cores is not None else {})}


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedOut:
    cell: Cell
    requirement: HostRequirement
    reason: str  # one line: what the cell needs, what this host has

    def as_record(self) -> dict[str, Any]:
        """run.json `planned_out` entries (docs/results-folder.md)."""
        return {"cell": self.cell.id, "reason": self.reason, "needs": self.requirement.needs,
                "runner": self.requirement.runner}


@dataclass(frozen=True, kw_only=True, slots=True)
class HostPlan:
    host: HostCpu | None  # None: no cell of this host's arch was selected (nothing was asked of its CPU)
    runnable: tuple[Cell, ...]
    planned_out: tuple[PlannedOut, ...] = field(default_factory=tuple)

    def start_lines(self, total: int) -> list[str]:
        """What the run says before anything starts (empty when every cell runs)."""
        if not self.planned_out:
            return []
        lines = [f"kvgate: this host cannot run {len(self.planned_out)} of {total} cells; they are planned out "
                 f"(not run, not failed). Its CPU: {self.host.describe() if self.host else 'unknown'}"]
        lines += [f"kvgate:   {p.cell.id}: {p.reason}" for p in self.planned_out]
        return lines

    def end_lines(self) -> list[str]:
        """What the run says last: what did not run here, and where it can."""
        if not self.planned_out:
            return []
        fp8 = all(p.cell.is_fp8 for p in self.planned_out)
        ids = ", ".join(p.cell.id for p in self.planned_out)
        needs = "; ".join(sorted({p.requirement.needs for p in self.planned_out}))
        labels = ", ".join(sorted({p.requirement.runner for p in self.planned_out}))
        if all(p.requirement.counted for p in self.planned_out):
            return [f"kvgate: some cells were not run here ({ids}): they need {needs}, which this host lacks. Run them "
                    f"on such a host (CI runner label {labels})."]
        return [f"kvgate: {'FP8 was' if fp8 else 'some cells were'} not run here ({ids}): they need {needs}, which "
                f"this host lacks. Run them on such a host (CI runner label {labels}) or run the GPU cells on a GPU "
                "(`nox -t sm90` on an H100/H200)."]


def allowed_core_count() -> int:
    """The CPU cores this process may run on (its affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def read_host_cpu(environ: Mapping[str, str] | None = None, *, use_torch: bool = True) -> HostCpu:
    """This host's CPU. torch's answers where torch imports (vLLM asks torch), else /proc/cpuinfo's flags."""
    environ = os.environ if environ is None else environ
    machine = platform.machine().lower() or "unknown"
    flags, model = _cpuinfo()
    isa, read_from = (_torch_isa() if use_torch else None), str(CPUINFO)
    if isa is not None:
        import torch

        read_from = f"torch {torch.__version__}"
    else:
        isa = isa_from_flags(flags)
    if machine in ARCHITECTURE_ISA:
        isa = isa | {ARCHITECTURE_ISA[machine]}
    without = parse_without(environ.get(WITHOUT_ENV, ""))
    return HostCpu(machine=machine, model=model, isa=frozenset(isa) - set(without), read_from=read_from,
                   without=without)


def isa_from_flags(flags: Collection[str]) -> frozenset[str]:
    """/proc/cpuinfo flags -> kvgate's names, as torch's cpuinfo reads them (avx512 = avx512f, amx = amx_tile)."""
    found = set()
    if "avx2" in flags:
        found.add("avx2")
    if "avx512f" in flags:
        found.add("avx512")
    if "amx_tile" in flags:
        found.add("amx")
    if "asimd" in flags or "neon" in flags:
        found.add("neon")
    return frozenset(found)


def parse_without(value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip().lower() for part in value.split(",") if part.strip()))
    for name in names:
        if name not in CPU_ISA_NAMES:
            raise InputError(f"${WITHOUT_ENV}", f"unknown instruction set '{name}'",
                             hint=unknown_name_hint(name, CPU_ISA_NAMES))
    return names


def _torch_isa() -> frozenset[str] | None:
    try:
        import torch
    except ImportError:
        return None
    try:
        found = set()
        if torch.cpu._is_avx2_supported():
            found.add("avx2")
        if torch.cpu._is_avx512_supported():
            found.add("avx512")
        if torch.cpu._is_amx_tile_supported():
            found.add("amx")
        return frozenset(found)
    except (AttributeError, RuntimeError):  # a torch without these private helpers: read the flags
        return None


def _cpuinfo() -> tuple[frozenset[str], str | None]:
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset(), platform.processor() or None
    flags: set[str] = set()
    model = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "cpu model", "cpu") and model is None and value.strip():
            model = value.strip()
    return frozenset(flags), model


def unmet(cell: Cell, host: HostCpu) -> HostRequirement | None:
    """The first of the cell's host requirements this host (its CPU, its GPUs where counted) does not meet (pure)."""
    return next((r for r in cell.host_requirements if r.unmet_by(host.isa, host.gpus, host.cores)), None)


def plan_for_host(cells: Sequence[Cell], local_arch: str | None, host: HostCpu | None = None,
                  read: Any = read_host_cpu, count_gpus: Any = None) -> HostPlan:
    """Split the cells this host would run (those of its arch) into runnable and planned out. Cells of other
    archs are left to the caller (they are skipped as another machine's). The host is read once, when a cell of
    its arch was selected (run.json records it); its GPUs are counted (count_gpus, default
    kvgate.runners.environment.gpu.visible_gpu_count) when a cell of its arch needs more than one."""
    local = [c for c in cells if local_arch is None or c.arch == local_arch]
    if not local:
        return HostPlan(host=host, runnable=tuple(cells))
    host = host or read()
    if host.gpus is None and any(r.gpus is not None for c in local for r in c.host_requirements):
        if count_gpus is None:
            from kvgate.runners.environment.gpu import visible_gpu_count as count_gpus
        host = replace(host, gpus=count_gpus())
    if host.cores is None and any(r.cores is not None for c in local for r in c.host_requirements):
        host = replace(host, cores=allowed_core_count())
    out: list[PlannedOut] = []
    for cell in local:
        requirement = unmet(cell, host)
        if requirement is not None:
            if requirement.gpus is not None and host.gpus is not None and host.gpus < requirement.gpus:
                reason = (f"needs {requirement.needs}; this host has {host.gpus} "
                          f"({requirement.reason}; {requirement.source})")
            elif requirement.cores is not None and host.cores is not None and host.cores < requirement.cores:
                reason = (f"needs {requirement.needs}; this host lends this process {host.cores} "
                          f"({requirement.reason}; {requirement.source})")
            else:
                reason = (f"needs {requirement.needs}; this CPU has {isa_words(host.isa)} "
                          f"({requirement.source})")
            out.append(PlannedOut(cell=cell, requirement=requirement, reason=reason))
    skipped = {p.cell.id for p in out}
    return HostPlan(host=host, runnable=tuple(c for c in cells if c.id not in skipped), planned_out=tuple(out))


def model_head_size(model_path: str) -> int | None:
    """The attention head size of a local Hugging Face model folder (config.json), None when it cannot tell."""
    import json

    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    head = config.get("head_dim")
    if isinstance(head, int) and head > 0:
        return head
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0:
        return hidden // heads
    return None


def head_size_problems(cell: Cell, model_path: str) -> str | None:
    """Why the cell's model cannot run it (a head size its host requirement refuses); None otherwise."""
    size = model_head_size(model_path) if any(r.head_size_multiple for r in cell.host_requirements) else None
    problems = [p for r in cell.host_requirements if (p := r.head_size_problem(size))]
    return problems[0] if problems else None


def plan_or_refuse(cells: Sequence[Cell], local_arch: str | None, command: str,
                   environ: Mapping[str, str] | None = None) -> HostPlan:
    """plan_for_host(), where a selection this host can run none of is bad input (said up front, exit 2) — except
    in CI ($KVGATE_RUNNER_LABEL set): there the run records each such cell as an error naming the runner label,
    so a misrouted job fails its cells instead of passing without them."""
    environ = os.environ if environ is None else environ
    plan = plan_for_host(cells, local_arch, read=lambda: read_host_cpu(environ))
    if plan.planned_out and not plan.runnable and not environ.get(RUNNER_LABEL_ENV):
        first = plan.planned_out[0]
        more = f" (and {len(plan.planned_out) - 1} more)" if len(plan.planned_out) > 1 else ""
        raise InputError(command, f"this host cannot run {first.cell.id}{more}: {first.reason}",
                         hint=f"Run it on {first.requirement.needs} (CI runner label {first.requirement.runner}), "
                              f"or select cells this host can run")
    return plan


def misrouted_reason(planned: PlannedOut, label: str) -> str:
    """The stage error of a cell that CI sent to a host it cannot run on."""
    return (f"runner label {label!r} sent this cell to a host that cannot run it: {planned.reason}; its runner label "
            f"is {planned.requirement.runner!r} ("
            + (planned.requirement.source if planned.requirement.counted
               else f"matrix/backends.toml {planned.requirement.where}") + ")")
