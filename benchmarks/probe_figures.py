"""Measure the logprob-agreement probe of each KV-cache dtype against `auto` on a tiny model (real engine).

These figures set the gate's probe thresholds. One engine per dtype (about 30-60 s each on 2 CPU cores):

    PYTHONPATH=src VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/probe_figures.py \
        --model tiny-llama --dtypes auto fp8 fp8_e5m2 int8_per_token_head --out reports/probe-figures

The first dtype is the reference; it is probed in two separate engines, so the first row shows how
reproducible the probe is across engine starts (it must be exactly 0). Writes `<out>/<run>/probe.json`,
`<out>/figures.json` and `<out>/figures.md` (a Markdown table, also printed).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path


def probe_in_fresh_engine(model: str, kv_cache_dtype: str, folder: Path) -> dict:
    """Start an engine, probe it, write probe.json; runs in a child process so each engine exits fully."""
    from vllm import LLM

    from kvgate.results import probe_file
    from kvgate.runners.stages import probe
    from kvgate.workloads.tiny_models import resolve_model

    started = time.perf_counter()
    llm = LLM(model=resolve_model(model), kv_cache_dtype=kv_cache_dtype, max_model_len=1024, seed=0)
    start_s = time.perf_counter() - started
    try:
        started = time.perf_counter()
        record = probe.collect(llm)
        probe_s = time.perf_counter() - started
    finally:
        # Stop the engine processes here: a multiprocessing child otherwise waits for them forever at exit.
        llm.llm_engine.engine_core.shutdown()
    probe_file.write(record, folder)
    return {"start_s": round(start_s, 1), "probe_s": round(probe_s, 2)}


def _child(model: str, kv_cache_dtype: str, folder: str, results) -> None:
    results.put(probe_in_fresh_engine(model, kv_cache_dtype, Path(folder)))


def run_isolated(model: str, kv_cache_dtype: str, folder: Path) -> dict:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_child, args=(model, kv_cache_dtype, str(folder), results))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise SystemExit(f"ERROR probe of {model} with kv_cache_dtype {kv_cache_dtype} crashed "
                         f"(exit {process.exitcode})")
    return results.get()


def main(argv: list[str] | None = None) -> int:
    from kvgate.gate import probe_agreement
    from kvgate.results import probe_file

    parser = argparse.ArgumentParser(prog="benchmarks/probe_figures.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama", help="kvgate tiny model name or a model path")
    parser.add_argument("--dtypes", nargs="+", default=["auto", "fp8", "fp8_e5m2", "int8_per_token_head"])
    parser.add_argument("--out", type=Path, default=Path("reports/probe-figures"))
    args = parser.parse_args(argv)
    model = args.model if "/" in args.model or args.model.startswith("kvgate:") else f"kvgate:{args.model}"
    reference_dtype = args.dtypes[0]
    runs = [(f"{reference_dtype} (first)", reference_dtype), (f"{reference_dtype} (again)", reference_dtype)]
    runs += [(dtype, dtype) for dtype in args.dtypes[1:]]
    figures = []
    reference = None
    for label, dtype in runs:
        folder = args.out / label.replace(" ", "").replace("(", "-").replace(")", "")
        timing = run_isolated(model, dtype, folder)
        record = probe_file.read(folder / probe_file.FILE_NAME)
        if reference is None:
            reference = record
            continue
        agreement = probe_agreement.compare(reference, record)
        figures.append({"run": label, "kv_cache_dtype": dtype, **timing, **agreement.as_record()})
        print(f"{label}: {json.dumps(figures[-1])}", file=sys.stderr)
    (args.out / "figures.json").write_text(json.dumps({"model": model, "reference": reference_dtype,
                                                       "figures": figures}, indent=1) + "\n")
    lines = [f"Probe against a first `{reference_dtype}` engine, {model}, 16 prompts x 64 greedy tokens:", "",
             "| run | greedy token match | greedy prefix match | prompt logprob mean abs diff (max) "
             "| top-1 agreement | engine start s |",
             "|---|---|---|---|---|---|"]
    for row in figures:
        lines.append(f"| {row['run']} | {row['greedy_token_match']:.1%} | {row['greedy_prefix_match']:.1%} | "
                     f"{float(row['mean_abs_logprob_diff']):.4f} ({float(row['max_abs_logprob_diff']):.4f}) | "
                     f"{row['top1_agreement']:.1%} | {row['start_s']} |")
    table = "\n".join(lines) + "\n"
    (args.out / "figures.md").write_text(table)
    print(table)  # vLLM logs to stdout too: the table is also in <out>/figures.md
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
