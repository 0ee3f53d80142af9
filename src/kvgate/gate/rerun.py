"""The command that reruns one failing cell alone, with the run's own vLLM: what a maintainer pastes to reproduce.

    nox -s "cell(flashmla-fp8-sm90)" -- --stages throughput --vllm release:0.26.0

The stage is the failed check's (kernels; accuracy for the accuracy comparisons, the probe and the KV cache check;
throughput), every stage for a missing cell. The vLLM is run.json's `vllm_under_test` spec of each side (`--vllm`,
and `--base-vllm` for an A/B run), else the release its `versions` name (`release:0.26.0`), else none (the engine
environment's release). The nox `cell(<id>)` session runs `kvgate run cell --cell <id>` into a fresh results folder
(`KVGATE_RUN_DIR` sets another), on a machine of the cell's arch. Pure: a check and run.json in, a string out.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from kvgate.gate.verdict import Check

STAGE_OF_KIND = {
    "kernels": "kernels",
    "accuracy": "accuracy", "accuracy_floor": "accuracy", "fp8_accuracy": "accuracy", "baseline_accuracy": "accuracy",
    "probe": "accuracy", "probe_ab": "accuracy", "fp8_kv_cache": "accuracy",
    "fp8_long_context": "accuracy", "baseline_long_context": "accuracy",  # the passkey task runs in its engine
    "throughput": "throughput", "fp8_throughput": "throughput",
    "cell": None, "host": None,  # every stage of the cell
}
MAX_SPEC = 300  # characters of a recorded spec quoted (a hostile run.json cannot make the command a page long)


def vllm_specs(run_info: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(head spec, base spec) from run.json: vllm_under_test's, else `release:<versions.vllm>` for the head."""
    under_test = run_info.get("vllm_under_test") if isinstance(run_info.get("vllm_under_test"), Mapping) else {}
    specs = []
    for side in ("head", "base"):
        record = under_test.get(side)
        spec = record.get("spec") if isinstance(record, Mapping) else None
        specs.append(spec if isinstance(spec, str) and spec.strip() and len(spec) <= MAX_SPEC else None)
    head, base = specs
    versions = run_info.get("versions") if isinstance(run_info.get("versions"), Mapping) else {}
    version = versions.get("vllm")
    if head is None and isinstance(version, str) and version.strip() and len(version) <= 60:
        head = f"release:{version.strip()}"
    return head, base


def rerun_command(check: Check, run_info: Mapping[str, Any]) -> str | None:
    """The command that reruns the check's cell alone (None for a check of the whole run)."""
    if check.kind not in STAGE_OF_KIND or not _is_cell_id(check.cell):
        return None
    argv = ["nox", "-s", f"cell({check.cell})", "--"]
    stage = STAGE_OF_KIND[check.kind]
    if stage is not None:
        argv += ["--stages", stage]
    head, base = vllm_specs(run_info)
    if head is not None:
        argv += ["--vllm", head]
    if base is not None:
        argv += ["--base-vllm", base]
    if argv[-1] == "--":
        argv.pop()
    return shlex.join(argv)


def _is_cell_id(cell: str) -> bool:
    parts = cell.split("-")
    return len(parts) >= 3 and all(parts) and all(c.isalnum() or c in "_-" for c in cell)
