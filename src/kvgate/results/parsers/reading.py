"""Shared helpers of the parsers: strict JSON, typed field access that says where a value is wrong."""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvgate import InputError
from kvgate.matrix import regular_files

MAX_FILE_BYTES = 256 * 1024 * 1024  # of a contract file (a probe file or a sample log is a few MB; more is hostile)


def present(path: Path) -> bool:
    """Something is at `path`: a file, a folder, or a link, even a dangling one or a loop (Path.exists() says False
    for those, which would read a broken link to status.json as "no status.json": a fail-open)."""
    return os.path.lexists(path)


def read_bytes(path: Path, source: str | None = None, *, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular file (a link is followed), at most `max_bytes`; InputError for anything else: a dangling
    link or a loop (cannot read), a folder, FIFO or device (never opened: a FIFO blocks, /dev/zero never ends), or a
    file past the cap."""
    source = source or str(path)
    max_bytes = MAX_FILE_BYTES if max_bytes is None else max_bytes
    try:
        return regular_files.read_bytes(path, max_bytes)
    except regular_files.NotRegularFile as error:
        raise InputError(source, f"not a regular file ({error.kind})", hint="Write the file itself at this name") from None
    except regular_files.FileTooLarge:
        raise InputError(source, f"larger than {_size(max_bytes)}, the most a contract file is read",
                         hint="Is this the file the tool wrote?") from None
    except OSError as error:
        raise InputError(source, f"cannot read: {error.strerror or error}") from None


def _size(count: int) -> str:
    return f"{count // (1024 * 1024)} MiB" if count >= 1024 * 1024 else f"{count} bytes"


def read_text(path: Path, source: str | None = None, *, max_bytes: int | None = None) -> str:
    source = source or str(path)
    data = read_bytes(path, source, max_bytes=max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(source, f"not UTF-8 text (byte {error.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as a text-mode open reads



def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


class OutOfRangeNumber(ValueError):
    """A JSON number past a float's range (`1e999`): Python's json reads it as infinity."""

    def __init__(self, literal: str):
        self.literal = literal
        shown = literal if len(literal) <= 24 else f"{literal[:12]}... ({len(literal)} characters)"
        sign = "-" if literal.startswith("-") else ""
        super().__init__(f"number {shown} is out of range (it reads as {sign}infinity)")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):  # no number literal reads as NaN
        raise OutOfRangeNumber(literal)
    return value


def strict_json(text: str | bytes) -> Any:
    """JSON as json.loads reads it, refusing what JSON has no number for and Python's json reads anyway: NaN and
    Infinity (ValueError) and numbers past a float's range, which it reads as infinity (OutOfRangeNumber).

    msgspec (a kvgate dependency) reads a clean file 3x faster than json and refuses all three; any file it refuses
    is read again by json, which reads what msgspec does not (a lone surrogate escape) or names the problem."""
    decode = _msgspec_decode()
    if decode is not None:
        try:
            return decode(text)
        except Exception:  # msgspec.DecodeError / ValidationError: the stdlib path decides
            pass
    return json.loads(text, parse_constant=_no_constants, parse_float=_finite_float)


@functools.cache
def _msgspec_decode() -> Any:
    try:
        import msgspec
    except ImportError:
        return None
    return msgspec.json.Decoder().decode


def out_of_range_place(text: str | bytes) -> str:
    """The JSON path of the first number in `text` past a float's range ("the file" if there is none)."""
    marker = object()
    data = json.loads(text, parse_float=lambda literal: marker if math.isinf(float(literal)) else 0.0)
    pending: list[tuple[str, Any]] = [("", data)]
    while pending:  # depth first, in document order
        where, value = pending.pop()
        if value is marker:
            return where or "the top level"
        if isinstance(value, dict):
            pending.extend(reversed([(path_join(where, key), item) for key, item in value.items()]))
        elif isinstance(value, list):
            pending.extend(reversed([(path_join(where, i), item) for i, item in enumerate(value)]))
    return "the file"


def loads(text: str, source: str, where: str | None = None) -> Any:
    """strict_json naming the file: the line and column of a syntax error, the place of a number out of range."""
    try:
        return strict_json(text)
    except OutOfRangeNumber as error:
        raise InputError(source, str(error), where or out_of_range_place(text), "Write a finite number or null") \
            from None
    except json.JSONDecodeError as error:
        place = f"line {error.lineno} column {error.colno}" if where is None else where
        # a file cut short (a job killed mid-write) ends inside a value, or inside a string that never closes
        cut = error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated string")
        what = "truncated JSON" if cut else f"invalid JSON ({error.msg})"
        raise InputError(source, what, place) from None
    except ValueError as error:  # NaN / Infinity, or an integer of over 4,300 digits (Python's limit)
        what = "a whole number of over 4300 digits" if "integer string conversion" in str(error) else str(error)
        raise InputError(source, what, where or "the file", "Write a finite number or null") from None
    except RecursionError:
        raise InputError(source, "JSON nested too deeply", where or "the file") from None


def past_float_range(value: int) -> bool:
    """A whole number no float holds (JSON reads 400 digits as an exact integer; as a figure it is infinite)."""
    try:
        float(value)
    except OverflowError:
        return True
    return False


def past_float_range_place(data: Any) -> str | None:
    """The JSON path of the first whole number in `data` past a float's range (None if there is none)."""
    pending: list[tuple[str, Any]] = [("", data)]
    while pending:  # depth first, in document order
        where, value = pending.pop()
        if isinstance(value, int) and not isinstance(value, bool) and past_float_range(value):
            return where or "the top level"
        if isinstance(value, dict):
            pending.extend(reversed([(path_join(where, key), item) for key, item in value.items()]))
        elif isinstance(value, list):
            pending.extend(reversed([(path_join(where, i), item) for i, item in enumerate(value)]))
    return None


def kind(value: Any) -> str:
    """How a value reads in an error message: its JSON type and a short repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int) and past_float_range(value):  # (repr refuses over 4,300 digits)
        return "a whole number past a float's range"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def path_join(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    if key.isidentifier():
        return f"{where}.{key}" if where else key
    return f"{where}[{key!r}]"


def expect_object(value: Any, source: str, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(source, f"expected an object, got {kind(value)}", where or "the top level")
    return value


def expect_number(value: Any, source: str, where: str, *, minimum: float | None = None,
                  positive: bool = False, maximum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(source, f"expected a number, got {kind(value)}", where)
    if isinstance(value, int) and past_float_range(value):
        raise InputError(source, f"expected a finite number, got {kind(value)}", where)
    if not math.isfinite(value):
        raise InputError(source, f"expected a finite number, got {value!r}", where)
    if positive and value <= 0:
        raise InputError(source, f"expected a number > 0, got {value!r}", where)
    if minimum is not None and value < minimum:
        raise InputError(source, f"expected a number >= {minimum:g}, got {value!r}", where)
    if maximum is not None and value > maximum:
        raise InputError(source, f"expected a number <= {maximum:g}, got {value!r}", where)
    return float(value)


def expect_int(value: Any, source: str, where: str, *, minimum: int = 0) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(source, f"expected an integer, got {kind(value)}", where)
    if past_float_range(value):  # no figure the gate computes holds it
        raise InputError(source, f"expected a finite integer, got {kind(value)}", where)
    if value < minimum:
        raise InputError(source, f"expected an integer >= {minimum}, got {value}", where)
    return value


def expect_string(value: Any, source: str, where: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InputError(source, f"expected a string, got {kind(value)}", where)
    if not allow_empty and not value.strip():
        raise InputError(source, "expected a non-empty string", where)
    return value


def major_version(value: Any, source: str, where: str) -> int:
    """The major part of a contract/format version written as 1, "1" or "1.2"."""
    if isinstance(value, bool):
        raise InputError(source, f"expected a version number, got {kind(value)}", where)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        head = value.split(".", 1)[0]
        # ASCII digits, at most 6 (the schemas' pattern): str.isdigit() took "²", and int() refuses it and over 4,300
        # digits, each a ValueError traceback
        if head.isascii() and head.isdigit() and len(head) <= 6:
            return int(head)
    raise InputError(source, f"expected a version number like 1 or \"1.0\", got {kind(value)}", where)
