"""The report's first screen: per arch, one row per backend (and model, and feature) and one column per
kv_cache_dtype. A cell of the feature axis (flashmla-fp8-sm90-spec_decode) is a row of its own under its backend's
plain row: `FLASHMLA · spec_decode`.

Each entry is one cell in the seed PR's own terms: its word (kvgate.report.words), its accuracy on each lm-eval
filter (gsm8k strict-match / flexible-extract), its change in points against the base side of an A/B run (or,
without one, against the auto cell) with the bounds the gate tested, and its throughput (requests/s, output
tokens/s) with the ratio against the same reference. Pure: verdict -> rows, no I/O, no rendering.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvgate.gate.verdict import Check, Verdict
from kvgate.matrix.declarations import split_cell_id
from kvgate.report import words

DTYPE_ORDER = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """A cell against its reference: accuracy in points (candidate - reference, negative is a drop) or a ratio."""

    value: float
    bounds: tuple[float, float] | None  # the tested one-sided bounds, in the same sense as value
    reference: str  # "base" (the base side or --baseline) or "auto" (the auto cell)
    word: str  # the word of the check that judged it


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    cell: str
    word: str  # the worst word over the cell's checks (words.ORDER), INFO and NOT RUN only when nothing else
    accuracy: Mapping[str, float]  # lm-eval filter -> the cell's accuracy (its accuracy stage)
    accuracy_changes: tuple[Change, ...]  # on the decision's filter: against the base, then against auto
    requests_per_second: float | None
    output_tokens_per_second: float | None
    throughput_changes: tuple[Change, ...]  # the ratios against the base, then against auto
    reason: str = ""  # the worst check's one line, when the word needs attention or is WAIVED

    @property
    def zero_filters(self) -> tuple[str, ...]:
        """The lm-eval filters on which the cell answered nothing right (a broken model, or a broken cache)."""
        return tuple(name for name, value in self.accuracy.items() if value == 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    backend: str
    model: str  # shown only where one backend runs more than one model on the arch
    entries: Mapping[str, Entry]  # kv_cache_dtype -> entry
    feature: str = ""  # the cells' value of the feature axis; "": the plain cells

    @property
    def label(self) -> str:
        """'flashmla', 'flashmla · spec_decode' (the backend as the cell id spells it)."""
        return self.backend + (f" · {self.feature}" if self.feature else "")


@dataclass(frozen=True, kw_only=True, slots=True)
class ArchGrid:
    arch: str
    columns: tuple[str, ...]  # kv_cache_dtypes, auto first
    rows: tuple[Row, ...]


def split_cell(cell: str) -> tuple[str, str, str, str] | None:
    """(backend, kv_cache_dtype, arch, feature or "") of a cell id (kvgate.matrix.declarations.cell_id); None for
    "(run)" and anything else that is no cell id."""
    parts = split_cell_id(cell)
    if parts is None:  # an id of an arch this kvgate does not name (a matrix folder of one's own): its last part
        pieces = cell.split("-")
        return ("-".join(pieces[:-2]), pieces[-2], pieces[-1], "") if len(pieces) >= 3 and all(pieces) else None
    return parts


def build(verdict: Verdict) -> tuple[ArchGrid, ...]:
    by_cell: dict[tuple[str, str], list[Check]] = {}
    for check in verdict.checks:
        if split_cell(check.cell) is not None:
            by_cell.setdefault((check.cell, check.model), []).append(check)
    models: dict[tuple[str, str, str], set[str]] = {}  # (arch, backend, feature) -> models
    for cell, model in by_cell:
        backend, _, arch, feature = split_cell(cell)  # type: ignore[misc]
        models.setdefault((arch, backend, feature), set()).add(model)
    grids: dict[str, dict[tuple[str, str, str], dict[str, Entry]]] = {}
    for (cell, model), checks in by_cell.items():
        backend, dtype, arch, feature = split_cell(cell)  # type: ignore[misc]
        shown_model = model if len(models[(arch, backend, feature)]) > 1 else ""
        grids.setdefault(arch, {}).setdefault((backend, feature, shown_model), {})[dtype] = entry_of(cell, checks)
    out = []
    for arch in sorted(grids, key=_arch_key):
        rows = grids[arch]
        columns = sorted({dtype for entries in rows.values() for dtype in entries}, key=_dtype_key)
        out.append(ArchGrid(arch=arch, columns=tuple(columns), rows=tuple(
            Row(backend=backend, model=model, feature=feature, entries=rows[(backend, feature, model)])
            for backend, feature, model in sorted(rows))))
    return tuple(out)


def entry_of(cell: str, checks: Iterable[Check]) -> Entry:
    checks = list(checks)
    judged = [c for c in checks if c.status not in ("info", "not_run")] or checks
    worst = min(judged, key=lambda c: words.ORDER.index(words.word_of(c)))
    word = words.word_of(worst)
    stage = next((c for c in checks if c.kind == "accuracy" and c.status in ("pass", "waived")), None)
    accuracy = {name: float(value) for name, value in (stage.figures.items() if stage else ())
                if name not in ("n",) and not name.endswith("_stderr") and _number(value)}
    if word == words.PASS and 0 in accuracy.values():
        word = words.RAN  # a comparison of nothing right with nothing right passes: the cell ran, nothing held it
    reason = (worst.headline or worst.detail) if word in words.ATTENTION or word == words.WAIVED else ""
    throughput = next((c for c in checks if c.kind == "throughput" and c.figures), None)
    figures = throughput.figures if throughput else {}
    return Entry(cell=cell, word=word, accuracy=accuracy, accuracy_changes=_accuracy_changes(checks),
                 requests_per_second=_float(figures.get("median_requests_per_second")),
                 output_tokens_per_second=_float(figures.get("median_output_tokens_per_second")),
                 throughput_changes=_throughput_changes(checks), reason=reason)


def _accuracy_changes(checks: list[Check]) -> tuple[Change, ...]:
    """Against the base (what the change did), then against the auto cell (what FP8 costs); on the decision's
    filter where it was judged, else the first reported one."""
    out = []
    for kind, reference in (("baseline_accuracy", "base"), ("fp8_accuracy", "auto")):
        found = [c for c in checks if c.kind == kind and _number(c.figures.get("drop_points"))]
        found.sort(key=lambda c: c.status == "info")  # the decision's filter before the reported one
        if found:
            check = found[0]
            bounds = (-check.interval[1], -check.interval[0]) if check.interval else None
            out.append(Change(value=-float(check.figures["drop_points"]), bounds=bounds, reference=reference,
                              word=words.word_of(check)))
    return tuple(out)


def _throughput_changes(checks: list[Check]) -> tuple[Change, ...]:
    out = []
    for kind, reference in (("throughput", "base"), ("fp8_throughput", "auto")):
        check = next((c for c in checks if c.kind == kind and _number(c.figures.get("ratio"))), None)
        if check is not None:
            out.append(Change(value=float(check.figures["ratio"]), bounds=check.interval, reference=reference,
                              word=words.word_of(check)))
    return tuple(out)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _float(value: object) -> float | None:
    return float(value) if _number(value) else None  # type: ignore[arg-type]


def _dtype_key(dtype: str) -> tuple[int, str]:
    return (DTYPE_ORDER.index(dtype) if dtype in DTYPE_ORDER else len(DTYPE_ORDER), dtype)


def _arch_key(arch: str) -> tuple[int, int, str]:
    """GPU archs by compute capability (sm80 < sm90 < sm100), the CPU last."""
    digits = arch.removeprefix("sm")
    return (0, int(digits), arch) if digits.isdigit() else (1, 0, arch)
