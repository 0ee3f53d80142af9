"""Progress lines (one as each stage of a cell starts and ends) and the summary table. Pure formatting."""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.runners.outcome import StageOutcome


def start_line(index: int, total: int, cell_id: str, stage: str) -> str:
    return f"kvgate: [{index}/{total}] {cell_id} {stage} started"


def end_line(index: int, total: int, outcome: StageOutcome) -> str:
    text = f"kvgate: [{index}/{total}] {outcome.cell_id} {outcome.stage} {outcome.status.upper()} " \
           f"in {format_seconds(outcome.elapsed)}"
    detail = outcome.headline if outcome.ok else (outcome.reason or "")
    return f"{text}: {detail}" if detail else text


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def summary_table(outcomes: Sequence[StageOutcome], max_detail: int = 110) -> str:
    rows = [("cell", "stage", "status", "elapsed", "result")]
    for outcome in outcomes:
        detail = outcome.headline if outcome.ok else (outcome.reason or "")
        if len(detail) > max_detail:
            detail = detail[: max_detail - 3] + "..."
        rows.append((outcome.cell_id, outcome.stage, outcome.status, format_seconds(outcome.elapsed), detail))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4])
        if n == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * max(6, min(max_detail, max(len(r[4]) for r in rows))))
    ok = sum(1 for o in outcomes if o.ok)
    failed = sum(1 for o in outcomes if o.failed)
    skipped = len(outcomes) - ok - failed
    lines.append(f"{len(outcomes)} stage runs, {ok} ok, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return "\n".join(line.rstrip() for line in lines)
