"""The matrix folder of an H200 round (benchmarks/h200_canaries/run.sh setup): the repository's matrix/*.toml, with
benchmarks/h200_engine/workloads.toml (kvgate's tiny models) in place of workloads.toml, edited as the round's
settings edited it, and no per-model line for DeepSeek-V2-Lite-Chat (the hub model no such round runs)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
H200_WORKLOADS = REPO / "benchmarks" / "h200_engine" / "workloads.toml"


def matrix_folder(folder: Path, edit: Callable[[str], str] = lambda workloads: workloads) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for toml in (REPO / "matrix").glob("*.toml"):
        shutil.copy(toml, folder / toml.name)
    (folder / "workloads.toml").write_text(edit(H200_WORKLOADS.read_text()))
    policy = folder / "policy.toml"
    policy.write_text("".join(line for line in policy.read_text().splitlines(keepends=True)
                              if not line.startswith('"deepseek-ai/DeepSeek-V2-Lite-Chat" = ')))
    return folder


def local_mla_model(workloads: str) -> str:
    """The MLA model at the path the 2026-12-01 H200 run loaded it from."""
    assert 'model = "kvgate:tiny-deepseek-v2"' in workloads
    return workloads.replace('model = "kvgate:tiny-deepseek-v2"', 'model = "/tmp/h200/models/tiny-deepseek-v2"')


def cuda_graphs(workloads: str) -> str:
    """run.sh setup with KVGATE_CANARY_GRAPHS=1 (features.sh's $G): the tiny models' workloads capture CUDA graphs."""
    assert workloads.count("enforce_eager = true") >= 2  # the two workloads (and a comment naming it)
    return workloads.replace("enforce_eager = true", "enforce_eager = false")


def gate_graph_runs(archive: Path, root: Path, runs: Sequence[tuple[str, list[str]]]) -> dict[str, tuple[int, dict, Path]]:
    """A CUDA-graph round's archived runs, each judged by today's gate against the round's matrix: run -> (exit code,
    verdict.json, folder)."""
    import archives
    from gate_in_process import gate

    archives.extract(archive, root)
    matrix = matrix_folder(root / "matrix-today", cuda_graphs)
    out = {}
    for run, extra in runs:
        code, printed = gate(str(root / run), *extra, "--matrix-dir", str(matrix), "--policy",
                             str(matrix / "policy.toml"), "--today", "2026-12-03")
        assert code in (0, 1), printed
        out[run] = (code, json.loads((root / run / "gate" / "verdict.json").read_text()), root / run)
    return out


def judged_checks(verdict: dict) -> dict[tuple[str, str], str]:
    """(cell, kind) -> status of every check that decides: other filters' figures (info) and the stages a round's
    runs did not ask for (kernels, throughput: not_run) aside."""
    return {(c["cell"], c["kind"]): c["status"] for c in verdict["checks"]
            if c["status"] not in ("info", "not_run") and c.get("subject") in (None, "strict-match")}


def failing(verdict: dict) -> set[tuple[str, str]]:
    return {key for key, status in judged_checks(verdict).items() if status in ("fail", "error", "missing")}


def figures(verdict: dict, cell: str, kind: str) -> dict:
    return next(c for c in verdict["checks"] if c["cell"] == cell and c["kind"] == kind
                and c.get("subject") in (None, "strict-match"))["figures"]
