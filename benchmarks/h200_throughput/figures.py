"""The figures of benchmarks/h200_throughput/run.sh's runs: per engine its repeats (req/s), start and warm-up seconds
and the machine under them; per cell and vLLM (the release, or a patch) the noise within an engine and between
engines (kvgate.statistics.margins.run_to_run_sd_estimate over the engines, each a group of its repeats); the minutes
a cell side took. Markdown to stdout.

    python benchmarks/h200_throughput/figures.py RUNS_DIR        (one folder per `kvgate run`: RUNS_DIR/<job>/)
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from kvgate.statistics.margins import run_to_run_sd_estimate


def engines_of(cell_dir: Path) -> list[dict]:
    """[{engine, repeats: [req/s...], start_s, warmup_s, clocks}] of one cell side's throughput stage."""
    status_file = cell_dir / "status.json"
    if not status_file.is_file():  # a side the device time cut short: no status written
        return [{"engine": None, "rps": [], "status": "unfinished", "reason": "no status.json (the run was cut short)",
                 "elapsed_s": None}]
    status = json.loads(status_file.read_text())["throughput"]
    out = []
    for engine in status.get("engines", []):
        values = []
        for number in engine["repeats"]:
            path = cell_dir / "throughput" / f"repeat-{number}.json"
            if path.is_file():
                values.append(json.loads(path.read_text())["requests_per_second"])
        clocks = [a.get("sm_clock_mhz") or {} for r in engine.get("machine", []) for a in r.get("attempts", [])]
        out.append({"engine": engine["engine"], "rps": values, "start_s": engine.get("engine_start_s"),
                    "warmup_s": engine.get("warmup_s"), "clock_min": min((c["min"] for c in clocks if c), default=None),
                    "retried": sum(len(r.get("attempts", [])) > 1 for r in engine.get("machine", [])),
                    "status": status["status"], "reason": status.get("reason"),
                    # a side's own minutes: its engines' wall time (kvgate from this benchmark on); runs made before
                    # recorded the A/B pair's time as both sides' elapsed_s, so half of it stands in
                    "elapsed_s": engine.get("wall_s") or _half_of_pair(status)})
    if not out:
        out.append({"engine": None, "rps": [], "status": status["status"], "reason": status.get("reason"),
                    "elapsed_s": status.get("elapsed_s")})
    return out


def _half_of_pair(status: dict) -> float | None:
    elapsed = status.get("elapsed_s")
    return None if elapsed is None else elapsed / (2 if status.get("interleaved") else 1)


def log_sd(values: list[float]) -> float | None:
    return statistics.stdev([math.log(v) for v in values]) if len(values) >= 2 else None


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def main(runs_dir: Path) -> None:
    rows, groups = [], defaultdict(list)  # (cell, vllm) -> engines' repeats
    for run in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        record = json.loads((run / "run.json").read_text())
        specs = {side: (v or {}).get("spec", "release") for side, v in (record.get("vllm_under_test") or {}).items()}
        for cell_dir in sorted(p for p in run.iterdir() if (p / "cell.json").is_file()):
            cell = json.loads((cell_dir / "cell.json").read_text())
            side = cell.get("side", "head")
            spec = specs.get(side, "release")
            vllm = "release" if spec in ("release", None) or spec.startswith("release") else Path(spec).name
            for engine in engines_of(cell_dir):
                rows.append((run.name, cell["cell_id"], side, vllm, engine))
                if len(engine["rps"]) >= 1 and engine["status"] == "ok":
                    groups[(cell["cell_id"], vllm)].append(engine["rps"])
    print("## Engines\n")
    print("| run | cell | side | vLLM | req/s per repeat | within SD | engine start s | warm-up s | side minutes | "
          "SM clock min MHz | repeats measured again |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for run, cell, side, vllm, e in rows:
        if e["engine"] is None:
            print(f"| {run} | {cell} | {side} | {vllm} | {e['status']}: {e['reason']} | | | | | | |")
            continue
        minutes = "-" if e["elapsed_s"] is None else f"{e['elapsed_s'] / 60:.2f}"
        print(f"| {run} | {cell} | {side} | {vllm} | {', '.join(f'{v:.3f}' for v in e['rps'])} | "
              f"{percent(log_sd(e['rps']))} | {e['start_s']} | {e['warmup_s']} | {minutes} | {e['clock_min']} | "
              f"{e['retried']} |")
    print("\n## Noise per cell and vLLM (each engine a group of its repeats)\n")
    print("| cell | vLLM | engines | repeats | engine means req/s | within-engine SD (pooled) | engine-to-engine SD "
          "(beyond the repeats; df) |")
    print("|---|---|---|---|---|---|---|")
    for (cell, vllm), engines in sorted(groups.items()):
        logs = [[math.log(v) for v in rps] for rps in engines]
        df = sum(len(x) - 1 for x in logs)
        within = math.sqrt(sum(sum((v - statistics.fmean(x)) ** 2 for v in x) for x in logs) / df) if df else None
        between = run_to_run_sd_estimate(engines) if len(engines) >= 2 else (None, 0)
        means = ", ".join(f"{statistics.fmean(r):.3f}" for r in engines)
        print(f"| {cell} | {vllm} | {len(engines)} | {sum(map(len, engines))} | {means} | {percent(within)} | "
              f"{percent(between[0])} ({between[1]}) |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
