"""Runners: the stages of a cell (kernels, accuracy + probe, throughput) run by the real tools.

Pure cores (no I/O, unit-tested):  commands (cell -> argv / model_args), engine_environment (the
environment an engine runs in), engine_log (which attention backend the log says ran), bench_log
(`vllm bench throughput`'s printed figures), backend_check (did the cell's backend really run?),
progress (the lines and the summary table).
Shells (I/O):  stage_process (a subprocess in its own process group, teed to the terminal and the
cell's log, killed whole on timeout), accuracy_worker (what runs inside the accuracy subprocess),
accuracy / throughput / kernels (one stage of one cell), run_record (run.json), matrix_run (every
selected cell, every stage, the exit status).
"""
