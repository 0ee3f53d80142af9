"""Detection rate and false alarms of `kvgate history --detect` over synthetic histories of main.

    PYTHONPATH=src python benchmarks/history_change_points.py [--histories 200] [--noise 0.01 0.02 0.03]

Each history is 60 runs of one measure (throughput, say) with Gaussian run-to-run noise of the given coefficient of
variation. A "step" history loses 4 % from run 30 on (0-based: runs 30..59 are the new level); a "noise" history
never moves. A step is found when a change point lands at run 30 +- 1; any change point in a noise history is a
false alarm. Detection is kvgate.history.detect (Apache Otava's e-divisive, p < 1e-5, window 50), so Otava must be
importable (`pip install --no-deps apache-otava==0.8.0`). Prints the figures; asserts nothing
(tests/test_history.py checks one history of each kind).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kvgate.history import detect

RUNS, STEP_AT, STEP = 60, 30, -0.04


def synthetic_history(rng: np.random.Generator, *, noise: float, step: float = STEP, runs: int = RUNS,
                      step_at: int = STEP_AT, level: float = 100.0) -> list[float]:
    """`runs` figures around `level` with relative noise `noise`; from `step_at` on the level is (1 + step) times."""
    levels = np.where(np.arange(runs) >= step_at, level * (1 + step), level)
    return list(levels * (1 + noise * rng.standard_normal(runs)))


def found_at(points: list[detect.ChangePoint], index: int, tolerance: int = 1) -> bool:
    return any(abs(p.index - index) <= tolerance for p in points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=200)
    parser.add_argument("--noise", type=float, nargs="+", default=[0.01, 0.02, 0.03],
                        help="run-to-run coefficients of variation to try")
    parser.add_argument("--max-p-value", type=float, default=detect.MAX_P_VALUE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{args.histories} histories of {RUNS} runs each kind; step {STEP:+.0%} at run {STEP_AT}; "
          f"Otava e-divisive, p < {args.max_p_value}, window {detect.WINDOW}")
    print("noise CV | step found at 30+-1 | step missed or misplaced | noise histories with a false alarm | s/history")
    for noise in args.noise:
        rng = np.random.default_rng(args.seed)
        found = alarms = 0
        began = time.perf_counter()
        for _ in range(args.histories):
            found += found_at(detect.change_points(synthetic_history(rng, noise=noise), max_p_value=args.max_p_value),
                             STEP_AT)
            alarms += bool(detect.change_points(synthetic_history(rng, noise=noise, step=0.0),
                                                max_p_value=args.max_p_value))
        seconds = (time.perf_counter() - began) / (2 * args.histories)
        print(f"{noise:8.0%} | {found:4d}/{args.histories} ({found / args.histories:6.1%}) | "
              f"{args.histories - found:4d} | {alarms:4d}/{args.histories} ({alarms / args.histories:5.1%}) | "
              f"{seconds:.4f}")


if __name__ == "__main__":
    main()
