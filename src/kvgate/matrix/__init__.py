"""Stage 1 of kvgate's flow, the matrix: which cells exist and what each one runs.

A cell is attention backend x kv_cache_dtype x GPU arch (x workload), declared as data in the TOML files of
the repository's `matrix/` folder. This package owns
    cells        `load()`: the TOML files -> a Matrix, every problem named
    declarations the records it is made of (archs, backends, workloads, exclusions, waivers, cells, the Matrix)
    host_requirements  what a cell needs from its host beyond the arch (a CPU's instruction sets, a head size)
    views        the matrix as other tools want it (a table, GitHub Actions' {"include": [...]})
    buildkite    the planned cells as a Buildkite pipeline in vLLM's CI conventions, and vLLM's step that uploads it
    toml_reading how every TOML file under matrix/ is read, so each problem names its file and place
    regular_files  the bounded reader of a file kvgate did not write (a regular file only, at most a cap), which
                 the TOML files', the results folder's, a vLLM tree's and the CLI's readers share

Stdlib only, so the noxfile can import it before anything is installed. It must never import another stage
of kvgate (runners, kernels, results, gate, report, workloads, cli) nor an engine (vLLM, torch, lm-eval);
tests/test_layout.py reads the imports and enforces it.
"""
