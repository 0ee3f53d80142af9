"""Beside the gate, the statistics: the tests and designs that decide, shared by the gate (which judges) and the
runners (which stop a comparison early when the policy's sequential design has decided it). Pure.

Owns
    margins        the one-sided margin tests: paired accuracy (restricted-MLE saddlepoint), the accuracy floor
                   (exact binomial), throughput ratios (paired over interleaved rounds, or with the run-to-run SD),
                   multiplicity adjustments
    distributions  the normal (in log space, far into the tails), Student's t and the binomial, from scipy.special
    sequential     group-sequential comparisons: the boundaries, the runner's decide(), the gate's replay()
    power          the questions and repeats a check needs, its false alarms and power (exact)

The distributions, root finders and exact binomial figures are scipy's; kvgate keeps its own code only where
scipy has none: the saddlepoint tail of the paired difference b - c at Tango's restricted estimate (margins) and
the group-sequential boundaries by recursive integration (sequential).

numpy, scipy and the standard library only. It must never import another stage of kvgate (matrix, change, runners,
kernels, results, gate, report, workloads, cli) nor an engine (vLLM, torch, lm-eval).
"""
