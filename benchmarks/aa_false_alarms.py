"""A/A runs on the real engine: the same vLLM on both sides, gated as a pull request would be; counts false alarms.

    PYTHONPATH=src python benchmarks/aa_false_alarms.py --runs 10 [--cells cpu_attn-auto-cpu,cpu_attn-fp8-cpu]
        [--stages accuracy] [--vllm release] [--root DIR]

Each run is `kvgate run <stage> --vllm V --base-vllm V` for the cells (both sides on this machine, into one
results folder), then `kvgate gate RUN --require-baseline`, exactly as CI gates a change. A run whose gate exits 1
is a false alarm (nothing changed); exit 2 or a crashed stage is counted apart (a broken run, not an alarm).
Prints one line per run (gate exit, the judged checks that failed, each cell's head-vs-base discordance) and the
false-alarm rate with its exact (Clopper-Pearson) 95 % upper bound. Runs are kept under --root.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def false_alarm_upper_bound(alarms: int, runs: int, confidence: float = 0.95) -> float:
    """Exact one-sided (Clopper-Pearson) upper bound of the per-run false-alarm rate (kvgate.statistics.margins)."""
    from kvgate.statistics.margins import floor_test

    return floor_test(alarms, runs, floor=0.5, alpha=1 - confidence).upper


def one_run(index: int, args: argparse.Namespace, root: Path) -> dict:
    run_dir = root / f"aa-{index:02d}"
    python = sys.executable
    run_cmd = [python, "-m", "kvgate", "run", args.stage, "--run-dir", str(run_dir), "--vllm", args.vllm,
               "--base-vllm", args.vllm]
    for cell in args.cells.split(","):
        run_cmd += ["--cell", cell]
    start = time.monotonic()
    with open(root / f"aa-{index:02d}.log", "w", encoding="utf-8") as log:
        run_rc = subprocess.run(run_cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
        gate_rc = subprocess.run([python, "-m", "kvgate", "gate", str(run_dir), "--require-baseline"],
                                 stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    elapsed = time.monotonic() - start
    failed, discordance = [], {}
    try:
        verdict = json.loads((run_dir / "gate" / "verdict.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        verdict = {"checks": []}
    for check in verdict.get("checks", []):
        if check.get("status") in ("fail", "error", "missing"):
            failed.append(f"{check.get('cell')} {check.get('kind')}")
        figures = check.get("figures") or {}
        if check.get("kind") == "baseline_accuracy" and "discordant" in figures:
            discordance[check.get("cell")] = (figures.get("only_reference"), figures.get("only_candidate"),
                                              figures.get("n"))
    return {"run": index, "run_rc": run_rc, "gate_rc": gate_rc, "failed": failed, "discordance": discordance,
            "elapsed_s": round(elapsed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cells", default="cpu_attn-auto-cpu,cpu_attn-fp8-cpu")
    parser.add_argument("--stage", default="accuracy", choices=["accuracy", "throughput", "cell"])
    parser.add_argument("--vllm", default="release")
    parser.add_argument("--root", type=Path, default=Path("reports/aa") / time.strftime("%Y-%m-%dT%H-%M-%SZ",
                                                                                         time.gmtime()))
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    print(f"A/A: {args.runs} runs of `kvgate run {args.stage}` for {args.cells}, --vllm {args.vllm} on both sides, "
          f"gated with --require-baseline; under {args.root}", flush=True)
    results = []
    for index in range(1, args.runs + 1):
        result = one_run(index, args, args.root)
        results.append(result)
        disc = "; ".join(f"{cell} b={b} c={c} n={n}" for cell, (b, c, n) in sorted(result["discordance"].items()))
        print(f"run {index:2d}: run exit {result['run_rc']}, gate exit {result['gate_rc']}, "
              f"{result['elapsed_s']} s; failed: {', '.join(result['failed']) or 'none'}; head vs base: {disc or '-'}",
              flush=True)
        (args.root / "summary.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    broken = [r for r in results if r["gate_rc"] == 2 or r["run_rc"] not in (0, 1)]
    valid = [r for r in results if r not in broken]
    alarms = sum(1 for r in valid if r["gate_rc"] == 1)
    bound = f"{100 * false_alarm_upper_bound(alarms, len(valid)):.1f} %" if valid else "none: no valid run"
    print(f"\nfalse alarms: {alarms} of {len(valid)} valid A/A runs (exact 95 % upper bound {bound})"
          + (f"; {len(broken)} broken run(s) not counted" if broken else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
