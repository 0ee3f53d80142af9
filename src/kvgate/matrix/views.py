"""Views of the matrix's cells: a text table for people, the GitHub Actions matrix for machines."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from kvgate.matrix.cells import Cell, Matrix

CELL_SESSION = "cell"


def cell_session(cell: Cell) -> str:
    """The nox session that runs every stage of one cell (`nox -s "cell(<id>)"`)."""
    return f"{CELL_SESSION}({cell.id})"


def gha_matrix(matrix: Matrix, cells: Sequence[Cell],
               extras: Mapping[str, Mapping[str, object]] | None = None) -> dict[str, list[dict[str, object]]]:
    """`{"include": [...]}` for `strategy.matrix`, one job per cell; `extras` adds keys per cell id (the plan's
    stages, the path that selected it)."""
    return {
        "include": [
            {
                "cell": cell.id,
                "backend": cell.backend,
                "kv_cache_dtype": cell.kv_cache_dtype,
                "arch": cell.arch,
                "model": cell.model,
                "runner": matrix.runner_for(cell),
                "sessions": [cell_session(cell)],
                **(extras or {}).get(cell.id, {}),
            }
            for cell in cells
        ]
    }


def nearest_cells(cells: Sequence[Cell], *, archs: Sequence[str] = (), backends: Sequence[str] = (),
                  kv_cache_dtypes: Sequence[str] = (), cell_ids: Sequence[str] = (), limit: int = 5) -> list[str]:
    """The ids of the cells nearest to filters that select none: those that pass every filter but one (backend names
    in any case), closest first to the id the filters spell; difflib's closest ids when no cell comes that near."""
    wanted = {"arch": set(archs), "backend": {b.upper() for b in backends},
              "kv_cache_dtype": set(kv_cache_dtypes), "id": set(cell_ids)}

    def misses(cell: Cell) -> int:
        values = {"arch": cell.arch, "backend": cell.backend.upper(), "kv_cache_dtype": cell.kv_cache_dtype,
                  "id": cell.id}
        return sum(1 for key, allowed in wanted.items() if allowed and values[key] not in allowed)

    spelled = "-".join(sorted(wanted[key])[0].lower() if wanted[key] else "" for key in
                       ("backend", "kv_cache_dtype", "arch"))
    queries = sorted(cell_ids) or [spelled]
    ids = [cell.id for cell in cells]

    def closeness(cell_id: str) -> float:
        return max(difflib.SequenceMatcher(None, query, cell_id).ratio() for query in queries)

    near = [cell.id for cell in cells if misses(cell) <= 1]
    if near:
        return sorted(near, key=lambda cell_id: (-closeness(cell_id), cell_id))[:limit]
    found: list[str] = []
    for query in queries:
        found += [c for c in difflib.get_close_matches(query, ids, n=limit, cutoff=0.0) if c not in found]
    return found[:limit]


def cells_table(matrix: Matrix, cells: Sequence[Cell]) -> str:
    headers = ("cell", "backend", "kv_cache_dtype", "arch", "runner", "model", "waived")
    rows = [
        (cell.id, cell.backend, cell.kv_cache_dtype, cell.arch, matrix.runner_for(cell), cell.model,
         ", ".join(w.where for w in matrix.waivers if w.match.matches(cell)) or "")
        for cell in cells
    ]
    widths = [max(len(str(v)) for v in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in (headers, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = ", ".join(f"{arch} {n}" for arch, n in _count_by_arch(cells).items())
    lines.append(f"{len(cells)} cells ({counts})" if cells else "0 cells")
    return "\n".join([*lines, *waiver_legend(matrix, cells)])


def waiver_legend(matrix: Matrix, cells: Sequence[Cell]) -> list[str]:
    """What the `waived` column's entries mean: each waiver the listed cells name, with its checks, its expiry, the
    issue that tracks it and its reason (matrix/waivers.toml)."""
    shown = [w for w in matrix.waivers if any(w.match.matches(cell) for cell in cells)]
    if not shown:
        return []
    lines = ["", "waived: checks known to fail, read WAIVED (never PASS) until the waiver expires (matrix/waivers.toml)"]
    for waiver in shown:
        checks = "every check" if "*" in waiver.checks else ", ".join(waiver.checks)
        lines.append(f"  {waiver.where}: {checks}, until {waiver.expires.isoformat()}; {waiver.issue}")
        lines.append(f"    {waiver.reason}")
    return lines


def _count_by_arch(cells: Sequence[Cell]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for cell in cells:
        counts[cell.arch] = counts.get(cell.arch, 0) + 1
    return counts
