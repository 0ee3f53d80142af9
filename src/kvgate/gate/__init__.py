"""Stage 4 of kvgate's flow, the gate: a run's results + the policy -> one verdict, pure.

Owns
    checks    the evaluation: one check per (cell, kind[, subject]), decided together (`evaluate`)
    stats     the statistical tests (paired accuracy tests, throughput ratio tests, multiplicity)
    policy    matrix/policy.toml: every threshold with what it buys
    power     what a threshold can detect for a number of questions (and the Monte Carlo behind it)
    verdict   the verdict and its versioned JSON form (verdict.json)

No I/O here: the CLI reads the files and writes the reports. It may import the matrix and the results; it
must never import the runners, the kernels, the report, the workloads or the CLI, nor an engine (vLLM,
torch, lm-eval). tests/test_layout.py enforces it.
"""
