"""kvgate's long-context task: passkey retrieval at several context lengths and needle depths, written and scored
by kvgate (no download).

The document is the passkey prompt of Mohtashami & Jaggi (2023, "Landmark Attention"), which long-context work
since uses as its simplest needle test: an instruction, a filler of one repeated paragraph, at a chosen depth the
needle ("The pass key is 71432. Remember it. 71432 is the pass key."), more filler, and the question. The answer is
the five digits; scoring is exact (the first five-digit number the model generates equals the key).

Deterministic: the keys come from one seeded generator, so a cell and its partner (FP8 vs auto, head vs base) ask
the same documents in the same order, and their per-question samples pair. Lengths are in the model's own tokens
(the prompt is sized with its tokenizer, `count_tokens`), so "8k" means at most 8192 prompt tokens for every model;
a document the model's positions cannot hold is never written (`fitting_lengths` says which lengths a model takes).

`documents()` is pure; `write_task(folder, ...)` writes the documents and an lm-eval task YAML (lm-eval 0.4.13:
generate_until, greedy, filters "strict-match" and "flexible-extract", metric exact_match), so the gate's paired
comparisons read its samples exactly as they read gsm8k's.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kvgate.matrix.declarations import LONG_CONTEXT_ANSWER_TOKENS
from kvgate.matrix.declarations import LongContext as Design

TASK_NAME = "kvgate_passkey"  # kvgate.results.records.LONG_CONTEXT_TASK (a test holds them equal)
YAML_NAME = f"{TASK_NAME}.yaml"
DATA_NAME = f"{TASK_NAME}_test.jsonl"
INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
               "I will quiz you about the important information there.\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\nWhat is the pass key? The pass key is"
ANSWER_TOKENS = LONG_CONTEXT_ANSWER_TOKENS  # generation cap
MIN_FILLER = 2      # a document shorter than this many filler paragraphs is no long-context question


def fitting_lengths(design: Design, max_model_len: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(lengths the model runs, lengths it cannot): a length runs when its prompt and the answer fit max_model_len."""
    return design.fitting(max_model_len)


def keys(design: Design) -> list[str]:
    """The five-digit keys, one per document in the documents' order (length, depth, key index), from one seeded
    stream drawn for every declared length, so a length dropped for one model leaves the others' keys unchanged."""
    rng = random.Random(design.seed)
    return [str(rng.randrange(10000, 100000)) for _ in range(len(design.lengths) * design.per_length)]


def prompt(filler_units: int, depth: float, key: str) -> str:
    """The document: the needle after round(depth x units) of the filler paragraphs."""
    before = round(depth * filler_units)
    return (INSTRUCTION + FILLER * before + NEEDLE.format(key=key) + FILLER * (filler_units - before)
            + QUESTION).replace(" \n", "\n")


def sized_units(length: int, depth: float, key: str, count_tokens: Callable[[str], int]) -> int:
    """The most filler paragraphs whose prompt holds at most `length` tokens (binary search on real counts)."""
    low, high = 0, 1
    while count_tokens(prompt(high, depth, key)) <= length:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if count_tokens(prompt(middle, depth, key)) <= length:
            low = middle
        else:
            high = middle
    return low


def documents(design: Design, count_tokens: Callable[[str], int],
              lengths: Iterable[int] | None = None) -> list[dict]:
    """The task's documents for the given lengths (default: all declared), in order length, depth, key. Each:
    {"prompt", "passkey", "length", "depth", "tokens"}; `tokens` is the prompt's real count (<= length)."""
    wanted = set(design.lengths if lengths is None else lengths)
    unknown = wanted - set(design.lengths)
    if unknown:
        raise ValueError(f"lengths {sorted(unknown)} are not declared ({list(design.lengths)})")
    all_keys = iter(keys(design))
    docs = []
    for length in design.lengths:
        for depth in design.depths:
            for _ in range(design.keys_per_depth):
                key = next(all_keys)
                if length not in wanted:
                    continue
                units = sized_units(length, depth, key, count_tokens)
                if units < MIN_FILLER:
                    raise ValueError(f"a {length}-token document holds fewer than {MIN_FILLER} filler paragraphs")
                text = prompt(units, depth, key)
                docs.append({"prompt": text, "passkey": key, "length": length, "depth": depth,
                             "tokens": count_tokens(text)})
    return docs


def task_yaml(data: Path) -> str:
    """lm-eval 0.4.13's task YAML over the documents: greedy generation, the first five-digit number scored."""
    return (
        f"# Written by {__name__}: passkey retrieval at several context lengths and depths, scored exactly.\n"
        f"task: {TASK_NAME}\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {json.dumps(str(data))}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\n'
        'doc_to_target: "{{passkey}}"\n'
        "target_delimiter: \" \"\n"
        "generation_kwargs:\n"
        '  until: ["\\n"]\n'
        "  do_sample: false\n"
        "  temperature: 0.0\n"
        f"  max_gen_toks: {ANSWER_TOKENS}\n"
        "filter_list:\n"
        "  - name: strict-match\n"       # the key as the first thing said
        "    filter:\n"
        "      - function: regex\n"
        '        regex_pattern: "^\\\\s*(\\\\d{5})(?!\\\\d)"\n'
        "      - function: take_first\n"
        "  - name: flexible-extract\n"   # the first five-digit number anywhere in the answer
        "    filter:\n"
        "      - function: regex\n"
        '        regex_pattern: "(?<!\\\\d)(\\\\d{5})(?!\\\\d)"\n'
        "      - function: take_first\n"
        "metric_list:\n"
        "  - metric: exact_match\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
        "metadata:\n"
        "  version: 1\n"
    )


def write_task(folder: Path, docs: Sequence[dict]) -> str:
    """Write the documents and the task YAML into `folder`; returns the task name for lm-eval."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / DATA_NAME
    data.write_text("".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs), encoding="utf-8")
    (folder / YAML_NAME).write_text(task_yaml(data), encoding="utf-8")
    return TASK_NAME


def bucket_accuracy(records: Iterable[dict], filter_name: str = "strict-match") -> dict[str, dict]:
    """Accuracy per context length from lm-eval's sample records of the task (each record's doc carries its
    length): {"4096": {"n": 25, "correct": 24, "accuracy": 0.96}, ...}, lengths in ascending order."""
    buckets: dict[int, list[float]] = {}
    for record in records:
        if record.get("filter") != filter_name:
            continue
        length = int(record["doc"]["length"])
        buckets.setdefault(length, []).append(float(record.get("exact_match", 0.0)))
    return {str(n): {"n": len(v), "correct": int(sum(v)), "accuracy": sum(v) / len(v)}
            for n, v in sorted(buckets.items())}
