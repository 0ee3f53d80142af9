"""Throughput noise of a `kvgate run throughput` results folder: per cell, each measured repeat's figures (every
repeat is its own fresh engine: `vllm bench throughput` starts one), the SD of log requests/s between them, and the
power that noise gives the policy's throughput rule at 5/10/15 % slowdowns, interleaved A/B (paired by round) and
against a stored baseline. Usage: python3 figures.py RUN_DIR [MORE_RUN_DIRS...] (two or more runs of the same cells
also give the SD between runs, kvgate.statistics.margins.run_to_run_sd_estimate). Prints Markdown."""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from kvgate.gate import policy as policy_file
from kvgate.results.parsers.vllm_bench import is_pytorch_format, parse_output_json
from kvgate.statistics import margins, power

ROOT = Path(__file__).resolve().parents[2]
SLOWDOWNS = (0.05, 0.10, 0.15)


def repeats_of(run_dir: Path) -> dict[str, list]:
    """cell id -> its measured repeats, in file-name order."""
    cells: dict[str, list] = defaultdict(list)
    for path in sorted(run_dir.glob("**/throughput/*.json")):
        if is_pytorch_format(path.name):
            continue
        cell = path.parent.parent.name
        cells[cell].append(parse_output_json(path.read_text(encoding="utf-8"), str(path)))
    return dict(cells)


def log_sd(values: list[float]) -> float:
    return statistics.stdev([math.log(v) for v in values]) if len(values) > 1 else float("nan")


def main(run_dirs: list[Path]) -> int:
    policy = policy_file.load().throughput
    runs = [repeats_of(d) for d in run_dirs]
    cells = sorted({cell for run in runs for cell in run})
    if not cells:
        print(f"no throughput repeats under {', '.join(map(str, run_dirs))}")
        return 1
    print("| cell | run | repeats | requests/s each | mean | SD of log req/s | total tok/s mean | seconds each run |")
    print("|---|---|---|---|---|---|---|---|")
    sds = {}
    for cell in cells:
        pooled = []
        for index, run in enumerate(runs):
            repeats = run.get(cell, [])
            if not repeats:
                continue
            rps = [r.requests_per_second for r in repeats]
            pooled.append(rps)
            out_tps = [r.tokens_per_second for r in repeats]
            print(f"| {cell} | {index + 1} | {len(rps)} | {', '.join(f'{v:.2f}' for v in rps)} | "
                  f"{statistics.fmean(rps):.2f} | {100 * log_sd(rps):.2f} % | {statistics.fmean(out_tps):.0f} | "
                  f"{', '.join(f'{r.elapsed_time:.1f}' for r in repeats)} |")
        within = [math.log(v) - statistics.fmean(math.log(x) for x in run) for run in pooled for v in run]
        df = sum(len(run) - 1 for run in pooled)
        repeat_sd = math.sqrt(sum(d * d for d in within) / df) if df > 0 else float("nan")
        between = margins.run_to_run_sd_estimate(pooled) if len(pooled) > 1 else None
        sds[cell] = (repeat_sd, df, between)
    print()
    print(f"Power of the policy's throughput rule (tolerance {100 * policy.tolerance:g} %, interleaved alpha "
          f"{policy.alpha:g} over {policy.rounds} rounds; stored baseline alpha {policy.alpha_unpaired:g} with "
          f"run-to-run SD {100 * policy.run_to_run_sd:g} % unless measured below):")
    print()
    print("| cell | repeat SD (df) | run-to-run SD (df) | " +
          " | ".join(f"A/B {100 * s:g} %" for s in SLOWDOWNS) + " | " +
          " | ".join(f"stored {100 * s:g} %" for s in SLOWDOWNS) + " | A/B false alarm |")
    print("|---|---|---|" + "---|" * (2 * len(SLOWDOWNS) + 1))
    for cell, (repeat_sd, df, between) in sds.items():
        run_sd = between[0] if between else policy.run_to_run_sd
        ab = [power.paired_rounds_power(policy.rounds, repeat_sd=repeat_sd, tolerance=policy.tolerance, slowdown=s,
                                        alpha=policy.alpha) for s in SLOWDOWNS]
        stored = [power.stored_power(policy.rounds, repeat_sd=repeat_sd, run_to_run_sd=run_sd,
                                     tolerance=policy.tolerance, slowdown=s, alpha=policy.alpha_unpaired)
                  for s in SLOWDOWNS]
        null = power.paired_rounds_power(policy.rounds, repeat_sd=repeat_sd, tolerance=policy.tolerance, slowdown=0.0,
                                         alpha=policy.alpha)
        between_text = f"{100 * between[0]:.2f} % ({between[1]})" if between else "one run: not measured"
        print(f"| {cell} | {100 * repeat_sd:.2f} % ({df}) | {between_text} | " +
              " | ".join(f"{100 * p:.1f} %" for p in ab) + " | " + " | ".join(f"{100 * p:.1f} %" for p in stored) +
              f" | {null:.1e} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main([Path(a) for a in sys.argv[1:]]))
