"""One engine, several measured repeats of `vllm bench throughput`'s workload (the throughput stage runs one of these
per engine of a cell side; kvgate.runners.stages.throughput).

    python -m kvgate.runners.engine.throughput_repeats --out DIR --summary FILE --first-repeat K --repeats R \
        [--warmup-output-len W] [--allow-shared-gpu] -- <the arguments of `vllm bench throughput`>

Everything after `--` is read by vLLM's own `vllm bench throughput` parser and its request builder
(vllm.benchmarks.throughput: add_cli_args, validate_args, get_requests), so the prompts, their lengths, the sampling
(temperature 1, ignore_eos, max_tokens = the output length) and every engine argument are the ones `vllm bench
throughput <same arguments>` would use. What differs is that one engine serves them all:
- the warm-up: the same number of prompts of the same input length (vLLM's warm-up seed, its own seed + 1), each
  generating W tokens, so the prefill shapes, the decode batch sizes and the kernels' first launches are behind us;
- R measured repeats, each the whole workload with the prefix cache emptied first (so a repeat prefills every
  prompt, as a fresh engine would), timed as vLLM times it (`llm.generate` with all requests at once).
Each repeat writes DIR/repeat-N.json (the keys of `--output-json`) and DIR/repeat-N.log (vLLM's `Throughput:` line and
token totals), N counting from K.

The machine under each repeat (NVML through nvidia-ml-py, where there is a GPU): SM clock, power, temperature, the
clock-event (throttle) reasons, and the compute processes on the engine's GPUs. A repeat measured while a GPU slowed
itself for heat or power (hardware slowdown, thermal or power-brake events) or while a process that was not there
when the engine came up used the GPU is measured once more; twice is the stage's infrastructure error (exit 75),
never a figure. A GPU that other processes already hold before the engine starts is refused the same way unless
--allow-shared-gpu. The summary FILE (JSON) holds the engine's start and warm-up seconds and each repeat's machine.

Exit status: 0 every repeat measured; 2 unusable arguments; 75 infrastructure (the line starting `kvgate-infrastructure:`
says why); anything else: the engine failed (its traceback above).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

EXIT_INFRASTRUCTURE = 75
INFRASTRUCTURE_PREFIX = "kvgate-infrastructure:"
SAMPLE_SECONDS = 0.2
# nvmlClocksEventReason* bits (nvml.h) that mean the GPU slowed itself down: a figure measured under them is the
# machine's, not the code's. SW power cap (0x4) is the board holding its power limit under load, which both sides of
# an A/B meet alike: recorded, not disqualifying.
THROTTLE_REASONS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                    0x80: "hardware power brake"}
NOTED_REASONS = {0x4: "software power cap"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("ERROR usage: python -m kvgate.runners.engine.throughput_repeats [options] -- <vllm bench throughput "
              "arguments>", file=sys.stderr)
        return 2
    split = argv.index("--")
    ours = _parser().parse_args(argv[:split])
    bench_args = _bench_arguments(argv[split + 1:])
    if isinstance(bench_args, str):
        print(f"ERROR {bench_args}", file=sys.stderr)
        return 2
    out = Path(ours.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"repeats": [], "first_repeat": ours.first_repeat}
    monitor = GpuMonitor.open()
    summary["gpu"] = monitor.describe() if monitor else None
    try:
        if monitor is not None and not ours.allow_shared_gpu:
            others = monitor.processes()
            if others:
                return _infrastructure(summary, "the GPU is shared: processes already on it before the "
                                                              f"engine started ({_processes_text(others)}); kvgate "
                                                              "refuses a shared GPU (--allow-shared-gpu overrides)")
        from vllm.benchmarks.throughput import get_requests
        from vllm.tokenizers import get_tokenizer

        random.seed(bench_args.seed)
        tokenizer = get_tokenizer(bench_args.tokenizer, tokenizer_mode=bench_args.tokenizer_mode,
                                  trust_remote_code=bench_args.trust_remote_code)
        requests = get_requests(bench_args, tokenizer)
        warmup_requests = _warmup_requests(bench_args, tokenizer, ours.warmup_output_len) \
            if ours.warmup_output_len > 0 else []

        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs

        began = time.perf_counter()
        llm = LLM.from_engine_args(EngineArgs.from_cli_args(bench_args))
        summary["engine_start_s"] = round(time.perf_counter() - began, 2)
        print(f"kvgate: engine started in {summary['engine_start_s']:.1f} s", flush=True)
        if monitor is not None:
            monitor.mark_engine_processes()
        if warmup_requests:
            began = time.perf_counter()
            _generate(llm, warmup_requests, bench_args)
            summary["warmup_s"] = round(time.perf_counter() - began, 2)
            print(f"kvgate: warm-up of {len(warmup_requests)} prompts x {ours.warmup_output_len} tokens in "
                  f"{summary['warmup_s']:.1f} s", flush=True)
        for index in range(ours.repeats):
            number = ours.first_repeat + index
            measured = _measure(llm, requests, bench_args, monitor, number, shared_ok=ours.allow_shared_gpu)
            summary["repeats"].append(measured.record)
            if measured.problem is not None:
                return _infrastructure(summary, f"repeat {number}: {measured.problem}")
            _write_repeat(out, number, requests, measured)
        return 0
    finally:
        if monitor is not None:
            monitor.close()
        _write_summary(ours.summary, summary)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvgate.runners.engine.throughput_repeats")
    parser.add_argument("--out", required=True, help="folder for repeat-N.json and repeat-N.log")
    parser.add_argument("--summary", required=True, help="JSON file: engine start, warm-up and each repeat's machine")
    parser.add_argument("--first-repeat", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup-output-len", type=int, default=32)
    parser.add_argument("--allow-shared-gpu", action="store_true")
    return parser


def _bench_arguments(argv: list[str]):
    """vLLM's own parse of `vllm bench throughput` arguments, or why they cannot be run here."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM
        from vllm.utils import FlexibleArgumentParser
    from vllm.benchmarks.throughput import add_cli_args, validate_args

    parser = FlexibleArgumentParser(prog="vllm bench throughput")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    validate_args(args)
    if args.seed is None:
        args.seed = 0
    unsupported = [name for name, on in (("--backend other than vllm", args.backend != "vllm"),
                                         ("--async-engine", getattr(args, "async_engine", False)),
                                         ("--prequeue-requests", getattr(args, "prequeue_requests", False)),
                                         ("--enable-lora", getattr(args, "enable_lora", False)),
                                         ("--profile", getattr(args, "profile", False))) if on]
    if unsupported:
        return f"kvgate's throughput repeats run the synchronous vllm backend only: {', '.join(unsupported)}"
    return args


def _warmup_requests(args, tokenizer, output_len: int):
    """vLLM's warm-up requests (its seed + 1), the same number and input length as the measured ones, W tokens out."""
    from vllm.benchmarks.throughput import get_requests

    warmup = argparse.Namespace(**vars(args))
    warmup.seed = args.seed + 1
    for name in ("random_output_len", "output_len"):
        if getattr(warmup, name, None) is not None:
            setattr(warmup, name, output_len)
    return get_requests(warmup, tokenizer)


def _generate(llm, requests, args):
    """`vllm bench throughput`'s timed section (vllm/benchmarks/throughput.py _run_vllm_requests, vllm backend):
    every request at once, temperature 1, ignore_eos, max_tokens its output length. (seconds, outputs)"""
    from vllm import SamplingParams
    from vllm.inputs import TextPrompt, TokensPrompt

    prompts, params = [], []
    for request in requests:
        if isinstance(request.prompt, dict) and "prompt_token_ids" in request.prompt:
            prompts.append(TokensPrompt(prompt_token_ids=request.prompt["prompt_token_ids"]))
        else:
            prompts.append(TextPrompt(prompt=request.prompt))
        params.append(SamplingParams(n=args.n, temperature=1.0, top_p=1.0, ignore_eos=True,
                                     max_tokens=request.expected_output_len,
                                     detokenize=not args.disable_detokenize))
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, outputs


@dataclass
class Measured:
    elapsed: float = 0.0
    outputs: list = field(default_factory=list)
    record: dict = field(default_factory=dict)
    problem: str | None = None


def _measure(llm, requests, args, monitor: GpuMonitor | None, number: int, *, shared_ok: bool = False) -> Measured:
    """One repeat, measured again once when the machine disturbed it (shared_ok: other processes on the GPU are
    recorded, not a disturbance)."""
    attempts = []
    for attempt in (1, 2):
        llm.reset_prefix_cache()
        if monitor is not None:
            monitor.start()
        elapsed, outputs = _generate(llm, requests, args)
        machine = monitor.stop(shared_ok=shared_ok) if monitor is not None else {"gpu": None}
        attempts.append({"attempt": attempt, "elapsed_s": round(elapsed, 4), **machine})
        disturbed = machine.get("disturbed")
        if not disturbed:
            return Measured(elapsed=elapsed, outputs=outputs, record={"repeat": number, "attempts": attempts})
        print(f"kvgate-machine: repeat {number} attempt {attempt} was measured while {disturbed}"
              + ("; measuring it again" if attempt == 1 else ""), flush=True)
    return Measured(record={"repeat": number, "attempts": attempts},
                    problem=f"measured twice while the GPU was not the engine's alone or not at its clocks "
                            f"({attempts[0]['disturbed']}; then {attempts[1]['disturbed']})")


def _write_repeat(out: Path, number: int, requests, measured: Measured) -> None:
    """repeat-N.json as `vllm bench throughput --output-json` writes it, and its `Throughput:` line (counted from
    the outputs, as vLLM's main() counts them)."""
    prompt_tokens = output_tokens = 0
    for ro in measured.outputs:
        prompt_tokens += len(ro.prompt_token_ids) if ro.prompt_token_ids else 0
        output_tokens += sum(len(o.token_ids) for o in ro.outputs if o is not None and o.token_ids is not None)
    total = prompt_tokens + output_tokens
    elapsed = measured.elapsed
    results = {"elapsed_time": elapsed, "num_requests": len(requests), "total_num_tokens": total,
               "requests_per_second": len(requests) / elapsed, "tokens_per_second": total / elapsed}
    (out / f"repeat-{number}.json").write_text(json.dumps(results, indent=4) + "\n", encoding="utf-8")
    lines = [f"Throughput: {len(requests) / elapsed:.2f} requests/s, {total / elapsed:.2f} total tokens/s, "
             f"{output_tokens / elapsed:.2f} output tokens/s",
             f"Total num prompt tokens:  {prompt_tokens}",
             f"Total num output tokens:  {output_tokens}"]
    text = "\n".join(lines) + "\n"
    (out / f"repeat-{number}.log").write_text(text, encoding="utf-8")
    print(f"kvgate: repeat {number}: " + lines[0], flush=True)


def _infrastructure(summary: dict, reason: str) -> int:
    summary["infrastructure"] = reason
    print(f"{INFRASTRUCTURE_PREFIX} {reason}", flush=True)
    return EXIT_INFRASTRUCTURE


def _write_summary(path: str, summary: dict) -> None:
    Path(path).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _processes_text(processes: list[dict]) -> str:
    return ", ".join(f"pid {p['pid']} using {p['used_mib']} MiB" if p.get("used_mib") is not None else
                     f"pid {p['pid']}" for p in processes[:8])


class GpuMonitor:
    """NVML samples of the engine's GPUs (the CUDA devices this process sees, matched by UUID) while a repeat runs."""

    def __init__(self, pynvml, handles: list, names: list[str]):
        self.nvml, self.handles, self.names = pynvml, handles, names
        self.engine_pids: set[int] = set()
        self._samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def open(cls) -> GpuMonitor | None:
        """None where there is no NVIDIA GPU (the CPU engine) or no NVML."""
        try:
            import torch

            if not torch.cuda.is_available():
                return None
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return None
        handles, names = [], []
        for index in range(torch.cuda.device_count()):
            uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(("GPU-" + uuid) if uuid and not uuid.startswith("GPU-")
                                                          else uuid)
            except Exception:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            handles.append(handle)
            names.append(_text(pynvml.nvmlDeviceGetName(handle)))
        return cls(pynvml, handles, names)

    def describe(self) -> dict:
        return {"devices": self.names, "driver": _text(self.nvml.nvmlSystemGetDriverVersion())}

    def processes(self) -> list[dict]:
        """Compute processes on the engine's GPUs that are not the engine's (its processes are learnt once it is up)."""
        found = []
        for handle in self.handles:
            try:
                running = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:
                continue
            for proc in running:
                if proc.pid in self.engine_pids or proc.pid == os.getpid():
                    continue
                used = getattr(proc, "usedGpuMemory", None)
                found.append({"pid": int(proc.pid), "used_mib": None if not isinstance(used, int) else used >> 20})
        return found

    def mark_engine_processes(self) -> None:
        """Whatever runs on the GPUs once the engine is up and before the first repeat is the engine (its worker
        processes; process ids as NVML reports them, which in a container need not be this namespace's)."""
        self.engine_pids |= {p["pid"] for p in self.processes()}

    def start(self) -> None:
        self._samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvgate-nvml", daemon=True)
        self._thread.start()

    def stop(self, *, shared_ok: bool = False) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.summarise(self._samples, shared_ok=shared_ok)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._samples.append(self._sample())
            self._stop.wait(SAMPLE_SECONDS)
        self._samples.append(self._sample())

    def _sample(self) -> dict:
        nvml, sample = self.nvml, {"reasons": 0, "others": []}
        clocks, powers, temps = [], [], []
        for handle in self.handles:
            for name, read in (("clock", lambda h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
                               ("power", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000),
                               ("temperature", lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))):
                try:
                    value = read(handle)
                except Exception:
                    continue
                {"clock": clocks, "power": powers, "temperature": temps}[name].append(float(value))
            reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            with contextlib.suppress(Exception):  # a driver without clock-event reasons: none seen
                sample["reasons"] |= int(reasons(handle)) if reasons else 0
        sample.update(clock=min(clocks, default=None), power=sum(powers) if powers else None,
                      temperature=max(temps, default=None))
        sample["others"] = self.processes()
        return sample

    @staticmethod
    def summarise(samples: list[dict], *, shared_ok: bool = False) -> dict:
        """Figures for people and the verdict on the machine: `disturbed` says what, or is absent."""
        clocks = [s["clock"] for s in samples if s["clock"] is not None]
        powers = [s["power"] for s in samples if s["power"] is not None]
        temps = [s["temperature"] for s in samples if s["temperature"] is not None]
        seen = 0
        for s in samples:
            seen |= s["reasons"]
        throttled = [text for bit, text in THROTTLE_REASONS.items() if seen & bit]
        noted = [text for bit, text in NOTED_REASONS.items() if seen & bit]
        others = {p["pid"]: p for s in samples for p in s["others"]}
        record = {"samples": len(samples),
                  "sm_clock_mhz": {"min": min(clocks), "median": statistics.median(clocks), "max": max(clocks)}
                  if clocks else None,
                  "power_w_mean": round(sum(powers) / len(powers), 1) if powers else None,
                  "temperature_c_max": max(temps) if temps else None,
                  "clock_events": throttled + noted, "other_processes": list(others.values())}
        problems = []
        if throttled:
            problems.append("the GPU slowed itself down (" + ", ".join(throttled) + ")")
        if others and not shared_ok:
            problems.append("other processes used the GPU (" + _processes_text(list(others.values())) + ")")
        if problems:
            record["disturbed"] = "; ".join(problems)
        return record

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


if __name__ == "__main__":
    sys.exit(main())
