"""Beside the gate, the history of main: every gate run on main as rows, and the shifts no single run crossed.

Owns
    record   a verdict -> one history run (its commit, vLLM, environment) and its figures per cell (accuracy
             with its interval, throughput medians, the median time of each timed kernel case, which the CLI reads
             from the cell's kernels/timings.json); which runs belong to main (run.json `branch`)
    store    where the rows live: an embedded SQLite file by default, PostgreSQL (psycopg 3) when
             KVGATE_HISTORY_URL names a server; one schema, migrated by version
    detect   e-divisive change points over a cell's series, by Apache Otava's implementation, with p-values
    trends   the series as a text table and as an SVG plot per cell, change points marked; which of a cell's
             series report.html's "History of main" draws

Every module but `store` is pure; `store` is the only I/O. It may import the results and the gate (the verdict it
records); it must never import the runners, the kernels, the workloads, the report or the CLI, nor an engine
(vLLM, torch, lm-eval). tests/test_layout.py enforces it.
"""
