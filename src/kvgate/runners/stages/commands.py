"""A cell's tool invocations, built but not run: lm-eval's arguments and `vllm bench throughput`'s argv.

Pure. The model path is passed in (kvgate.workloads.tiny_models resolves "kvgate:<name>" to a local folder first),
and so are the places outputs go. Pass-through flags come last, so `--limit 250` overrides the workload's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate.matrix.cells import Cell
from kvgate.matrix.declarations import DEFAULT_MAX_MODEL_LEN

LOCAL_GSM8K_TASK = "kvgate_gsm8k_local"  # kvgate.workloads.gsm8k_local's task: lm-eval's gsm8k over local data
HUB_POOL_GSM8K_TASK = "kvgate_gsm8k_test_train"  # kvgate.workloads.gsm8k_pool's: gsm8k's test then train split
VLLM_CLI = ("-m", "vllm.entrypoints.cli.main")  # `vllm` without relying on the venv's bin/ being on PATH


def engine_model_args(cell: Cell, model_path: str, *, calculate_kv_scales: bool | None = None) -> dict[str, Any]:
    """vLLM engine arguments of a cell (lm-eval's vllm model passes them to `vllm.LLM(...)`).

    The backend is chosen by the engine argument `attention_backend`, never the environment variable
    VLLM_ATTENTION_BACKEND, which vLLM >= 0.26 silently ignores. calculate_kv_scales is passed when given
    (FP8 cells, against a vLLM that has the option: kvgate.runners.environment.engine_options). A cell of the
    feature axis adds its feature's engine arguments last (matrix/axes.toml features.<name>.engine_args).
    """
    workload_args = dict(cell.workload.model_args)
    args: dict[str, Any] = {
        "pretrained": model_path,
        "kv_cache_dtype": cell.kv_cache_dtype,
        "attention_backend": cell.backend,
        "trust_remote_code": bool(workload_args.pop("trust_remote_code", False)),
        "max_model_len": workload_args.pop("max_model_len", DEFAULT_MAX_MODEL_LEN),
    }
    if calculate_kv_scales is not None:
        args["calculate_kv_scales"] = calculate_kv_scales
    args.update(workload_args)
    args.update(cell.engine_args)
    return args


def engine_max_model_len(cell: Cell) -> int:
    """The max_model_len the cell's accuracy engine runs with."""
    return cell.workload.max_model_len


def long_context_model_args(cell: Cell, model_path: str, *,
                            calculate_kv_scales: bool | None = None) -> dict[str, Any]:
    """lm-eval's `vllm` model arguments of the passkey task's own engine (workloads long_context.model): the cell's
    (backend, kv_cache_dtype, the workload's and the feature's engine arguments) with that model and its
    max_model_len."""
    long_context = cell.workload.long_context
    assert long_context is not None and long_context.model is not None
    args = lm_eval_model_args(cell, model_path, calculate_kv_scales=calculate_kv_scales)
    args["max_model_len"] = long_context.max_model_len
    return args


def lm_eval_model_args(cell: Cell, model_path: str, *, calculate_kv_scales: bool | None = None) -> dict[str, Any]:
    """lm-eval's `vllm` model arguments: the engine's, plus lm-eval's own where the workload sets them
    (add_bos_token, as vLLM's CI passes it for hub models; it is not an engine argument)."""
    args = engine_model_args(cell, model_path, calculate_kv_scales=calculate_kv_scales)
    if "add_bos_token" in cell.workload.gsm8k:
        args["add_bos_token"] = bool(cell.workload.gsm8k["add_bos_token"])
    return args


def lm_eval_arguments(cell: Cell, model_path: str, output_path: Path, *, include_path: Path | None = None,
                      passthrough: Sequence[str] = (), calculate_kv_scales: bool | None = None) -> list[str]:
    """Arguments of `lm_eval run` for a cell's gsm8k: vllm model, n-shot, greedy, samples logged."""
    gsm8k = cell.workload.gsm8k
    argv = [
        "run",
        "--model", "vllm",
        "--model_args", json.dumps(lm_eval_model_args(cell, model_path, calculate_kv_scales=calculate_kv_scales),
                                   sort_keys=False),
        "--tasks", str(gsm8k["task"]),
        "--num_fewshot", str(gsm8k["num_fewshot"]),
        "--batch_size", str(gsm8k["batch_size"]),
        "--output_path", str(output_path),
        "--log_samples",
    ]
    if gsm8k.get("limit"):
        argv += ["--limit", str(gsm8k["limit"])]
    if gsm8k.get("max_gen_toks"):
        argv += ["--gen_kwargs", f"max_gen_toks={int(gsm8k['max_gen_toks'])}"]
    if include_path is not None:
        argv += ["--include_path", str(include_path)]
    return argv + list(passthrough)


@dataclass(frozen=True, kw_only=True, slots=True)
class ThroughputDesign:
    """How a cell side's throughput is measured (matrix/workloads.toml `throughput`): `engines` engine starts, each a
    warm-up of `warmup_output_len` tokens a prompt, then `repeats` measured repeats of the workload."""

    engines: int
    repeats: int
    warmup_output_len: int

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> ThroughputDesign:
        return cls(engines=int(settings.get("engines", 1)), repeats=int(settings["repeats"]),
                   warmup_output_len=int(settings.get("warmup_output_len", DEFAULT_WARMUP_OUTPUT_LEN)))

    def as_record(self) -> dict[str, int]:
        return {"engines": self.engines, "repeats_per_engine": self.repeats,
                "warmup_output_len": self.warmup_output_len}


DEFAULT_WARMUP_OUTPUT_LEN = 32


def bench_throughput_arguments(cell: Cell, model_path: str, passthrough: Sequence[str] = (), *,
                               calculate_kv_scales: bool | None = None) -> list[str]:
    """The arguments of `vllm bench throughput` for a cell's workload (its throughput stage's engine arguments: the
    workload's, then its throughput table's `engine_args`, then `load_format = "dummy"` for dummy weights)."""
    settings = cell.workload.throughput
    engine = engine_model_args(cell, model_path, calculate_kv_scales=calculate_kv_scales)
    engine.update(settings.get("engine_args", {}))
    if settings.get("weights") == "dummy":
        engine["load_format"] = "dummy"
    argv = ["--model", engine.pop("pretrained"), "--dataset-name", str(settings["dataset_name"])]
    if settings["dataset_name"] == "random":
        argv += ["--random-input-len", str(settings["random_input_len"]),
                 "--random-output-len", str(settings["random_output_len"])]
    else:
        argv += ["--input-len", str(settings["random_input_len"]),
                 "--output-len", str(settings["random_output_len"])]
    argv += ["--num-prompts", str(settings["num_prompts"])]
    return argv + engine_flags(engine) + list(passthrough)


def bench_throughput_argv(python: str, cell: Cell, model_path: str, output_json: Path | None,
                          passthrough: Sequence[str] = (), *, calculate_kv_scales: bool | None = None) -> list[str]:
    """`vllm bench throughput` for one run of a cell's workload in a fresh engine (output_json None: no JSON file):
    what one repeat of the stage amounts to, for people to run by hand."""
    argv = [python, *VLLM_CLI, "bench", "throughput",
            *bench_throughput_arguments(cell, model_path, passthrough, calculate_kv_scales=calculate_kv_scales)]
    return [*argv, *(["--output-json", str(output_json)] if output_json is not None else [])]


def throughput_repeats_argv(python: str, cell: Cell, model_path: str, *, out: Path, summary: Path,
                            first_repeat: int, design: ThroughputDesign, passthrough: Sequence[str] = (),
                            calculate_kv_scales: bool | None = None, allow_shared_gpu: bool = False) -> list[str]:
    """One engine of a cell side's throughput stage (kvgate.runners.engine.throughput_repeats): its warm-up and
    `design.repeats` measured repeats numbered from first_repeat, into `out`."""
    argv = [python, "-m", "kvgate.runners.engine.throughput_repeats", "--out", str(out), "--summary", str(summary),
            "--first-repeat", str(first_repeat), "--repeats", str(design.repeats),
            "--warmup-output-len", str(design.warmup_output_len)]
    if allow_shared_gpu:
        argv.append("--allow-shared-gpu")
    return [*argv, "--", *bench_throughput_arguments(cell, model_path, passthrough,
                                                     calculate_kv_scales=calculate_kv_scales)]


def engine_flags(args: Mapping[str, Any]) -> list[str]:
    """Engine arguments as vLLM CLI flags: True -> --flag, False -> --no-flag, tables -> JSON."""
    flags: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + key.replace("_", "-"))
        elif value is None:
            continue
        elif isinstance(value, (dict, list)):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags
