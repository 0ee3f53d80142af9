"""Detection per break size, from the H200 canary runs' measured discordance: the policy's group-sequential baseline
comparison (margin 1 point, kvgate.statistics.sequential, the looks of the cell's plan) replayed on simulated
question draws whose paired outcomes have the measured rates (only base right, only head right), and the same for
the head-vs-base A/A rate (false alarms). Prints one line per row.

    python benchmarks/h200_canaries/detection.py [--runs 4000] [--questions 1490 1619]
"""

from __future__ import annotations

import argparse

import numpy as np

from kvgate.gate import policy as policy_module
from kvgate.statistics import sequential

# (row, only base right, only head right, questions they were counted on): tests/fixtures/h200_canaries, head FP8
# cell against the base FP8 cell
MEASURED = [
    ("A/A (6 TRITON_MLA null runs, pooled)", 6, 0, 6 * 373),
    ("TRITON_MLA latent scale x0.95", 21, 9, 745),
    ("TRITON_MLA latent scale x0.9", 87, 21, 1118),
    ("TRITON_MLA latent scale x0.8", 162, 7, 373),
    ("FLASH_ATTN k_descale x0.9", 13, 5, 666),
    ("FLASH_ATTN v_descale x0.9", 17, 8, 666),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4000)
    parser.add_argument("--questions", type=int, nargs="+", default=[1490, 1619])
    args = parser.parse_args()
    acc = policy_module.load().accuracy
    rng = np.random.default_rng(20261201)
    for n in args.questions:
        looks = sequential.looks_for(n, acc.sequential.looks)
        design = sequential.design(tuple(looks), alpha=acc.alpha, beta=1 - acc.power,
                                   rho=acc.sequential.beta_spending_rho, margin_points=acc.baseline_margin_points,
                                   gap_points=acc.gap_points)
        for row, only_base, only_head, counted in MEASURED:
            p10, p01 = only_base / counted, only_head / counted
            failed, used = 0, 0
            for _ in range(args.runs):
                draw = rng.random(n)
                base = np.ones(n, dtype=bool)
                head = np.ones(n, dtype=bool)
                head[draw < p10] = False  # only base right
                base[(draw >= p10) & (draw < p10 + p01)] = False  # only head right
                result = sequential.replay(design, base, head)
                failed += result.decision == "fail"
                used += result.look.n
            print(f"n={n} looks {list(looks)} | {row}: drop {100 * (p10 - p01):.2f} pts, discordance "
                  f"{p10 + p01:.3f} -> fails {100 * failed / args.runs:.1f} % of {args.runs} draws, mean questions "
                  f"{used / args.runs:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
