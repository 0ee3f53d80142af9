"""kvgate: does FP8 KV cache still work on every vLLM attention backend and GPU it claims?

The flow, one folder per stage:
    matrix/     which cells exist (backend x kv_cache_dtype x arch x workload), from matrix/*.toml
    runners/    each cell's stages run by the real tools (kernel tests, lm-eval + vLLM, vllm bench)
    kernels/    the decode-kernel unit tests against a PyTorch reference (the kernels stage)
    workloads/  what the embedded CPU default runs: tiny models and kvgate's own gsm8k problems
    results/    the results folder (docs/results-folder.md): records, writer, parsers, loader
    gate/       results + policy -> verdict (pure)
    report/     verdict -> Markdown, HTML, JUnit
    cli/        `kvgate`, the only place that prints errors and exits

This module holds what every stage shares: the version and the errors a user can act on (the core raises
them; only kvgate.cli prints them and exits).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

__version__ = "0.1.0"

EXIT_OK = 0
EXIT_FAILED = 1  # a check failed, a cell is missing, a stage crashed
EXIT_BAD_INPUT = 2  # unusable input: malformed files, unknown names, bad arguments


class InputError(Exception):
    """One problem with the input, printed as `ERROR <source>: <what> in <where>. <hint>`."""

    def __init__(self, source: str, what: str, where: str | None = None, hint: str | None = None):
        self.source = source
        self.what = what
        self.where = where
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.source}: {self.what}"
        if self.where:
            text += f" in {self.where}"
        if self.hint:
            text += f". {self.hint}"
        return text


class InputErrors(Exception):
    """Several input problems found in one pass; each is reported on its own line."""

    def __init__(self, errors: Iterable[InputError]):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


_LINE_BREAKING = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
# A changed path holding one of these (a tab included) cannot be shown or matched one a line: refused where read
PATH_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: object) -> str:
    """A message as one printed line whatever it quotes: every character that ends a line somewhere or hides (a
    newline from a results folder's file or folder name, a terminal escape) written as its escape (`\\n`), so no
    message can print a second line, least of all one a CI reads as a command (GitHub Actions' `::error::`)."""
    return _LINE_BREAKING.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), str(text))


def problems_of(error: InputError | InputErrors) -> list[InputError]:
    """The individual problems an InputError or InputErrors carries, for code that gathers them all."""
    return list(error.errors) if isinstance(error, InputErrors) else [error]


def did_you_mean(value: object, choices: Iterable[str]) -> str | None:
    """'Did you mean X?' for the closest known name, or None when nothing is close."""
    choices = list(choices)
    text = str(value)
    folded = {c.upper(): c for c in choices}
    if text.upper() in folded:
        return f"Did you mean {folded[text.upper()]}?"
    close = difflib.get_close_matches(text, choices, n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(text.upper(), list(folded), n=1, cutoff=0.6)
        close = [folded[c] for c in close]
    return f"Did you mean {close[0]}?" if close else None


def unknown_name_hint(value: object, choices: Iterable[str]) -> str:
    """A 'did you mean' when one is close, else the list of known names."""
    choices = sorted(choices)
    return did_you_mean(value, choices) or f"Known: {', '.join(choices)}"
