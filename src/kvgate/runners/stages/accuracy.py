"""The accuracy stage of one cell (and its probe): lm-eval's gsm8k on the cell's vLLM engine.

One subprocess (kvgate.runners.stages.eval_process) per cell, for fault isolation and a hard timeout. It
writes into a scratch folder; each stage's outputs are moved into place (kvgate.results.cell_folder.stage_output)
only when complete and only when the backend that ran is the cell's, so a crashed, killed or mismatched
run never leaves outputs that pass for whole ones.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvgate.results import cell_folder
from kvgate.runners.context import CellContext
from kvgate.runners.engine.backend_check import backend_mismatch
from kvgate.runners.engine.infrastructure import (
    infrastructure_failure,
    is_free_memory,
    retry_header,
    twice_failed_reason,
)
from kvgate.runners.engine.log import failure_cause, read_backend_evidence, read_kv_cache_tokens
from kvgate.runners.environment.memory_holders import other_gpu_processes
from kvgate.runners.environment.process_env import accuracy_engine_environment
from kvgate.runners.outcome import StageOutcome
from kvgate.runners.stages.commands import lm_eval_arguments, long_context_model_args
from kvgate.runners.stages.eval_process import EXIT_BACKEND_MISMATCH
from kvgate.runners.stages.output_files import commit_stage, fresh_log
from kvgate.runners.stages.tool_process import describe_exit, heartbeat_for, run_logged

STRICT, FLEXIBLE = "exact_match,strict-match", "exact_match,flexible-extract"


def run_accuracy(ctx: CellContext, *, with_probe: bool = True) -> list[StageOutcome]:
    """Outcomes of the accuracy stage and, with_probe, of the probe stage; status.json written for both."""
    cell, cell_dir = ctx.cell, ctx.cell_dir
    log = fresh_log(cell_dir, "accuracy")
    scratch = Path(tempfile.mkdtemp(prefix=".accuracy-work-", dir=cell_dir))
    start = time.monotonic()
    try:
        output, probe_dir, report_path = scratch / "accuracy", scratch / "probe", scratch / "worker.json"
        lm_args = lm_eval_arguments(cell, ctx.model_path, output, include_path=ctx.include_path,
                                    passthrough=ctx.passthrough, calculate_kv_scales=ctx.calculate_kv_scales)
        argv = [ctx.python, "-m", "kvgate.runners.stages.eval_process", "--report", str(report_path),
                "--backend", cell.backend, "--arch", cell.arch]
        if with_probe:
            argv += ["--probe-dir", str(probe_dir)]
        if ctx.design is not None:
            argv += ["--questions", str(ctx.design.questions)]
        long_lengths, long_skipped = long_context_lengths(cell)
        long_dir = scratch / "long_context"
        if long_lengths:
            long_plan = scratch / "long_context.json"
            long_plan.write_text(json.dumps({"design": cell.workload.long_context.as_record(),
                                             "lengths": list(long_lengths), "out": str(long_dir)}), encoding="utf-8")
            if ctx.long_context_model_path is None:  # gsm8k's engine asks it; else a process of its own, below
                argv += ["--long-context", str(long_plan)]
        if ctx.looks_plan is not None:
            plan_path = scratch / "looks.json"
            plan_path.write_text(json.dumps(ctx.looks_plan.as_dict(), indent=1), encoding="utf-8")
            argv += ["--looks-plan", str(plan_path)]
        argv += ["--", *lm_args]
        header = (f"kvgate: {cell.id} accuracy: lm_eval {' '.join(_shell_quote(a) for a in lm_args)}")
        env = accuracy_engine_environment(ctx.env, arch=cell.arch)

        def forget_the_first_attempt() -> None:
            shutil.rmtree(output, ignore_errors=True)
            report_path.unlink(missing_ok=True)

        result, infra_retries, infrastructure_again = _run_engine_process(
            ctx, argv, env, log, header, "engine start", forget_the_first_attempt, heartbeat=_heartbeat(ctx))
        elapsed = time.monotonic() - start
        report = _read_report(report_path)
        engine_backends = report.get("attention_backends")
        mismatch = backend_mismatch(cell.backend, cell.arch, read_backend_evidence(_read_text(log)),
                                    engine_backends)

        wrong_vllm = _wrong_vllm(ctx, report.get("vllm_file"))
        if result.timed_out:
            status, reason = "timeout", f"killed after its timeout of {ctx.timeout:.0f} s ({_last_step(report)})"
        elif wrong_vllm:
            status, reason = "error", wrong_vllm
        elif result.returncode == EXIT_BACKEND_MISMATCH or (result.ok and mismatch):
            status, reason = "error", f"wrong attention backend: {mismatch or 'the engine ran another backend'}"
        elif infrastructure_again:
            status, reason = "error", twice_failed_reason(infrastructure_again, other_gpu_processes(
                ctx.env) if is_free_memory(infrastructure_again) else None)
        elif not result.ok:
            cause = failure_cause(_read_text(log))
            status, reason = "error", (f"the accuracy run {describe_exit(result.returncode)} ({_last_step(report)})"
                                       + (f": {cause}" if cause else ""))
        elif not list(output.rglob("results_*.json")):
            status, reason = "error", "lm-eval wrote no results_*.json"
        else:
            status, reason = "ok", None

        if long_lengths and ctx.long_context_model_path is not None and status == "ok":
            found = _own_engine_long_context(ctx, argv, lm_args, env, log, long_plan, probe_dir if with_probe
                                             else None)
            report = {**report, **found, "steps": [*report.get("steps", []), *found["steps"]]}
            elapsed = time.monotonic() - start
        outcomes = []
        extra: dict[str, Any] = {"elapsed_s": round(elapsed, 1), "backend": cell.backend}
        if infra_retries:
            extra["infra_retries"] = infra_retries
        if engine_backends is not None:
            extra["engine_backends"] = engine_backends
        if report.get("vllm_file"):
            extra["vllm_file"] = report["vllm_file"]
        kv_cache = kv_cache_evidence(report.get("kv_cache"), read_kv_cache_tokens(_read_text(log)))
        if kv_cache:
            extra["kv_cache"] = kv_cache
        if ctx.design is not None:
            extra["question_plan"] = {**ctx.design.record(), **_answered(report.get("questions"))}
        if status == "ok":
            commit_stage(cell_dir, "accuracy", output)
            figures = accuracy_figures(cell_dir / "accuracy", str(cell.workload.gsm8k["task"]))
            cell_folder.write_status(cell_dir, "accuracy", "ok", **extra, **figures)
            outcomes.append(StageOutcome(cell_id=ctx.label, stage="accuracy", status="ok", elapsed=elapsed,
                                         headline=accuracy_headline(figures, extra.get("question_plan"))))
        else:
            cell_folder.write_status(cell_dir, "accuracy", status, reason, result.log_tail, **extra)
            outcomes.append(StageOutcome(cell_id=ctx.label, stage="accuracy", status=status, elapsed=elapsed,
                                         reason=reason))
        if long_lengths:
            outcomes.append(_long_context_outcome(ctx, status, report, long_dir, result.log_tail, elapsed,
                                                  long_lengths, long_skipped))
        elif long_skipped:
            reason = long_context_skip_reason(cell, long_skipped)
            cell_folder.write_status(cell_dir, "long_context", "skipped", reason)
            outcomes.append(StageOutcome(cell_id=ctx.label, stage="long_context", status="skipped", elapsed=0.0,
                                         reason=reason))
        if with_probe:
            outcomes.append(_probe_outcome(ctx, status, report, probe_dir, result.log_tail, elapsed))
        return outcomes
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _own_engine_long_context(ctx: CellContext, argv: list[str], lm_args: list[str], env: dict[str, str], log: Path,
                             plan: Path, probe_dir: Path | None) -> dict[str, Any]:
    """The passkey task in a process and engine of its own model (workloads long_context.model), after gsm8k's
    process has ended: the cell's backend, cache dtype and engine arguments, that model and its max_model_len. Its
    long prompts' probe records join the cell's probe.json. Returns what the report of the gsm8k run lacks for the
    long-context outcome (its steps, the engine's facts, or why it failed)."""
    from kvgate.runners.stages.eval_process import LONG_CONTEXT_PROBE

    cell = ctx.cell
    model_args = long_context_model_args(cell, str(ctx.long_context_model_path),
                                         calculate_kv_scales=ctx.calculate_kv_scales)
    at = lm_args.index("--model_args")
    long_lm_args = [*lm_args[:at + 1], json.dumps(model_args, sort_keys=False), *lm_args[at + 2:]]
    report_path = plan.with_name("long-context-worker.json")
    split = argv.index("--")
    long_argv = [*argv[:split], "--long-context", str(plan), "--long-context-only", "--", *long_lm_args]
    for flag in ("--questions", "--looks-plan"):  # gsm8k's plan, not the passkey task's
        if flag in long_argv[:split]:
            at = long_argv.index(flag)
            del long_argv[at:at + 2]
    if probe_dir is None and "--probe-dir" in long_argv:
        at = long_argv.index("--probe-dir")
        del long_argv[at:at + 2]
    long_argv[long_argv.index("--report") + 1] = str(report_path)
    lengths = json.loads(plan.read_text(encoding="utf-8"))["lengths"]
    # what this process runs: not gsm8k's lm_eval command (whose other arguments it carries unused), the passkey task
    header = (f"kvgate: {cell.id} long context: an engine of {cell.workload.long_context_model} asks kvgate's passkey "
              f"task at {', '.join(map(str, lengths))} tokens, model_args {_shell_quote(json.dumps(model_args))}")

    def forget_the_first_attempt() -> None:
        report_path.unlink(missing_ok=True)
        shutil.rmtree(json.loads(plan.read_text(encoding="utf-8"))["out"], ignore_errors=True)
        if probe_dir is not None:
            (probe_dir / LONG_CONTEXT_PROBE).unlink(missing_ok=True)

    result, retries, infrastructure_again = _run_engine_process(
        ctx, long_argv, env, log, header, "long-context engine start", forget_the_first_attempt, heartbeat=None)
    report = _read_report(report_path)
    found: dict[str, Any] = {"steps": report.get("steps", []),
                             "long_context_engine": report.get("long_context_engine"),
                             "long_context_infra_retries": retries}
    if infrastructure_again:
        found["long_context_error"] = twice_failed_reason(infrastructure_again, other_gpu_processes(
            ctx.env) if is_free_memory(infrastructure_again) else None)
    elif report.get("long_context_error"):
        found["long_context_error"] = report["long_context_error"]
    elif result.timed_out:
        found["long_context_error"] = f"its engine was killed after its timeout of {ctx.timeout:.0f} s"
    elif result.returncode == EXIT_BACKEND_MISMATCH:
        found["long_context_error"] = (f"its engine ran another backend than {cell.backend}: "
                                       f"{report.get('backend_mismatch') or report.get('attention_backends')}")
    elif not result.ok:
        cause = failure_cause(_read_text(log))
        found["long_context_error"] = (f"its engine's process {describe_exit(result.returncode)} "
                                       f"({_last_step(report)})" + (f": {cause}" if cause else ""))
    records = probe_dir / LONG_CONTEXT_PROBE if probe_dir is not None else None
    if records is not None and records.is_file() and (probe_dir / "probe.json").is_file():
        from kvgate.results import probe_file

        probe = json.loads((probe_dir / "probe.json").read_text(encoding="utf-8"))
        probe["long_context"] = json.loads(records.read_text(encoding="utf-8"))
        probe_file.write(probe, probe_dir)
        records.unlink()
    return found


def _run_engine_process(ctx: CellContext, argv: list[str], env: dict[str, str], log: Path, header: str, run: str,
                        forget_the_first_attempt: Callable[[], None], *, heartbeat: Any
                        ) -> tuple[Any, list[dict[str, str]], str | None]:
    """Run an engine's process; when the machine refused its start (the engine never came up and the cause is the
    machine's, e.g. vLLM's memory-profiling race on a shared GPU), nothing was answered yet: forget the first
    attempt's outputs and start it once more. Returns (its result, the retries for status.json infra_retries, why
    the second start failed on the machine too, which is the stage's error, never a regression)."""
    attempt = len(_read_text(log))
    result = run_logged(argv, env=env, logs=[log], timeout=ctx.timeout, echo=ctx.echo, header=header,
                        heartbeat=heartbeat)
    infrastructure = None if result.ok or result.timed_out else infrastructure_failure(_read_text(log)[attempt:])
    if not infrastructure:
        return result, [], None
    forget_the_first_attempt()
    attempt = len(_read_text(log))
    result = run_logged(argv, env=env, logs=[log], timeout=ctx.timeout, echo=ctx.echo, heartbeat=heartbeat,
                        header=f"{header}\n{retry_header(infrastructure)}")
    again = None if result.ok or result.timed_out else infrastructure_failure(_read_text(log)[attempt:])
    return result, [{"run": run, "reason": infrastructure}], again


def _heartbeat(ctx: CellContext):
    """Every minute while lm-eval runs: the questions answered of the plan's, the time so far and the ETA."""
    return heartbeat_for(f"{ctx.label} accuracy", echo=ctx.echo, alone=ctx.heartbeat_alone, count_questions=True,
                         questions=ctx.design.questions if ctx.design is not None else None)


def _answered(worker: Any) -> dict[str, Any]:
    """The worker's figures of the questions it answered (answered, seconds, each look's decisions), as far as they
    are well formed (the gate re-reads and checks them)."""
    if not isinstance(worker, dict):
        return {"answered": 0}
    keep = ("answered", "seconds", "decisions", "questions_saved", "seconds_saved_estimate")
    return {key: worker[key] for key in keep if key in worker}


def _wrong_vllm(ctx: CellContext, vllm_file: str | None) -> str | None:
    """Why the engine did not run the vLLM under test (None when it did, or when kvgate cannot tell)."""
    overlay = ctx.vllm.overlay if ctx.vllm is not None else None
    if not vllm_file:
        return None
    loaded = Path(vllm_file).resolve()
    if overlay is not None and not loaded.is_relative_to(overlay.resolve()):
        return f"the engine imported vllm from {loaded.parent}, not from the vLLM under test ({overlay})"
    return None


def long_context_lengths(cell: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the long-context lengths this cell runs, those its max_model_len cannot hold); both empty without the task."""
    return cell.workload.long_context_lengths


def long_context_skip_reason(cell: Any, lengths: tuple[int, ...]) -> str:
    from kvgate.runners.stages.commands import engine_max_model_len

    long_context = cell.workload.long_context
    own = long_context is not None and long_context.model is not None
    where = f"workloads.{cell.workload.name}{'.long_context' if own else ''}"
    return (f"planned out: the passkey lengths {', '.join(map(str, lengths))} do not fit max_model_len "
            f"{long_context.max_model_len if own else engine_max_model_len(cell)} of "
            f"{cell.workload.long_context_model} ({where}); a model with longer positions runs them "
            f"(long_context.model, e.g. kvgate:tiny-llama-long)")


def _long_context_outcome(ctx: CellContext, accuracy_status: str, report: dict, out: Path, log_tail: str,
                          elapsed: float, lengths: tuple[int, ...], skipped: tuple[int, ...]) -> StageOutcome:
    """The long-context task ran in the accuracy stage's engine, or after it in an engine of its own model
    (long_context.model): its outputs committed as `long_context/`, with its accuracy per length bucket in
    status.json."""
    from kvgate.workloads import passkey

    cell_dir = ctx.cell_dir
    if accuracy_status != "ok":
        status, reason = accuracy_status, "not run: the accuracy stage failed (see its reason)"
    elif report.get("long_context_error"):
        status, reason = "error", f"the long-context task failed: {report['long_context_error']}"
    elif "long-context" not in report.get("steps", []) or not list(out.rglob("results_*.json")):
        status, reason = "error", "the long-context task wrote no results_*.json"
    else:
        status, reason = "ok", None
    extra: dict[str, Any] = {"lengths": list(lengths)}
    long_context = ctx.cell.workload.long_context
    if long_context is not None and long_context.model is not None:  # 1.12: an engine of its own answered it
        extra["model"] = long_context.model
        if report.get("long_context_engine"):
            extra["engine"] = report["long_context_engine"]
    if report.get("long_context_infra_retries"):
        extra["infra_retries"] = report["long_context_infra_retries"]
    if skipped:
        extra["lengths_planned_out"] = {"lengths": list(skipped), "reason": long_context_skip_reason(
            ctx.cell, skipped)}
    if status != "ok":
        cell_folder.write_status(cell_dir, "long_context", status, reason, log_tail, **extra)
        return StageOutcome(cell_id=ctx.label, stage="long_context", status=status, elapsed=elapsed, reason=reason)
    records = []
    for path in out.rglob(f"samples_{passkey.TASK_NAME}_*.jsonl"):
        records += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    buckets = passkey.bucket_accuracy(records)
    figures = accuracy_figures(out, passkey.TASK_NAME)
    commit_stage(cell_dir, "long_context", out)
    cell_folder.write_status(cell_dir, "long_context", "ok", **extra, **figures, buckets=buckets)
    shown = ", ".join(f"{_tokens(int(n))} {b['correct']}/{b['n']}" for n, b in buckets.items())
    return StageOutcome(cell_id=ctx.label, stage="long_context", status="ok", elapsed=elapsed,
                        headline=f"passkey strict {figures.get('strict_match', float('nan')):.3f} ({shown})")


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _probe_outcome(ctx: CellContext, accuracy_status: str, report: dict,
                   probe_dir: Path, log_tail: str, elapsed: float) -> StageOutcome:
    cell_dir = ctx.cell_dir
    if accuracy_status != "ok":
        status, reason = accuracy_status, "not run: the accuracy stage failed (see its reason)"
    elif report.get("probe_error"):
        status, reason = "error", f"the probe failed: {report['probe_error']}"
    elif "probe" not in report.get("steps", []) or not probe_dir.is_dir() or not any(probe_dir.iterdir()):
        status, reason = "error", "the probe wrote nothing"
    else:
        status, reason = "ok", None
    if status == "ok":
        commit_stage(cell_dir, "probe", probe_dir)
        cell_folder.write_status(cell_dir, "probe", "ok")
    else:
        cell_folder.write_status(cell_dir, "probe", status, reason, log_tail)
    return StageOutcome(cell_id=ctx.label, stage="probe", status=status, elapsed=elapsed, reason=reason)


def kv_cache_evidence(layers: Any, logged_tokens: list[int]) -> dict[str, Any]:
    """status.json's `kv_cache`: what the engine's layers held (engine_backends.layer_kv_cache_facts) and the
    KV cache size in tokens its log reported (the last engine start's)."""
    evidence: dict[str, Any] = {}
    if isinstance(layers, dict):
        for key in ("layers", "layer_kv_cache_dtypes", "tensor_dtypes", "element_bytes"):
            if key in layers:
                evidence[key] = layers[key]
        for key in ("k_scales", "v_scales"):  # 1.7: what the layers write and read their cache with
            if layers.get(key):
                evidence[key] = layers[key]
        if layers.get("bytes_per_token"):  # 1.9: from the engine's KV cache spec
            evidence["bytes_per_token"] = layers["bytes_per_token"]
    if logged_tokens:
        evidence["tokens"] = logged_tokens[-1]
    return evidence


def accuracy_figures(accuracy_dir: Path, task: str) -> dict[str, Any]:
    """gsm8k strict/flexible exact match and the number of questions, from lm-eval's newest results file."""
    files = sorted(accuracy_dir.rglob("results_*.json"), key=lambda p: p.name)
    if not files:
        return {}
    data = json.loads(files[-1].read_text(encoding="utf-8"))
    scores = data.get("results", {}).get(task, {})
    figures: dict[str, Any] = {}
    if isinstance(scores.get(STRICT), (int, float)):
        figures["strict_match"] = scores[STRICT]
    if isinstance(scores.get(FLEXIBLE), (int, float)):
        figures["flexible_extract"] = scores[FLEXIBLE]
    n = data.get("n-samples", {}).get(task, {}).get("effective")
    if isinstance(n, int):
        figures["questions"] = n
    return figures


def accuracy_headline(figures: dict[str, Any], plan: dict[str, Any] | None = None) -> str:
    def fmt(key: str) -> str:
        value = figures.get(key)
        return f"{value:.3f}" if isinstance(value, (int, float)) else "?"

    n = f"n={figures.get('questions', '?')}"
    if isinstance(plan, dict) and plan.get("questions_saved"):
        saved = plan.get("seconds_saved_estimate")
        n += (f" of {plan.get('questions')}: decided at a look, {plan['questions_saved']} questions"
              + (f" (~{saved:.0f} s)" if isinstance(saved, (int, float)) else "") + " saved")
    return f"gsm8k strict {fmt('strict_match')} flexible {fmt('flexible_extract')} ({n})"


def _read_report(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _last_step(report: dict) -> str:
    steps = report.get("steps") or []
    names = {"started": "before the engine was up", "engine": "after the engine started, during lm-eval",
             "accuracy": "after lm-eval finished, during the probe", "probe": "after the probe",
             "probe-failed": "after the probe failed"}
    return names.get(steps[-1], steps[-1]) if steps else "before the worker started"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _shell_quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
