"""Reading kvgate's TOML files (the matrix, the policy) so that every problem names its file and place.

Public, so every reader of a TOML file under matrix/ reports problems the same way:
    read_toml(path, hint)   one file -> its document, or an InputError naming the file
    TomlReader              walks a document, collecting every problem (`ERROR <file>: <what> in <where>`)
    describe_value(value)   how a value is named in an error ("the string 'x'", "a table", ...)
    shown_path(path)        a path as the user should see it (relative to the working folder when inside it)

Stdlib only (and regular_files beside it, the bounded reader of a regular file).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvgate import InputError, unknown_name_hint
from kvgate.matrix import regular_files

MAX_TOML_BYTES = 16 * 1024 * 1024  # kvgate's largest TOML file is a few tens of kB; /dev/zero never ends
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}")  # TomlReader.label


def read_toml(path: Path, *, missing_hint: str, invalid_hint: str | None = None) -> dict[str, Any]:
    """The document of one TOML file; InputError (file, what, hint) when it is missing or unreadable."""
    shown = shown_path(path)
    try:  # a regular file only: a FIFO would block the reader, /dev/zero never ends
        return tomllib.loads(regular_files.read_bytes(path, MAX_TOML_BYTES).decode("utf-8"))
    except regular_files.NotRegularFile as error:
        raise InputError(shown, f"not a regular file ({error.kind})", hint="Name the TOML file itself") from None
    except regular_files.FileTooLarge:
        raise InputError(shown, f"larger than {MAX_TOML_BYTES // (1024 * 1024)} MiB, far more than any kvgate TOML "
                         "file", hint="Name the TOML file itself") from None
    except FileNotFoundError:
        raise InputError(shown, "file is missing", hint=missing_hint) from None
    except tomllib.TOMLDecodeError as error:
        raise InputError(shown, f"invalid TOML: {error}", hint=invalid_hint) from None
    except UnicodeDecodeError as error:
        raise InputError(shown, f"not UTF-8 text (byte {error.start}): TOML files are UTF-8",
                         hint="Save the file as UTF-8") from None
    except OSError as error:
        raise InputError(shown, f"cannot read: {error.strerror or error}") from None


def shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class TomlReader:
    """Collects problems while walking the documents, so one run reports them all."""

    def __init__(self, source: str):
        self.source = source
        self.problems: list[InputError] = []

    def error(self, what: str, where: str, hint: str | None = None) -> None:
        self.problems.append(InputError(self.source, what, where, hint))

    def keys(self, table: Any, where: str, required: Sequence[str], optional: Sequence[str] = ()) -> bool:
        if not isinstance(table, dict):
            self.error(f"expected a table, got {describe_value(table)}", where)
            return False
        ok = True
        for key in table:
            if key not in required and key not in optional:
                self.error(f"unknown key '{key}'", where, unknown_name_hint(key, [*required, *optional]))
                ok = False
        for key in required:
            if key not in table:
                self.error(f"missing key '{key}'", where)
                ok = False
        return ok

    def named_tables(self, value: Any, where: str, example: str) -> bool:
        """[<where>.<name>] tables: True when `value` is a table of them, else one problem naming an example."""
        if not isinstance(value, dict):
            self.error(f"expected [{where}.<name>] tables, got {describe_value(value)}", where,
                       f"Declare each as a table: [{where}.{example}]")
        return isinstance(value, dict)

    def string(self, table: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
        value = table.get(key, default)
        if not isinstance(value, str) or not value.strip():
            self.error(f"expected a non-empty string, got {describe_value(value)}", f"{where}.{key}")
            return ""
        return value

    def label(self, table: Mapping[str, Any], key: str, where: str, what: str) -> str:
        """A runner label or agent queue name: letters, digits and . _ : / - only, so that it reaches a CI system's
        YAML or JSON as data (no `$` to interpolate, no line break, no markup)."""
        value = self.string(table, key, where)
        if value and not LABEL.fullmatch(value):
            self.error(f"{what} {ascii(value)[:80]} has characters a {what} cannot hold", f"{where}.{key}",
                       "Use letters, digits and . _ : / - (at most 100)")
            return ""
        return value

    def boolean(self, table: Mapping[str, Any], key: str, where: str) -> bool:
        value = table.get(key)
        if not isinstance(value, bool):
            self.error(f"expected true or false, got {describe_value(value)}", f"{where}.{key}")
            return False
        return value

    def names(self, value: Any, where: str, known: Iterable[str], what: str,
              allow_one: bool = False) -> tuple[str, ...]:
        """A list of known names (or one name where allow_one), each checked with a 'did you mean'."""
        if allow_one and isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.error(f"expected a list of {what} names, got {describe_value(value)}", where)
            return ()
        known = list(known)
        seen = set()
        out = []
        for index, item in enumerate(value):
            if item not in known:
                self.error(f"unknown {what} '{item}'", f"{where}[{index}]" if not allow_one or len(value) > 1 else where,
                           unknown_name_hint(item, known))
            elif item in seen:
                self.error(f"duplicate {what} '{item}'", f"{where}[{index}]")
            else:
                seen.add(item)
                out.append(item)
        return tuple(out)


def describe_value(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__
