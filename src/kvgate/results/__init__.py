"""Stage 4 of kvgate's flow, the results: the folder runners write and the gate reads.

The folder is a public format that other tools write too (docs/results-folder.md, versioned). This package
owns
    records      the typed records of a run: cell identity, stage status, accuracy, throughput, kernels
    cell_folder  the writer: each stage committed to a temporary folder and renamed into place
    parsers/     the readers of each tool's native output (lm-eval, vllm bench, JUnit, cell.json, status.json)
    probe_file   kvgate's own probe output format (probe/probe.json)
    schema       the contract's JSON Schemas (schemas/*.schema.json, draft 2020-12), one per file kvgate writes,
                 and a file against them as one error line
    run_loader   a whole run folder -> RunResults, every problem one line naming the file

It may import the matrix (for cell ids); it must never import the runners, the kernels, the gate, the
report, the workloads or the CLI, nor an engine (vLLM, torch, lm-eval). tests/test_layout.py enforces it.
"""
