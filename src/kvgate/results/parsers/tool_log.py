"""The first real error of a stage's log (logs/<stage>.log): what a maintainer reads first when a stage broke.

A failed engine's log ends in vLLM's wrapper ("RuntimeError: Engine core initialization failed. See root cause
above.") and repeats its root cause twice above it (once behind the engine's `ERROR` logger prefix, once bare); a
failed lm-eval run ends in lm-eval's own wrapper. So the last line says little. `first_error` reads the log top down:

1. the first line that matches one of KNOWN_ERRORS (vLLM's, lm-eval's, pytest's and kvgate's own messages, each the
   text of the code that writes it), earliest in the log;
2. else the exception that ends the log's first traceback (its last frame named beside it): a chained traceback
   ("The above exception was the direct cause ...") starts with its root cause;
3. else None (the stage's recorded reason stands alone).

Each answer is the line's number (1-based) and its text without the process and logger prefix
(`(EngineCore pid=3081) ERROR 12-01 05:27:40 [core.py:1330] `). Pure: text in, answer out; `read_first_error` is the
one reader, and it scans at most MAX_BYTES of a log's head and TAIL_BYTES of its end (a hostile or runaway log
cannot stall the gate; an engine that flooded its log and then died is still named).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 64 * 1024 * 1024  # of a log's head scanned for its first error
TAIL_BYTES = 1024 * 1024  # of its end, scanned when the head names none (a runaway log whose engine died at the end)
MAX_COUNTED_BYTES = 1024 * 1024 * 1024  # a log past this: its end is not scanned (its lines are counted to number it)
COUNT_CHUNK = 8 * 1024 * 1024
MAX_TEXT = 300  # characters of the error shown
# characters of a line matched: a known message's `.*` scans the rest of the line from each place its start appears, so
# a hostile line of n characters took time n^2 (a 1 MB line of "Selected backend " ~40 s, a 64 MiB log hours)
MAX_LINE = 4096

# Engine process and logger prefixes vLLM writes before a line: `(EngineCore pid=3081) `, `(EngineCore_DP0 pid=12)`,
# `ERROR 12-01 05:27:40 [core.py:1330] `; ANSI colours from a terminal.
LINE_PREFIX = re.compile(r"^(?:\([\w ]+ pid=\d+\)\s*)?(?:(?:ERROR|WARNING|INFO|DEBUG|CRITICAL) \d\d-\d\d [\d:.]+ "
                         r"\[[^\]]*\]\s?)?")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
EXCEPTION_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Failure)|"
                            r"AssertionError)\b(?::\s*(?P<message>.*))?$")
FRAME = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
TRACEBACK = "Traceback (most recent call last):"
# vLLM's wrappers of a root cause that is above them in the log: never the first real error
WRAPPERS = ("Engine core initialization failed", "EngineDeadError", "EngineGenerateError")


@dataclass(frozen=True, slots=True)
class KnownError:
    tool: str  # vllm | lm-eval | pytest | kvgate
    what: str  # what it means, in a few words
    pattern: re.Pattern[str]  # matched against a line without its prefix


def _known(tool: str, what: str, pattern: str) -> KnownError:
    return KnownError(tool, what, re.compile(pattern))


# The messages, each the text of the code that writes it (vLLM 0.26-0.32, lm-eval 0.4.13, pytest 9).
KNOWN_ERRORS: tuple[KnownError, ...] = (
    # vllm/v1/worker/gpu_worker.py determine_available_memory: another process changed GPU memory meanwhile
    _known("vllm", "memory profiling", r"Error in memory profiling\. Initial free memory"),
    # torch's caching allocator, inside vLLM (torch.OutOfMemoryError, torch.cuda.OutOfMemoryError)
    _known("vllm", "out of GPU memory", r"(?:OutOfMemoryError|RuntimeError): CUDA out of memory"),
    # vllm/v1/core/kv_cache_utils.py: no room for the KV cache, or too little for one request of max_model_len
    _known("vllm", "no memory for the KV cache", r"No available memory for the cache blocks"),
    _known("vllm", "KV cache too small", r"To serve at least one request with the model's max seq len"),
    # vllm/platforms/cuda.py, rocm.py: the requested backend cannot run this configuration
    _known("vllm", "backend not valid", r"Selected backend .* is not valid for this configuration"),
    _known("vllm", "no valid backend", r"No valid attention backend found for"),
    # CUDA errors raised through torch (c10/cuda): a kernel fault, a busy or missing device
    _known("vllm", "CUDA error", r"^(?:torch\.AcceleratorError|RuntimeError|torch\.cuda\.\w+Error): CUDA error: "),
    _known("vllm", "CUDA driver", r"CUDA driver initialization failed|Found no NVIDIA driver on your system|"
                                  r"No CUDA GPUs are available"),
    # lm_eval/config/evaluate_config.py and evaluator.py: a task name lm-eval does not know, a task with no documents
    _known("lm-eval", "unknown task", r"Tasks not found: |No tasks specified, or no tasks found|"
                                      r"did not find any docs"),
    # datasets / huggingface_hub offline: the data or the model is not in the cache
    _known("lm-eval", "dataset not cached", r"DatasetNotFoundError|Couldn't find cache for|"
                                            r"Couldn't reach '.*' on the Hub \(LocalEntryNotFoundError\)"),
    _known("lm-eval", "model not cached", r"LocalEntryNotFoundError|OfflineModeIsEnabled|"
                                          r"We couldn't connect to 'https://huggingface\.co'"),
    # pytest's report of a failed assertion (`E   AssertionError: ...`): the first failing test's message
    _known("pytest", "test failed", r"^E\s+(?:\w+\.)*\w*(?:Error|Exception)\b"),
    # kvgate's own one-line errors (kvgate.cli: `ERROR <file>: <what>`)
    _known("kvgate", "kvgate error", r"^ERROR \S.*: "),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class FirstError:
    line: int  # 1-based line of the log
    text: str  # the error, one line, its prefix removed
    found_by: str  # "vllm: memory profiling", "traceback", ...
    frame: str = ""  # the last frame of its traceback, when found by the traceback ("gpu_worker.py:532 in f")


def plain(raw: str) -> str:
    """A log line without colours, process and logger prefix, or surrounding space."""
    return LINE_PREFIX.sub("", ANSI.sub("", raw)).strip()


def first_error(lines: Iterable[str]) -> FirstError | None:
    """The first real error of a log given line by line (see the module's docstring)."""
    traceback: FirstError | None = None
    in_traceback, frame, source = False, "", ""
    for number, text in _numbered(lines):
        for known in KNOWN_ERRORS:
            if known.pattern.search(text) and not any(wrapper in text for wrapper in WRAPPERS):
                return FirstError(line=number, text=_shown(text.removeprefix("E").strip() if known.tool == "pytest"
                                                           else text), found_by=f"{known.tool}: {known.what}")
        if traceback is not None:
            continue
        if text == TRACEBACK:
            in_traceback, frame = True, ""
            continue
        if not in_traceback:
            continue
        match = FRAME.match(text)
        if match:
            frame, source = f"{Path(match['file']).name}:{match['line']} in {match['function']}", ""
            continue
        exception = EXCEPTION_LINE.match(text)
        if exception and not any(wrapper in text for wrapper in WRAPPERS):
            # a bare `AssertionError` says nothing: the assert statement above it does
            shown = f"{text}: {source}" if not exception["message"] and source else text
            traceback = FirstError(line=number, text=_shown(shown), found_by="traceback", frame=frame)
            in_traceback = False
        elif not text.startswith(("^", "~")):
            source = text
    return traceback


def _numbered(lines: Iterable[str]) -> Iterable[tuple[int, str]]:
    """(line number, plain text) of each non-empty part of the log; a line that a progress bar rewrote with carriage
    returns keeps one number (the number an editor and `grep -n` show), each of its parts read on its own."""
    for number, raw in enumerate(lines, start=1):
        for part in raw.rstrip("\n").split("\r"):
            text = plain(part[:MAX_LINE])
            if text:
                yield number, text


def read_first_error(path: Path) -> FirstError | None:
    """The first real error of the log at `path`: in its first MAX_BYTES, else (a longer log, up to MAX_COUNTED_BYTES)
    in its last TAIL_BYTES from a line's start, numbered as in the whole log; what lies between is not scanned. None
    when it names none or cannot be read (a log is evidence for people, never a reason the gate could not judge)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(MAX_BYTES)
            found = first_error(head.decode("utf-8", "replace").split("\n"))
            size = os.fstat(handle.fileno()).st_size
            if found is not None or len(head) < MAX_BYTES or size <= MAX_BYTES or size > MAX_COUNTED_BYTES:
                return found
            lines_before, last_byte = head.count(b"\n"), head[-1:]
            for_counting = max(0, size - TAIL_BYTES - MAX_BYTES)
            while for_counting > 0:
                chunk = handle.read(min(COUNT_CHUNK, for_counting))
                if not chunk:
                    return None
                lines_before, last_byte, for_counting = (lines_before + chunk.count(b"\n"), chunk[-1:],
                                                         for_counting - len(chunk))
            tail = handle.read(TAIL_BYTES)
    except OSError:
        return None
    if last_byte != b"\n":  # the tail starts inside a line: from the next one
        cut = tail.find(b"\n")
        if cut < 0:
            return None
        tail, lines_before = tail[cut + 1:], lines_before + 1
    found = first_error(tail.decode("utf-8", "replace").split("\n"))
    return None if found is None else dataclasses.replace(found, line=found.line + lines_before)


def _shown(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"
