"""lm-eval (0.4.x) outputs: results_<timestamp>.json and samples_<task>_<timestamp>.jsonl.

results: `results[task]` holds "<metric>,<filter>" and "<metric>_stderr,<filter>" (stderr may be "N/A");
`n-samples[task].effective` is the number of documents; `config` the model args and limit.
samples: one JSON object per line and per (document, filter): doc_id, filter, doc_hash, prompt_hash and
the metric's value (e.g. "exact_match": 1.0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kvgate import InputError, did_you_mean
from kvgate.results.parsers.reading import (
    expect_int,
    expect_number,
    expect_object,
    expect_string,
    kind,
    loads,
    path_join,
)
from kvgate.results.records import AccuracyResult, FilterScore, SampleOutcomes

RESULTS_NAME = re.compile(r"^results_(?P<stamp>.+)\.json$")
SAMPLES_NAME = re.compile(r"^samples_(?P<task>.+)_(?P<stamp>[^_]+)\.jsonl$")
DEFAULT_METRIC = "exact_match"


def listed(names: Iterable[str], most: int = 8, width: int = 60) -> str:
    """Names a file holds, for an error message: sorted, the first `most`, each cut to `width` characters (a results
    file naming a task of 300,000 characters made an ERROR line of that length, in verdict.json and the reports)."""
    names = sorted(names)
    shown = [cut(name, width) for name in names[:most]]
    return ", ".join(shown) + (f" (+{len(names) - most} more)" if len(names) > most else "")


def cut(text: str, width: int = 60) -> str:
    """A name or key a file holds, cut to `width` characters for an error message."""
    return text if len(text) <= width else text[:width - 1] + "…"


def samples_task(file_name: str) -> str | None:
    """The task a samples_<task>_<timestamp>.jsonl file belongs to (task names may hold underscores)."""
    match = SAMPLES_NAME.match(file_name)
    return match["task"] if match else None


def parse_results(text: str, source: str, *, task: str, metric: str = DEFAULT_METRIC) -> AccuracyResult:
    """A results_*.json -> AccuracyResult for one task (samples added later by `with_samples`)."""
    data = expect_object(loads(text, source), source, "")
    if "results" not in data:
        raise InputError(source, "missing key 'results'", "the top level",
                         "Is this an lm-eval results_*.json file?")
    results = expect_object(data["results"], source, "results")
    if task not in results:
        found = sorted(results)
        raise InputError(source, f"no results for task {task!r}", "results",
                         f"Tasks found: {listed(found)}" if found else "The file holds no task results")
    where = path_join("results", task)
    block = expect_object(results[task], source, where)
    scores: dict[str, FilterScore] = {}
    for key, value in block.items():
        name, _, filter_name = key.partition(",")
        if name != metric or not filter_name:
            continue
        key_where = path_join(where, key)
        mean = expect_number(value, source, key_where, minimum=0.0, maximum=1.0)
        stderr_key = f"{metric}_stderr,{filter_name}"
        stderr_value = block.get(stderr_key)
        stderr: float | None
        if stderr_value is None or stderr_value == "N/A":
            stderr = None
        else:
            stderr = expect_number(stderr_value, source, path_join(where, stderr_key), minimum=0.0)
        scores[filter_name] = FilterScore(filter=filter_name, mean=mean, stderr=stderr)
    if not scores:
        metrics = sorted({k.partition(",")[0] for k in block if "," in k})
        raise InputError(source, f"no {metric!r} figures for task {task!r}", where,
                         f"Metrics found: {listed(metrics)}" if metrics else "Expected keys like 'exact_match,strict-match'")
    n = None
    if "n-samples" in data:
        counts = expect_object(data["n-samples"], source, "n-samples")
        if task in counts:
            entry = expect_object(counts[task], source, path_join("n-samples", task))
            if "effective" in entry:
                n = expect_int(entry["effective"], source, path_join(path_join("n-samples", task), "effective"),
                               minimum=1)
    config = data.get("config") if isinstance(data.get("config"), Mapping) else {}
    model_args = config.get("model_args")
    if isinstance(model_args, Mapping):
        model_args = ",".join(f"{k}={v}" for k, v in model_args.items())
    limit = config.get("limit")
    n_shot = data.get("n-shot", {}).get(task) if isinstance(data.get("n-shot"), Mapping) else None
    version = data.get("lm_eval_version")
    return AccuracyResult(
        task=task, metric=metric, scores=scores, n=n, samples=None, results_file=source,
        lm_eval_version=version if isinstance(version, str) else None,
        model_args=model_args if isinstance(model_args, str) else None,
        limit=limit if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None,
        num_fewshot=n_shot if isinstance(n_shot, int) and not isinstance(n_shot, bool) else None,
    )


def parse_samples(text: str | bytes, source: str, *, metric: str = DEFAULT_METRIC) -> dict[str, SampleOutcomes]:
    """A samples_<task>_*.jsonl -> per-filter outcomes keyed by doc_hash (else doc_id).

    With msgspec installed (vLLM depends on it) a typed decoder reads only the fields the gate needs, about
    6x faster than json; any file it refuses is read again by the stdlib path below, which names the problem.
    """
    fast = _fast_samples(text, metric)
    if fast is not None:
        return fast
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(source, f"not UTF-8 text (byte {error.start})", "the file") from None
    by_filter: dict[str, dict[str, tuple[bool, str | None]]] = {}
    decoder = json.JSONDecoder(parse_constant=_refuse_constant)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = decoder.decode(line)
        except json.JSONDecodeError as error:
            raise InputError(source, f"not a JSON object ({error.msg} at column {error.colno})", f"line {number}",
                             "Each line must be one sample record as lm-eval --log_samples writes it") from None
        except ValueError as error:
            raise InputError(source, str(error), f"line {number}") from None
        except RecursionError:  # a line of 100,000 `[`: past Python's recursion limit
            raise InputError(source, "JSON nested too deeply", f"line {number}") from None
        # the common, well-formed record without a call per field; anything else gets the checks that explain
        doc_id, filter_name, value = (record.get("doc_id"), record.get("filter"), record.get(metric)) \
            if type(record) is dict else (None, None, None)
        if type(doc_id) is int and doc_id >= 0 and type(filter_name) is str and filter_name.strip() \
                and type(value) is float and (value == 1.0 or value == 0.0):
            doc_hash, prompt_hash = record.get("doc_hash"), record.get("prompt_hash")
            key = doc_hash if type(doc_hash) is str and doc_hash else f"doc_id:{doc_id}"
            correct = value == 1.0
            prompt_hash = prompt_hash if type(prompt_hash) is str and prompt_hash else None
        else:
            where = f"line {number}"
            if not isinstance(record, dict):
                raise InputError(source, f"expected a JSON object, got {kind(record)}", where)
            key, filter_name, correct, prompt_hash = _sample_fields(record, source, where, metric)
        where = f"line {number}"
        outcomes = by_filter.setdefault(filter_name, {})
        if key in outcomes:
            raise InputError(source, f"duplicate record for document {cut(key)} and filter {cut(filter_name)!r}", where,
                             "One samples file must hold one run")
        outcomes[key] = (correct, prompt_hash)
    if not by_filter:
        raise InputError(source, "no sample records", "the file", "Was lm-eval run with --log_samples?")
    return {name: SampleOutcomes(filter=name, outcomes=outcomes) for name, outcomes in by_filter.items()}


_FAST_DECODERS: dict[str, Any] = {}


def _fast_samples(data: str | bytes, metric: str) -> dict[str, SampleOutcomes] | None:
    """The msgspec path: None when msgspec is missing or the file is anything but clean (the slow path decides)."""
    decoder = _fast_decoder(metric)
    if decoder is None:
        return None
    try:
        records = decoder.decode_lines(data)
    except Exception:  # msgspec.DecodeError / ValidationError: let the stdlib path name the problem
        return None
    by_filter: dict[str, dict[str, tuple[bool, str | None]]] = {}
    for record in records:
        value = record.value
        if value != 0 and value != 1:
            return None
        doc_hash = record.doc_hash
        key = doc_hash if doc_hash else f"doc_id:{record.doc_id}"
        outcomes = by_filter.setdefault(record.filter, {})
        if key in outcomes or record.doc_id < 0 or not record.filter.strip():
            return None
        outcomes[key] = (value == 1, record.prompt_hash or None)
    if not by_filter:
        return None
    return {name: SampleOutcomes(filter=name, outcomes=outcomes) for name, outcomes in by_filter.items()}


def _fast_decoder(metric: str) -> Any:
    if metric not in _FAST_DECODERS:
        try:
            import msgspec
        except ImportError:
            _FAST_DECODERS[metric] = None
            return None
        record = msgspec.defstruct(
            "SampleRecord", [("doc_id", int), ("filter", str), ("value", bool | float),
                             ("doc_hash", str | None, None), ("prompt_hash", str | None, None)],
            rename={"value": metric})
        _FAST_DECODERS[metric] = msgspec.json.Decoder(record)
    return _FAST_DECODERS[metric]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _sample_fields(record: dict[str, Any], source: str, where: str, metric: str) -> tuple[str, str, bool, str | None]:
    for required in ("doc_id", "filter", metric):
        if required not in record:
            raise InputError(source, f"missing key {required!r}", where,
                             "lm-eval sample records carry doc_id, filter and the metric's value")
    doc_id = expect_int(record["doc_id"], source, f"{where}.doc_id")
    filter_name = expect_string(record["filter"], source, f"{where}.filter")
    value = record[metric]
    if isinstance(value, bool):
        correct = value
    else:
        number = expect_number(value, source, f"{where}.{metric}", minimum=0.0, maximum=1.0)
        if number not in (0.0, 1.0):
            raise InputError(source, f"expected 0 or 1, got {number!r}", f"{where}.{metric}",
                             "The paired test needs a right/wrong outcome per question")
        correct = number == 1.0
    doc_hash = record.get("doc_hash")
    key = doc_hash if isinstance(doc_hash, str) and doc_hash else f"doc_id:{doc_id}"
    prompt_hash = record.get("prompt_hash")
    return key, filter_name, correct, prompt_hash if isinstance(prompt_hash, str) and prompt_hash else None


def with_samples(result: AccuracyResult, samples: Mapping[str, SampleOutcomes], source: str) -> AccuracyResult:
    """Attach the per-question outcomes after checking they are the run the results file summarises."""
    for filter_name, score in result.scores.items():
        if filter_name not in samples:
            raise InputError(source, f"no sample records for filter {filter_name!r}", "the file",
                             did_you_mean(filter_name, samples) or f"Filters found: {listed(samples)}")
        outcomes = samples[filter_name]
        if result.n is not None and outcomes.n != result.n:
            raise InputError(source, f"{outcomes.n} documents for filter {filter_name!r}, but "
                                     f"{result.results_file} says n-samples effective {result.n}", "the file",
                             "The samples and results files come from different runs")
        if abs(outcomes.mean - score.mean) > 1e-6:
            raise InputError(source, f"filter {filter_name!r} averages {outcomes.mean:.4f}, but "
                                     f"{result.results_file} reports {score.mean:.4f}", "the file",
                             "The samples and results files come from different runs")
    return AccuracyResult(
        task=result.task, metric=result.metric, scores=result.scores, n=result.n, samples=dict(samples),
        results_file=result.results_file, samples_file=source, lm_eval_version=result.lm_eval_version,
        model_args=result.model_args, limit=result.limit, num_fewshot=result.num_fewshot,
    )
