"""The results contract's JSON Schemas (draft 2020-12): one per file kvgate writes, shipped in this package.

    cell.schema.json     <cell folder>/cell.json
    status.schema.json   <cell folder>/status.json
    run.schema.json      <run dir>/run.json
    probe.schema.json    <cell folder>/probe/probe.json
    timings.schema.json  <cell folder>/kernels/timings.json
    verdict.schema.json  <run dir>/gate/verdict.json

Each `$id` is `urn:kvgate:results-folder:<contract version>:<file>`: a name that says which contract the schema
belongs to, not an address (kvgate serves no web site; docs/schemas/ holds the same files). The readers validate
a file's parsed JSON here before their own typed reading, so a file that breaks the contract gets one line
naming the file, the place and what is wrong (`validate` raises kvgate.InputError).

A probe.json holds about 20,000 per-token values (token ids, logprobs, top-k pairs); jsonschema checks them one by
one at about 0.3 s a file, over a minute for a 256-cell run. The probe reader (kvgate.results.probe_file) checks
the same values while it builds its records, each list at once, in about 0.005 s, so it validates with
`validate_structure`: the published schema less the rules listed in READER_CHECKED (another 0.003 s), each of which
the reader enforces in the same words (tests/test_results_schema.py holds hostile files for each). The published
schema stays whole for other tools.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from kvgate import InputError, did_you_mean, unknown_name_hint
from kvgate.results.parsers.reading import kind, loads, past_float_range_place, path_join, read_text
from kvgate.results.records import CONTRACT_VERSION

KINDS = ("cell", "status", "run", "probe", "timings", "verdict")
SCHEMA_FOLDER = "schemas"


def file_name(kind_name: str) -> str:
    return f"{kind_name}.schema.json"


def schema_id(kind_name: str) -> str:
    return f"urn:kvgate:results-folder:{CONTRACT_VERSION}:{file_name(kind_name)}"


def schema_text(kind_name: str) -> str:
    """The packaged schema of one file kind, as shipped."""
    if kind_name not in KINDS:
        raise ValueError(f"no schema for {kind_name!r}; known: {', '.join(KINDS)}")
    return resources.files("kvgate.results").joinpath(SCHEMA_FOLDER, file_name(kind_name)).read_text(encoding="utf-8")


# The rules of a published schema that `validate_structure` leaves to the file's typed reader: JSON Pointers to an
# "items" keyword, i.e. the rule every entry of a per-token list meets; the list's own rules (its type, minItems,
# the prefixItems of its first entry) stay in the structural pass.
READER_CHECKED: dict[str, tuple[str, ...]] = {
    "probe": (
        "/$defs/token_ids/items",  # each token id a whole number >= 0 (prompt, generated and fresh ids)
        "/$defs/logprobs/items",  # each generated logprob a number or "nan", "inf", "-inf"
        "/$defs/tops/items",  # each generated position's top-k list of [token id, logprob] pairs
        "/$defs/prompt/properties/prompt_logprobs/items",  # each prompt logprob after the first (null)
        "/$defs/prompt/properties/prompt_top/items",  # each prompt position's top-k list after the first (null)
    ),
}


@functools.cache
def validator(kind_name: str, structure_only: bool = False) -> Draft202012Validator:
    """The file kind's validator, built once: of the whole schema, or without the rules of READER_CHECKED."""
    schema = json.loads(schema_text(kind_name))
    Draft202012Validator.check_schema(schema)
    if structure_only:
        for pointer in READER_CHECKED.get(kind_name, ()):
            *parents, keyword = pointer.lstrip("/").split("/")
            functools.reduce(dict.__getitem__, parents, schema).pop(keyword)  # KeyError: a stale pointer
    return Draft202012Validator(schema)


def validate(data: Any, kind_name: str, source: str) -> None:
    """Raise InputError naming `source`, the JSON path and the reason when `data` breaks the file kind's schema."""
    _raise_first(validator(kind_name), data, source)


def validate_structure(data: Any, kind_name: str, source: str) -> None:
    """`validate` without the rules of READER_CHECKED[kind_name], for the typed reader that checks those itself."""
    _raise_first(validator(kind_name, structure_only=True), data, source)


def _raise_first(checker: Draft202012Validator, data: Any, source: str) -> None:
    try:
        error = best_match(checker.iter_errors(data))
    except RecursionError:
        raise InputError(source, "JSON nested too deeply", "the file") from None
    if error is not None:
        raise InputError(source, reason(error), json_path(error.absolute_path), _hint(error))


def read_file(path: Path, kind_name: str, source: str | None = None) -> Any:
    """A contract file's JSON, checked against its schema: InputError naming the file for unreadable text, JSON
    that is cut short or not JSON (NaN and Infinity included), or a document against the schema."""
    source = source or str(path)
    data = loads(read_text(path, source), source)
    validate(data, kind_name, source)
    place = past_float_range_place(data)  # a schema's "integer" takes 400 digits; no figure holds them
    if place is not None:
        raise InputError(source, "expected a finite integer, got a whole number past a float's range", place)
    return data


def json_path(parts: Iterable[Any]) -> str:
    """`prompts[0].generated_top[3]`, as the readers name places; "the top level" for the document itself."""
    where = ""
    for part in parts:
        where = path_join(where, part if isinstance(part, int) else str(part)[:60])
    return where or "the top level"


def _unknown_keys(error: ValidationError) -> list[str]:
    allowed = set(error.schema.get("properties", {}))
    return [key for key in error.instance if key not in allowed] if isinstance(error.instance, dict) else []


def _hint(error: ValidationError) -> str | None:
    """'Did you mean ...?' for a name close to one the schema allows."""
    if error.validator == "additionalProperties":
        unknown = _unknown_keys(error)
        return unknown_name_hint(unknown[0], error.schema.get("properties", {})) if unknown else None
    if error.validator == "enum" and isinstance(error.instance, str):
        return did_you_mean(error.instance, [c for c in error.validator_value if isinstance(c, str)])
    return None


# faults of a value's shape, which a schema's "title" (the noun for what belongs there) describes better
_SHAPE_KEYWORDS = frozenset({"type", "pattern", "minLength", "maxLength", "anyOf", "enum", "const", "minItems",
                             "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_TYPE_NAMES = {"object": "an object", "array": "a list", "string": "a string", "integer": "a whole number",
               "number": "a number", "boolean": "true or false", "null": "null"}


def reason(error: ValidationError) -> str:
    """What is wrong, in a few words and the value's short form (never the whole value)."""
    keyword, expected, got = error.validator, error.validator_value, kind(error.instance)
    if keyword in _SHAPE_KEYWORDS and isinstance(error.schema, dict) and "title" in error.schema \
            and "$schema" not in error.schema:  # a document's own title names the file, not a value
        return f"expected {error.schema['title']}, got {got}"  # the schema names what belongs here
    if keyword == "type":
        names = [expected] if isinstance(expected, str) else list(expected)
        return f"expected {' or '.join(_TYPE_NAMES.get(n, n) for n in names)}, got {got}"
    if keyword == "required":
        missing = [key for key in expected if isinstance(error.instance, dict) and key not in error.instance]
        return f"missing key {missing[0]!r}" if missing else error.message[:200]
    if keyword == "additionalProperties":
        unknown = _unknown_keys(error)
        return f"unknown key {unknown[0][:60]!r}" if unknown else error.message[:200]
    if keyword in ("enum", "const"):
        choices = expected if keyword == "enum" else [expected]
        return f"expected {' or '.join(json.dumps(c) for c in choices[:8])}, got {got}"
    if keyword in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        sign = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[keyword]
        return f"expected a number {sign} {expected:g}, got {got}"
    if keyword in ("minItems", "maxItems"):
        size = len(error.instance) if isinstance(error.instance, list) else "?"
        entries = "entry" if expected == 1 else "entries"
        return f"expected {'at least' if keyword == 'minItems' else 'at most'} {expected} {entries}, got {size}"
    if keyword == "maxLength":
        return f"expected at most {expected} characters, got {len(error.instance)}"
    if keyword in ("minLength", "pattern"):
        shape = "a non-blank string" if expected in (1, "\\S") else f"a string matching {expected}"
        return f"expected {shape}, got {got}"
    if keyword == "anyOf":
        return f"expected {_describe_any_of(expected)}, got {got}"
    if keyword == "propertyNames":
        return f"key {str(error.instance)[:60]!r} is not allowed here"
    return error.message[:200]


def _describe_any_of(options: list[dict[str, Any]]) -> str:
    kinds = []
    for option in options:
        if "enum" in option:
            kinds.append(" or ".join(json.dumps(c) for c in option["enum"]))
        elif "type" in option:
            kinds.append(_TYPE_NAMES.get(option["type"], option["type"]) if isinstance(option["type"], str)
                         else "a value")
    return " or ".join(kinds) or "another value"
