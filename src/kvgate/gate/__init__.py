"""Stage 5 of kvgate's flow, the gate: a run's results + the policy -> one verdict, pure.

Owns
    evaluation  one check per (cell, kind[, subject]), decided together (`evaluate`); the checks about the run
    checks/     the check families: health, accuracy (+ pairing), throughput, probe, kv_cache, waivers, and what
                they share (pending decisions, formatting)
    policy      matrix/policy.toml: every threshold with what it buys
    verdict     the verdict and its versioned JSON form (verdict.json)

The statistics it decides with are kvgate.statistics. No I/O here: the CLI reads the files and writes the
reports. It may import the matrix, the results and the statistics; it must never import the runners, the
kernels, the report, the workloads or the CLI, nor an engine (vLLM, torch, lm-eval). tests/test_layout.py
enforces it.
"""
