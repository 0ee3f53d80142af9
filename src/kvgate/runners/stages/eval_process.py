"""What runs inside one cell's accuracy subprocess: lm-eval's gsm8k on vLLM, then kvgate's probe.

    python -m kvgate.runners.stages.eval_process --report R.json --probe-dir DIR --backend B --arch A \
        -- <arguments of `lm_eval run`>

The lm-eval arguments are parsed by lm-eval's own parser (so pass-through flags mean what lm-eval says);
the model is lm-eval's `vllm` model type, built here so that kvgate keeps the engine (`.model`, a
`vllm.LLM`) to ask which attention backend its layers really hold before anything is evaluated, and to run
the logprob-agreement probe on the same engine afterwards. Outputs are saved by lm-eval's
EvaluationTracker, in lm-eval's own layout. The report (JSON, rewritten after each step) tells the parent
what happened; exit status 0 ok, 3 the engine runs another backend than the cell's, else a crash.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

EXIT_BACKEND_MISMATCH = 3


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: python -m kvgate.runners.stages.eval_process [options] -- <lm_eval run arguments>",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    own = argparse.ArgumentParser(prog="kvgate.runners.stages.eval_process")
    own.add_argument("--report", type=Path, required=True)
    own.add_argument("--probe-dir", type=Path, default=None)
    own.add_argument("--backend", required=True)
    own.add_argument("--arch", required=True)
    options = own.parse_args(argv[:split])
    report: dict[str, Any] = {"steps": []}

    def save(step: str, **facts: Any) -> None:
        report["steps"].append(step)
        report.update(facts)
        tmp = options.report.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, options.report)

    # Before vLLM is imported: its engine process inherits it (see kvgate.runners.engine.layers).
    from kvgate.runners.engine.layers import INSECURE_SERIALIZATION_VARIABLE

    os.environ[INSECURE_SERIALIZATION_VARIABLE] = "1"
    save("started", pid=os.getpid())

    from lm_eval._cli import HarnessCLI
    from lm_eval.config.evaluate_config import EvaluatorConfig

    sys.argv = ["lm_eval", *argv[split + 1:]]
    args = HarnessCLI().parse_args()
    cfg = EvaluatorConfig.from_cli(args)

    import lm_eval.api.registry
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.utils import make_table

    from kvgate.runners.engine.backend_check import backend_mismatch
    from kvgate.runners.engine.layers import engine_backend_names, engine_kv_cache_facts
    from kvgate.runners.engine.log import BackendEvidence

    tracker = EvaluationTracker(output_path=cfg.output_path)
    task_manager = cfg.process_tasks(cfg.metadata)
    lm = lm_eval.api.registry.get_model(cfg.model).create_from_arg_obj(
        cfg.model_args, {"batch_size": cfg.batch_size, "max_batch_size": cfg.max_batch_size, "device": cfg.device})
    engine = getattr(lm, "model", None)  # lm-eval's vllm model keeps the vllm.LLM it built (data_parallel_size 1)

    try:
        names: list[str] | None = engine_backend_names(engine)
    except Exception as error:  # e.g. data-parallel lm-eval runs hold no LLM here: the log check remains
        names = None
        print(f"kvgate: cannot ask the engine for its attention backends ({type(error).__name__}: {error}); "
              f"the engine log decides", flush=True)
    mismatch = backend_mismatch(options.backend, options.arch, BackendEvidence(), names) if names else None
    try:  # after a first request too (below): some backends bind their cache tensors only when first used
        kv_cache: dict[str, Any] | None = engine_kv_cache_facts(engine)
    except Exception as error:
        kv_cache = None
        print(f"kvgate: cannot ask the engine for its KV cache ({type(error).__name__}: {error})", flush=True)
    import vllm

    save("engine", attention_backends=names, backend_mismatch=mismatch, vllm_file=vllm.__file__,
         vllm_version=getattr(vllm, "__version__", None), kv_cache=kv_cache)
    if names is not None:
        print(f"kvgate: the engine's attention layers use {', '.join(names) or 'no backend kvgate can see'}",
              flush=True)
    if mismatch:
        print(f"kvgate: {mismatch}", file=sys.stderr, flush=True)
        return EXIT_BACKEND_MISMATCH

    results = simple_evaluate(
        model=lm, model_args=cfg.model_args, tasks=cfg.tasks, num_fewshot=cfg.num_fewshot,
        batch_size=cfg.batch_size, max_batch_size=cfg.max_batch_size, device=cfg.device,
        use_cache=cfg.use_cache, limit=cfg.limit, samples=cfg.samples, check_integrity=cfg.check_integrity,
        write_out=cfg.write_out, log_samples=cfg.log_samples, evaluation_tracker=tracker,
        system_instruction=cfg.system_instruction, apply_chat_template=cfg.apply_chat_template,
        fewshot_as_multiturn=cfg.fewshot_as_multiturn, gen_kwargs=cfg.gen_kwargs, task_manager=task_manager,
        verbosity=cfg.verbosity, predict_only=cfg.predict_only,
        random_seed=cfg.seed[0] if cfg.seed else None, numpy_random_seed=cfg.seed[1] if cfg.seed else None,
        torch_random_seed=cfg.seed[2] if cfg.seed else None,
        fewshot_random_seed=cfg.seed[3] if cfg.seed else None,
        confirm_run_unsafe_code=cfg.confirm_run_unsafe_code, metadata=cfg.metadata,
    )
    if results is None:
        raise RuntimeError("lm-eval's simple_evaluate returned no results")
    samples = results.pop("samples") if cfg.log_samples else None
    tracker.save_results_aggregated(results=results, samples=samples)
    if samples is not None:
        for task_name in results["configs"]:
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    print(make_table(results), flush=True)
    try:
        after = engine_kv_cache_facts(engine)
    except Exception:
        after = None
    save("accuracy", kv_cache=after or report.get("kv_cache"))

    if options.probe_dir is not None:
        try:
            from kvgate.results import probe_file
            from kvgate.runners.stages import probe

            options.probe_dir.mkdir(parents=True, exist_ok=True)
            probe_file.write(probe.collect(engine), options.probe_dir)
        except Exception as error:  # the probe failing must not lose the accuracy results
            traceback.print_exc()
            save("probe-failed", probe_error=f"{type(error).__name__}: {error}")
        else:
            save("probe")
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's engine threads and atexit hooks can keep a finished process alive for a long time.
    os._exit(code)
