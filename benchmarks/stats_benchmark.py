"""Time the gate's statistics for a large run: 256 cells -> 128 FP8 comparisons + 256 baseline comparisons.

    PYTHONPATH=src python benchmarks/stats_benchmark.py [--tests 384] [--n 1319]

Per-question outcomes -> PairedCounts.from_outcomes -> margin_test (the saddlepoint p-value and both bounds,
each inverted by Brent's method) -> the rule; 256 throughput margin tests (unpaired, with the run-to-run SD);
the sequential design's boundaries (computed once per process); loading the policy. The whole gate must stay
under 5 s on the 2-core development machine (benchmarks/gate_benchmark.py times all of it); this is the
statistics' share. Prints the figures; asserts nothing. benchmarks/gate_simulation.py prints the error rates.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kvgate.gate import policy as policy_module
from kvgate.statistics import margins, sequential


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=384)
    parser.add_argument("--n", type=int, default=1319)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    reference = rng.random((args.tests, args.n)) < 0.65
    # unchanged code: 10 % of the questions flip, as many each way
    flip_probability = np.where(reference, 0.05 / 0.65, 0.05 / 0.35)
    candidate = reference ^ (rng.random((args.tests, args.n)) < flip_probability)

    start = time.perf_counter()
    policy = policy_module.load()
    acc = policy.accuracy
    loaded = time.perf_counter()
    tests = [margins.margin_test(margins.PairedCounts.from_outcomes(r, c), margin_points=acc.baseline_margin_points,
                               alpha=acc.alpha) for r, c in zip(reference, candidate, strict=True)]
    tested = time.perf_counter()
    failed = sum(margins.accuracy_regressed(t, alpha=acc.alpha) for t in tests)
    decided = time.perf_counter()
    ratios = [margins.unpaired_ratio_test(rng.normal(3.2, 0.03, 7), rng.normal(3.2, 0.03, 7), min_ratio=0.95,
                                        alpha=policy.throughput.alpha_unpaired,
                                        run_to_run_sd=policy.throughput.run_to_run_sd) for _ in range(256)]
    timed = time.perf_counter()
    sequential.boundaries(acc.sequential.looks, alpha=acc.alpha, beta=1 - acc.power,
                          rho=acc.sequential.beta_spending_rho)
    designed = time.perf_counter()
    print(f"policy.load (with the matrix): {1e3 * (loaded - start):.1f} ms")
    print(f"{args.tests} margin tests at n = {args.n}: {1e3 * (tested - loaded):.0f} ms "
          f"({1e3 * (tested - loaded) / args.tests:.3f} ms each, from_outcomes and both bounds included)")
    print(f"the rule: {1e3 * (decided - tested):.1f} ms ({failed} failed, unchanged data)")
    print(f"{len(ratios)} throughput margin tests (7 vs 7 repeats): {1e3 * (timed - decided):.1f} ms")
    print(f"sequential boundaries (once per process): {1e3 * (designed - timed):.0f} ms")
    print(f"total: {designed - start:.2f} s")


if __name__ == "__main__":
    main()
