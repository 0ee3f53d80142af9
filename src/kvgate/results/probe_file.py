"""kvgate's probe output format: `probe/probe.json` in a cell folder (kvgate's own, versioned).

The probe (kvgate.runners.stages.probe) runs fixed prompts greedy through a cell's engine with prompt and top-k
logprobs; the gate compares an FP8 cell's file with the auto cell's (kvgate.gate.probe_agreement). This
module owns the format, its writer and its checked reader.

{"format": "kvgate-probe", "version": 1, "settings": {...}, "engine": {...}, "prompts": [{"prompt",
"prompt_token_ids", "prompt_logprobs", "prompt_top", "generated_token_ids", "generated_logprobs",
"generated_top", "generated_text"}, ...]}. Position i of `prompt_logprobs` is the logprob of prompt token i
given the tokens before it (null for the first token); `*_top` hold the top-k [token id, logprob] pairs at
each position, most likely first. Non-finite logprobs (a broken kernel can give NaN) are written as the
strings "nan", "inf", "-inf", so the file stays JSON.

Optional (results contract 1.7), "cached_context": [{"prompt", "prompt_token_ids", "cached_tokens",
"generated_token_ids", "generated_logprobs", "generated_top", "generated_text"}, ...]: prompts that continue a
prefix read back from vLLM's prefix cache (no prompt logprobs: vLLM serves no cached prefix to a request that asks
for them); `cached_tokens` is how many prompt tokens came from the cache; `fresh_generated_token_ids`,
`fresh_generated_logprobs` and `fresh_cached_tokens` (optional): the same prompt prefilled fresh in the same engine.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate import InputError
from kvgate.results import schema
from kvgate.results.parsers.reading import (
    OutOfRangeNumber,
    out_of_range_place,
    past_float_range,
    present,
    read_text,
    strict_json,
)
from kvgate.results.parsers.reading import kind as kind_of

FORMAT = "kvgate-probe"
VERSION = 1
FILE_NAME = "probe.json"


# ---- records ----------------------------------------------------------------------------------------

TopList = tuple[tuple[int, float], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class PromptProbe:
    prompt: str
    prompt_token_ids: tuple[int, ...]
    prompt_logprobs: tuple[float | None, ...]  # logprob of the actual token; None for the first position
    prompt_top: tuple[TopList | None, ...]
    generated_token_ids: tuple[int, ...]
    generated_logprobs: tuple[float, ...]
    generated_top: tuple[TopList, ...]
    generated_text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class CachedContextProbe:
    """A prompt that continued a cached prefix: only its generated positions are scored."""

    prompt: str
    prompt_token_ids: tuple[int, ...]
    cached_tokens: int  # prompt tokens vLLM took from its prefix cache
    generated_token_ids: tuple[int, ...]
    generated_logprobs: tuple[float, ...]
    generated_top: tuple[TopList, ...]
    generated_text: str
    # the same prompt prefilled fresh in the same engine (the prefix cache not read); empty when not recorded
    fresh_generated_token_ids: tuple[int, ...] = ()
    fresh_generated_logprobs: tuple[float, ...] = ()
    fresh_cached_tokens: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeRecord:
    source: str  # the file it was read from, or "<memory>"
    settings: dict[str, Any]
    engine: dict[str, Any]
    prompts: tuple[PromptProbe, ...]
    cached_context: tuple[CachedContextProbe, ...] = ()
    # results contract 1.10: long prompts (kvgate's passkey documents, one per context length the cell ran), scored on
    # their generated positions only, in the cached-context entries' shape
    long_context: tuple[CachedContextProbe, ...] = ()


# ---- the file ---------------------------------------------------------------------------------------


def write(record: dict, folder: Path) -> Path:
    """Write `record` as `folder/probe.json`; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    text = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
    temporary = path.with_name(f".{FILE_NAME}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
    return path


def read(path: Path) -> ProbeRecord:
    """Read and check a probe file; InputError names the file and the place of the first problem."""
    source = str(path)
    if not present(path):
        raise InputError(source, "no probe file", hint="Did the probe stage run for this cell?")
    text = read_text(path, source)  # a regular file within the cap, else InputError (a FIFO, /dev/zero, a dangling link)
    try:
        data = strict_json(text)
    except OutOfRangeNumber as error:
        raise InputError(source, str(error), out_of_range_place(text), 'Write "inf" or "-inf"') from None
    except json.JSONDecodeError as error:
        raise InputError(source, f"not valid JSON ({error.msg})", f"line {error.lineno} column {error.colno}",
                         "Was the probe interrupted while writing?") from None
    except ValueError as error:  # NaN, Infinity: the format writes non-finite logprobs as strings
        if "integer string conversion" in str(error):  # Python's own words named sys.set_int_max_str_digits
            raise InputError(source, "a whole number of over 4300 digits", "the file",
                             "Write a token id, or a logprob as a number") from None
        raise InputError(source, str(error), "the file", 'Write "nan", "inf" or "-inf"') from None
    except RecursionError:
        raise InputError(source, "JSON nested too deeply", "the file") from None
    check_header(data, source)
    schema.validate_structure(data, "probe", source)  # from_dict checks the rules of schema.READER_CHECKED
    return from_dict(data, source)


def from_dict(data: Any, source: str = "<memory>") -> ProbeRecord:
    """A checked ProbeRecord from the JSON-able dict that `collect` returns or `read` parses."""
    check_header(data, source)
    settings = _field(data, "settings", dict, source, "")
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        raise InputError(source, "expected an object", "'engine'")
    items = _field(data, "prompts", list, source, "")
    if not items:
        raise InputError(source, "no prompts", "'prompts'")
    prompts = tuple(_prompt_from_dict(item, source, f"prompts[{i}]") for i, item in enumerate(items))
    cached_items = data.get("cached_context", [])
    if not isinstance(cached_items, list):
        raise InputError(source, f"expected a list, got {type(cached_items).__name__}", "'cached_context'")
    cached = tuple(_cached_from_dict(item, source, f"cached_context[{i}]") for i, item in enumerate(cached_items))
    long_items = data.get("long_context", [])
    if not isinstance(long_items, list):
        raise InputError(source, f"expected a list, got {type(long_items).__name__}", "'long_context'")
    long = tuple(_cached_from_dict(item, source, f"long_context[{i}]") for i, item in enumerate(long_items))
    return ProbeRecord(source=source, settings=settings, engine=engine, prompts=prompts, cached_context=cached,
                       long_context=long)


def check_header(data: Any, source: str) -> None:
    """The file is a probe file of a version this kvgate reads (before its schema: a newer version may differ)."""
    if not isinstance(data, dict):
        raise InputError(source, "expected a JSON object", "the top level")
    if data.get("format") != FORMAT:
        raise InputError(source, f"not a kvgate probe file (format {_brief(data.get('format'))})", "'format'",
                         f"Expected format {FORMAT!r}")
    version = data.get("version")
    if type(version) is not int:
        raise InputError(source, f"version must be a whole number, got {_brief(version)}", "'version'")
    if version > VERSION:
        raise InputError(source, f"probe format version {version} is newer than this kvgate reads ({VERSION})",
                         "'version'", "Upgrade kvgate")


def _brief(value: Any) -> str:
    """A header value in an error message: its repr, cut to 60 characters (a format string of a megabyte was a
    megabyte-long ERROR line, in the report too); a list or object by its kind."""
    if isinstance(value, (list, dict)):
        return kind_of(value)
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:59] + "…"


def _cached_from_dict(item: Any, source: str, where: str) -> CachedContextProbe:
    if not isinstance(item, dict):
        raise InputError(source, "expected an object", where)
    token_ids = _token_ids(_field(item, "prompt_token_ids", list, source, where), source,
                           f"{where}.prompt_token_ids")
    fresh: dict[str, Any] = {}
    if "fresh_generated_token_ids" in item:
        fresh_ids, (fresh_logprobs,) = _aligned(item, "fresh_generated_token_ids", ("fresh_generated_logprobs",),
                                                "generated tokens", source, where)
        fresh = {"fresh_generated_token_ids": fresh_ids,
                 "fresh_cached_tokens": _cached_count(item, "fresh_cached_tokens", len(token_ids), source, where),
                 "fresh_generated_logprobs": _logprobs(fresh_logprobs, source, f"{where}.fresh_generated_logprobs")}
    return CachedContextProbe(prompt=_field(item, "prompt", str, source, where), prompt_token_ids=token_ids,
                              cached_tokens=_cached_count(item, "cached_tokens", len(token_ids), source, where),
                              **_generated_from_dict(item, source, where), **fresh)


def _cached_count(item: dict, key: str, prompt_length: int, source: str, where: str) -> int:
    """Prompt tokens served from the prefix cache: 0 to the prompt's length."""
    cached = _field(item, key, int, source, where)
    if not 0 <= cached <= prompt_length:
        raise InputError(source, f"{cached} cached tokens for a prompt of {prompt_length}", f"{where}.{key}")
    return cached


def _aligned(item: dict, ids_key: str, keys: tuple[str, ...], what: str, source: str,
             where: str) -> tuple[tuple[int, ...], list[list]]:
    """Token ids and the lists that hold one entry per token (logprobs, tops), their lengths checked."""
    ids = _token_ids(_field(item, ids_key, list, source, where), source, f"{where}.{ids_key}")
    columns = [_field(item, key, list, source, where) for key in keys]
    for key, values in zip(keys, columns, strict=True):
        if len(values) != len(ids):
            raise InputError(source, f"{len(values)} positions for {len(ids)} {what}", f"{where}.{key}")
    return ids, columns


def _field(data: dict, key: str, kind: type, source: str, where: str) -> Any:
    location = f"{where}.{key}" if where else f"'{key}'"
    if key not in data:
        raise InputError(source, f"missing key {key!r}", where or "the top level")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InputError(source, f"expected {_kind_name(kind)}, got {type(value).__name__}", location)
    return value


def _kind_name(kind: type) -> str:
    return {dict: "an object", list: "a list", str: "a string", int: "a whole number"}.get(kind, kind.__name__)


# The per-token entries, which schema.validate_structure leaves to this reader (schema.READER_CHECKED): each check
# here is its schema rule, refused in the words of that rule's "title".

def _types(values: Iterable[Any]) -> set[type]:
    """The types of a list's entries, in one pass of C code (bool is its own type, apart from int)."""
    return set(map(type, values))


def _token_ids(values: list, source: str, where: str) -> tuple[int, ...]:
    if _types(values) <= {int} and (not values or (min(values) >= 0 and not past_float_range(max(values)))):
        return tuple(values)
    for i, value in enumerate(values):
        if type(value) is not int or value < 0 or past_float_range(value):
            raise InputError(source, f"expected a token id (a whole number >= 0), got {kind_of(value)}",
                             f"{where}[{i}]")
    return tuple(values)


def _logprob(value: Any, source: str, where: str) -> float:
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(source, f'expected a logprob (a number, or "nan", "inf", "-inf"), got {kind_of(value)}',
                         where)
    if isinstance(value, int) and past_float_range(value):  # float() would raise OverflowError
        raise InputError(source, f"expected a logprob (a finite number), got {kind_of(value)}", where,
                         'Write "inf" or "-inf"')
    return float(value)


def _logprobs(values: list, source: str, where: str, start: int = 0) -> tuple[float, ...]:
    """values[start:] as logprobs (`where` names the list)."""
    if _types(values[start:]) <= {float}:  # the common case, all at once
        return tuple(values[start:])
    return tuple(_logprob(values[i], source, f"{where}[{i}]") for i in range(start, len(values)))


def _top_lists(values: list, source: str, where: str, start: int = 0) -> tuple[TopList, ...]:
    """values[start:] as top-k lists (`where` names the list)."""
    tops = values[start:]
    if _types(tops) <= {list} and all(tops):  # the common case, all at once: non-empty lists of [int, float]
        pairs = list(itertools.chain.from_iterable(tops))
        if _types(pairs) <= {list} and set(map(len, pairs)) <= {2} and _types(map(_TOKEN, pairs)) <= {int} \
                and _types(map(_LOGPROB, pairs)) <= {float} \
                and not past_float_range(max(map(abs, map(_TOKEN, pairs)), default=0)):
            return tuple(tuple(map(tuple, top)) for top in tops)
    return tuple(_top_list(values[i], source, f"{where}[{i}]") for i in range(start, len(values)))


_TOKEN, _LOGPROB = operator.itemgetter(0), operator.itemgetter(1)


def _top_list(value: Any, source: str, where: str) -> TopList:
    if not isinstance(value, list):
        raise InputError(source, f"expected a list, got {kind_of(value)}", where)
    if not value:
        raise InputError(source, "expected at least 1 entry, got 0", where)
    pairs = []
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise InputError(source, f"expected a [token id, logprob] pair, got {kind_of(pair)}", f"{where}[{i}]")
        if type(pair[0]) is not int or past_float_range(pair[0]):
            raise InputError(source, f"expected a whole number, got {kind_of(pair[0])}", f"{where}[{i}][0]")
        pairs.append((pair[0], _logprob(pair[1], source, f"{where}[{i}][1]")))
    return tuple(pairs)


def _generated_from_dict(item: dict, source: str, where: str) -> dict[str, Any]:
    generated, (logprobs_in, top_in) = _aligned(item, "generated_token_ids", ("generated_logprobs", "generated_top"),
                                                "generated tokens", source, where)
    text = item.get("generated_text", "")
    if not isinstance(text, str):
        raise InputError(source, f"expected a string, got {type(text).__name__}", f"{where}.generated_text")
    return {
        "generated_token_ids": generated,
        "generated_logprobs": _logprobs(logprobs_in, source, f"{where}.generated_logprobs"),
        "generated_top": _top_lists(top_in, source, f"{where}.generated_top"),
        "generated_text": text,
    }


def _prompt_from_dict(item: Any, source: str, where: str) -> PromptProbe:
    if not isinstance(item, dict):
        raise InputError(source, "expected an object", where)
    prompt = _field(item, "prompt", str, source, where)
    token_ids, (logprobs_in, top_in) = _aligned(item, "prompt_token_ids", ("prompt_logprobs", "prompt_top"),
                                                "prompt tokens", source, where)
    if not token_ids:
        raise InputError(source, "no prompt tokens", f"{where}.prompt_token_ids")
    for key, values in (("prompt_logprobs", logprobs_in), ("prompt_top", top_in)):
        if values[0] is not None:
            raise InputError(source, "the first prompt position has no logprob; expected null",
                             f"{where}.{key}[0]")
    prompt_logprobs = (None, *_logprobs(logprobs_in, source, f"{where}.prompt_logprobs", start=1))
    prompt_top = (None, *_top_lists(top_in, source, f"{where}.prompt_top", start=1))
    return PromptProbe(
        prompt=prompt,
        prompt_token_ids=token_ids,
        prompt_logprobs=prompt_logprobs,
        prompt_top=prompt_top,
        **_generated_from_dict(item, source, where),
    )


def encode_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
