"""`kvgate gate` at many sizes: wall time and peak RSS of the real CLI, one fresh process a run, and whether its
outputs agree (exit status, verdict.json's totals, report.md's first line).

    PYTHONPATH=src python benchmarks/gate_scale.py [--features 4] [--samples 10000] [--log-mb 100] [--dir DIR]

Runs are written in the contract's format by tests/synthetic_run.py for the shipped matrix (every GPU cell; with
--features K, K more features declared on every backend and arch, so 64 x (K + 1) cells), each with the policy's 7
throughput repeats, kernel tests and the KV cache evidence; a few cells are planned and absent, a few hold a
truncated results file and a few FP8 cells drop 20 points, so each run must fail with exit 1. Sizes: 1 cell, 2 cells,
the default matrix (head only, and A/B), the extended matrix A/B, 2 cells of --samples questions with 3 KB prompts,
2 cells of 2,000 probe prompts, 2 cells whose dead engine left a log of --log-mb MB. What `kvgate gate` does is
timed: read every file, run every check, write the four reports. Prints the figures; asserts nothing (the
2026-12-04 audit on the 2-core development machine: 64 cells A/B 4 s / 160 MB, 288 cells A/B 11 s / 305 MB, 624
cells A/B 25 s / 520 MB, 1,072 cells A/B 40 s / 790 MB: linear).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # synthetic_run: the tests' writer of contract-format folders

import synthetic_run as S  # noqa: E402
from kvgate.gate import policy as policy_module  # noqa: E402
from kvgate.matrix.cells import load as load_matrix  # noqa: E402

ALL_GPU = ('{ backend = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TRITON_MLA"], '
           'arch = ["sm80", "sm89", "sm90", "sm100", "sm120"] }, { backend = ["FLASHINFER_MLA", "CUTLASS_MLA"], '
           'arch = "sm100" }, { backend = ["FLASHMLA", "FLASH_ATTN_MLA"], arch = "sm90" }')
# a child's peak RSS: its own, measured by the parent that waited for it
PEAK = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(code)")


def matrix_folder(folder: Path, features: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for toml in (ROOT / "matrix").glob("*.toml"):
        shutil.copy(toml, folder / toml.name)
    axes = (folder / "axes.toml").read_text(encoding="utf-8")
    for k in range(features):
        axes += (f'\n[features.scale{k}]\ndescription = "scale benchmark feature {k}"\n'
                 f"engine_args = {{ max_num_seqs = {64 + k} }}\ncells = [{ALL_GPU}]\nvllm_paths = []\n")
    (folder / "axes.toml").write_text(axes, encoding="utf-8")
    return folder


def use_matrix(folder: Path) -> None:
    """synthetic_run's writers hold a cell to the matrix it is judged by."""
    S.load_matrix = lambda *_, **__: load_matrix(folder)
    S.load_policy = lambda matrix: policy_module.load(folder / "policy.toml", matrix=matrix)
    S.shipped_matrix.cache_clear()
    S.shipped_policy.cache_clear()


def write_run(run: Path, matrix: Path, *, cells: int = 0, ab: bool = False, n: int = 200, prompt_chars: int = 400,
              probes: int = 0, log_mb: int = 0, broken: int = 0) -> Path:
    use_matrix(matrix)
    planned = [c for c in S.shipped_matrix().cells if c.arch != "cpu"][:cells or None]
    sides = ["base", "head"] if ab else ["head"]
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"contract_version": "1.16", "cells": [c.id for c in planned],
                                              "sides": sides}))
    absent = {c.id for c in planned[:broken]}
    truncated = {c.id for c in planned[broken:2 * broken]}
    dropped = {c.id for c in planned[2 * broken:] if c.kv_cache_dtype != "auto"}
    dropped = set(sorted(dropped)[:broken])
    for index, cell in enumerate(planned):
        if cell.id in absent:
            continue
        for side in sides:
            folder = S.write_cell(run, backend=cell.backend, kv_cache_dtype=cell.kv_cache_dtype, arch=cell.arch,
                                  feature=cell.feature.name if cell.feature else "",
                                  folder=cell.id if side == "head" else f"{cell.id}--base",
                                  extra={"contract_version": "1.16", "side": side})
            lost = n // 5 if cell.id in dropped and (side == "head" or not ab) else 0
            _, outcomes = S.paired_outcomes(n, reference_correct=int(0.7 * n), only_reference=lost, only_candidate=0,
                                            seed=index)
            S.write_accuracy(folder, dict.fromkeys(S.GSM8K_FILTERS, outcomes), prompt_chars=prompt_chars)
            if cell.id in truncated:
                results = next(folder.glob("accuracy/*/results_*.json"))
                results.write_text(results.read_text()[:50])
            status = {"accuracy": {"status": "ok", "kv_cache": {
                "element_bytes": [1 if cell.kv_cache_dtype != "auto" else 2],
                "layer_kv_cache_dtypes": [cell.kv_cache_dtype], "tokens": 200_000,
                "bytes_per_token": 27 * 576 * (1 if cell.kv_cache_dtype != "auto" else 2)}},
                "throughput": {"status": "ok"}}
            if cell.workload.long_context:
                passkey, _ = S.paired_outcomes(200, reference_correct=180, only_reference=0, only_candidate=0)
                S.write_accuracy(folder, dict.fromkeys(S.GSM8K_FILTERS, passkey), task="kvgate_passkey",
                                 stage="long_context")
                status["long_context"] = {"status": "ok", "lengths": list(cell.workload.long_context.lengths)}
            rounds = S.shipped_policy().throughput.rounds
            S.write_throughput(folder, [3.2 * (1 + 0.003 * (k % 3 - 1)) for k in range(rounds)])
            if ab:
                status["throughput"]["interleaved"] = {"order": ["base", "head"], "rounds": rounds}
            S.write_kernels(folder)
            if probes:
                S.write_probe(folder, prompts=probes, shift=0.01 if cell.kv_cache_dtype != "auto" else 0.0)
            if log_mb:
                (folder / "logs").mkdir()
                line = b"INFO 12-04 10:00:00 [engine.py:123] step 123456 running 4 waiting 0 tokens/s 12.3\n"
                chunk = line * ((1 << 20) // len(line))
                with open(folder / "logs" / "accuracy.log", "wb") as handle:
                    for _ in range(log_mb):
                        handle.write(chunk)
                    handle.write(b"RuntimeError: CUDA error: an illegal memory access was encountered\n")
                status["accuracy"] = {"status": "error", "reason": "engine died"}
                status["probe"] = {"status": "error", "reason": "engine died"}
            S.write_status(folder, status)
    return run


def judge(run: Path, matrix: Path) -> tuple[float, int, int, str]:
    """(wall seconds, peak RSS in MB, exit status, what the summary line says) of `kvgate gate` on `run`."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-m", "kvgate", "gate", str(run), "--out",
                           str(run / "gate"), "--matrix-dir", str(matrix), "--today", "2026-12-04"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    wall = time.perf_counter() - started
    peak_mb = int(done.stderr.strip().splitlines()[-1]) // 1024
    first = done.stdout.splitlines()[0] if done.stdout else done.stderr.splitlines()[0]
    verdict = run / "gate" / "verdict.json"
    if verdict.exists():
        summary = json.loads(verdict.read_text())["summary"]
        agrees = (first == (run / "gate" / "report.md").read_text(encoding="utf-8").splitlines()[0])
        first = f"{summary['failed']} of {summary['checks']} failed; report.md line 1 {'agrees' if agrees else 'DIFFERS'}"
    return wall, peak_mb, done.returncode, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=4, help="features added on every cell (default 4)")
    parser.add_argument("--samples", type=int, default=10_000, help="questions a cell in the samples run")
    parser.add_argument("--log-mb", type=int, default=100, help="MB of each dead engine's log")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the runs (default: a temporary folder)")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="kvgate-scale-"))
    shipped = matrix_folder(root / "matrix", 0)
    extended = matrix_folder(root / "matrix-extended", args.features)
    sizes = [("1 cell", shipped, dict(cells=1)), ("2 cells", shipped, dict(cells=2, broken=0)),
             ("default matrix", shipped, dict(broken=2)), ("default matrix A/B", shipped, dict(ab=True, broken=2)),
             (f"+{args.features} features A/B", extended, dict(ab=True, broken=3)),
             (f"2 cells x {args.samples} questions", shipped, dict(cells=2, n=args.samples, prompt_chars=3000)),
             ("2 cells x 2000 probe prompts", shipped, dict(cells=2, probes=2000)),
             (f"2 cells, {args.log_mb} MB logs", shipped, dict(cells=2, log_mb=args.log_mb))]
    print(f"{'run':<32} {'cells':>6} {'folders':>8} {'MB on disk':>10} {'wall s':>7} {'peak MB':>8} exit  summary")
    for index, (name, matrix, options) in enumerate(sizes):
        run = root / f"run-{index}"
        if run.exists():
            shutil.rmtree(run)
        write_run(run, matrix, **options)
        folders = sum(1 for p in run.iterdir() if p.is_dir())
        disk = sum(p.stat().st_size for p in run.rglob("*") if p.is_file()) / 1e6
        cells = len(json.loads((run / "run.json").read_text())["cells"])
        wall, peak, code, said = judge(run, matrix)
        print(f"{name:<32} {cells:>6} {folders:>8} {disk:>10.0f} {wall:>7.1f} {peak:>8} {code:>4}  {said}", flush=True)
        shutil.rmtree(run)


if __name__ == "__main__":
    main()
