"""Reading one value of policy.toml: numbers in a range, counts, choices, each problem named with its key path
(kvgate.matrix.toml_reading's reader collects them); and the shape of a cell the policy's selectors match."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kvgate import unknown_name_hint
from kvgate.matrix.toml_reading import TomlReader, describe_value


class CellLike(Protocol):
    """What the policy needs of a cell: kvgate.matrix.cells.Cell and kvgate.results.records.CellIdentity both fit."""

    backend: str
    kv_cache_dtype: str
    arch: str

    @property
    def id(self) -> str: ...


def read_number(reader: TomlReader, table: Mapping[str, Any], key: str, where: str, *, low: float, high: float,
            low_open: bool = False, high_open: bool = False, integer: bool = False) -> float:
    value = table.get(key)
    number_ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if number_ok and math.isfinite(value):
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if above and below:
            return value
    kind = "an integer" if integer else "a number"
    lo = f"{'>' if low_open else '>='} {low:g}"
    hi = "" if math.isinf(high) else f" and {'<' if high_open else '<='} {high:g}"
    reader.error(f"expected {kind} {lo}{hi}, got {describe_value(value)}", f"{where}.{key}")
    return math.nan


def read_count(reader: TomlReader, table: Mapping[str, Any], key: str, where: str, *, low: float, high: float) -> int:
    value = read_number(reader, table, key, where, low=low, high=high, integer=True)
    return 0 if math.isnan(value) else int(value)


def read_choice(reader: TomlReader, table: Mapping[str, Any], key: str, where: str, choices: Sequence[str],
            what: str) -> str:
    value = table.get(key)
    if isinstance(value, str) and value in choices:
        return value
    shown = f"'{value}'" if isinstance(value, str) else describe_value(value)
    reader.error(f"unknown {what} {shown}", f"{where}.{key}", unknown_name_hint(value, choices))
    return ""
