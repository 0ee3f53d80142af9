"""Everything a stage of one cell needs to run, gathered once per cell by kvgate.runners.matrix_run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvgate.change.overlay import VllmUnderTest
from kvgate.matrix.cells import Cell
from kvgate.runners.stages.looks import Design, Plan


@dataclass(frozen=True, kw_only=True, slots=True)
class CellContext:
    cell: Cell
    cell_dir: Path
    run_dir: Path
    model_path: str  # a local folder for "kvgate:<name>" models, else the hub id
    throughput_model_path: str | None = None  # the throughput stage's own model (dummy weights' folder); None: model_path
    long_context_model_path: str | None = None  # the passkey task's own model (workloads long_context.model); None: none
    allow_shared_gpu: bool = False  # measure throughput on a GPU other processes hold (else the stage refuses it)
    python: str  # the interpreter that has vLLM and lm-eval (this one)
    env: Mapping[str, str]  # kvgate.runners.environment.process_env's
    timeout: float | None  # per stage, seconds
    passthrough: tuple[str, ...] = ()  # flags after `--`: lm_eval's (accuracy) or vllm bench's (throughput)
    include_path: Path | None = None  # folder of kvgate's local gsm8k task, when the workload uses it
    matrix_dir: Path | None = None  # a matrix other than the repository's (handed on to `kvgate kernels`)
    echo: bool = True  # stream the tools' output to the terminal too
    heartbeat_alone: bool = False  # echo off, the heartbeat's lines still reach the terminal (engines side by side)
    side: str | None = None  # the side of an A/B run (base | head); None: a run of one side
    vllm: VllmUnderTest | None = None  # what this side runs, when kvgate was told (--vllm / --base-vllm)
    calculate_kv_scales: bool | None = None  # passed to the engine when not None (FP8 cells, kvgate.runners.environment.engine_options)
    design: Design | None = None  # the accuracy stage's questions and looks (the policy's plan); None: the task's own
    looks_plan: Plan | None = None  # a candidate's references to stop against at a look; None: answer them all

    @property
    def label(self) -> str:
        """The cell as progress lines name it: its id, and the side in an A/B run."""
        return self.cell.id if self.side is None else f"{self.cell.id} ({self.side})"
