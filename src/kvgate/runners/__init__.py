"""Stage 3 of kvgate's flow, the runners: the stages of a cell (kernels, accuracy + probe, throughput) run by
the real tools into the results folder.

Rooms, by role:
    environment/  the machine and the software an engine runs on: gpu (this machine's arch, the driver check),
                  cpu (the host's CPU as vLLM sees it, and the cells it cannot run), engine_venv (the shared
                  engine virtual environments), process_env (the environment of an engine subprocess), hub_cache
                  and prefetch (the Hugging Face cache a runner reads offline), engine_options (options only some
                  vLLMs have). gpu, cpu and engine_venv are stdlib only: the noxfile imports them.
    engine/       what a running engine says: log (its log lines), layers (what its attention layers hold),
                  backend_check (did the cell's backend really run?), bench_output (`vllm bench throughput`'s
                  printed figures). Pure: text or records in, evidence out.
    stages/       one stage of one cell: commands (cell -> argv / model_args, pure), tool_process (a subprocess
                  in its own process group, teed, killed whole on timeout), output_files (a finished stage into
                  its folder), accuracy + eval_process (what runs inside the accuracy subprocess) + probe,
                  throughput, kernels.
Here: matrix_run (every selected cell, every stage, the exit status), context (what a stage needs), outcome
(what it came to), progress (the lines and the summary table), run_record (run.json).

Runners may import the matrix, the change, the results, the workloads and the kernels; they must never import
the gate, the report or the CLI. vLLM, lm-eval and torch are imported only inside the processes that run them
(stages.eval_process) or inside the functions that need them.
"""
