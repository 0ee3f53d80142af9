"""Time the gate's statistics for a large run: 256 cells x 2 filters x 2 checks = 1024 paired tests.

    PYTHONPATH=src python benchmarks/stats_benchmark.py [--tests 1024] [--n 1319]

Per-question outcomes -> PairedCounts.from_outcomes -> paired_drop_test (exact McNemar + 2000-sample paired
bootstrap) -> one BH adjustment over the run -> the rule; plus 256 throughput ratio tests and loading the
policy. The whole gate must stay under 5 s on the 2-core development machine (benchmarks/gate_benchmark.py
times all of it); this is the statistics' share. Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kvgate.gate import policy as policy_module
from kvgate.gate import stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=1024)
    parser.add_argument("--n", type=int, default=1319)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    reference = rng.random((args.tests, args.n)) < 0.65
    # unchanged code: 10 % of the questions flip, as many each way
    flip_probability = np.where(reference, 0.05 / 0.65, 0.05 / 0.35)
    candidate = reference ^ (rng.random((args.tests, args.n)) < flip_probability)

    start = time.perf_counter()
    policy = policy_module.load()
    loaded = time.perf_counter()
    tests = [stats.paired_drop_test(stats.PairedCounts.from_outcomes(r, c), n_boot=policy.accuracy.bootstrap_samples)
             for r, c in zip(reference, candidate, strict=True)]
    tested = time.perf_counter()
    adjusted = stats.adjust_p_values([t.p_value for t in tests], policy.accuracy.multiplicity)
    failed = sum(stats.accuracy_regressed(t, margin_points=1.0, alpha=policy.accuracy.alpha, adjusted_p=p)
                 for t, p in zip(tests, adjusted, strict=True))
    decided = time.perf_counter()
    ratios = [stats.ratio_test(rng.normal(3.2, 0.03, 3), rng.normal(3.2, 0.03, 3)) for _ in range(256)]
    timed = time.perf_counter()
    print(f"policy.load (with the matrix): {1e3 * (loaded - start):.1f} ms")
    print(f"{args.tests} paired tests at n = {args.n}: {1e3 * (tested - loaded):.0f} ms "
          f"({1e3 * (tested - loaded) / args.tests:.3f} ms each, from_outcomes included)")
    print(f"BH over {args.tests} + the rule: {1e3 * (decided - tested):.1f} ms ({failed} failed, unchanged data)")
    print(f"{len(ratios)} throughput ratio tests (3 vs 3 repeats): {1e3 * (timed - decided):.1f} ms")
    print(f"total: {timed - start:.2f} s")


if __name__ == "__main__":
    main()
