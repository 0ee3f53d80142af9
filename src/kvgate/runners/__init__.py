"""Stage 2 of kvgate's flow, the runners: the stages of a cell (kernels, accuracy + probe, throughput) run by
the real tools into the results folder.

Pure cores (no I/O, unit-tested):  commands (cell -> argv / model_args), engine_environment (the
environment an engine runs in: INFO logs, the hub offline, no token), engine_log (which attention backend the
log says ran), bench_log (`vllm bench throughput`'s printed figures), backend_check (did the cell's backend
really run?), progress (the lines and the summary table).
Shells (I/O):  stage_process (a subprocess in its own process group, teed to the terminal and the
cell's log, killed whole on timeout), accuracy_worker (what runs inside the accuracy subprocess),
accuracy / throughput / kernels (one stage of one cell), run_record (run.json), matrix_run (every
selected cell, every stage, the exit status).
The machine: hardware (this machine's arch and driver check; stdlib only), engine_env (the shared engine
virtual environments, stdlib only, so the noxfile can import both), hub_cache (the Hugging Face cache a runner
reads offline: is a cell's model and dataset there?), prefetch (`kvgate prefetch` fills it), engine_options
(options passed only to a vLLM that has them: calculate_kv_scales), vllm_drift (the matrix's declared support
against the installed vLLM's backend classes).

Runners may import the matrix, the results, the workloads and the kernels; they must never import the
gate, the report or the CLI.
vLLM, lm-eval and torch are imported only inside the processes that run them (accuracy_worker) or inside
the functions that need them.
"""
