"""A series of the history of main as people read it: a text table, and an SVG line plot with its change points.

Pure: strings in, strings out (the CLI writes them). The SVG is self-contained (no script, no external style), so
report.html or a CI artifact can hold it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from kvgate.history.detect import ChangePoint
from kvgate.history.store import Point

WIDTH, HEIGHT, MARGIN = 640, 200, 56  # room left of the plot for a 6-digit tick label at report.html's 12 px


def short(commit: str | None) -> str:
    return shown(commit[:12]) if commit else "-"


def shown(name: str) -> str:
    """A cell's, a measure's or a commit's name as printed text: as it is when it is plain, else quoted with its
    escapes (`'x\\n::error::y'`), so that no name read from a store can print a second line, hide characters, or
    open a line with `::`, which a CI reads as a command (GitHub Actions' `::error::`, `::add-mask::`)."""
    plain = name.isprintable() and name == name.strip() and not name.startswith(":") and "::" not in name
    return name if plain and name else repr(name)


def describe(cell: str, measure: str, points: Sequence[Point], point: ChangePoint) -> str:
    """One line naming a change point's first run, its shift and its p-value."""
    first = points[point.index]
    vllm = f" (vLLM {short(first.vllm_commit)})" if first.vllm_commit else ""
    return (f"{shown(cell)} {shown(measure)}: change point at run {point.index + 1} of {len(points)}, commit {short(first.commit)}"
            f"{vllm}, {shown(first.recorded_at)}: {point.mean_before:.6g} -> {point.mean_after:.6g} "
            f"({point.change_percent:+.2f} %), p = {point.p_value:.2g}")


def table(cell: str, measure: str, points: Sequence[Point], found: Sequence[ChangePoint] = (), *,
          last: int = 20) -> str:
    """The newest `last` runs of a series, one line each; a change point's first run is marked."""
    starts = {p.index for p in found}
    lines = [f"{shown(cell)} {shown(measure)} ({len(points)} runs on main)",
             f"  {'run':>4}  {'recorded at':<20}  {'commit':<12}  {'value':>12}  95 % interval"]
    for index in range(max(0, len(points) - last), len(points)):
        point = points[index]
        interval = f"{point.low:.6g} .. {point.high:.6g}" if point.low is not None and point.high is not None else ""
        mark = "  <- change point" if index in starts else ""
        lines.append(f"  {index + 1:>4}  {shown(point.recorded_at):<20}  {short(point.commit):<12}  {point.value:>12.6g}  "
                     f"{interval}{mark}")
    return "\n".join(lines)


def svg(cell: str, measure: str, points: Sequence[Point], found: Sequence[ChangePoint] = ()) -> str:
    """A line plot of the series (intervals as a band where recorded), each change point a dashed vertical line
    with its p-value; the title names the cell and the measure. Stored text is drawn as the table prints it (`shown`):
    XML forbids control characters, so a name holding one would leave the file not well-formed."""
    title = f"{shown(cell)} {shown(measure)}"
    values = [p.value for p in points]
    bounds = values + [b for p in points for b in (p.low, p.high) if b is not None]
    low, high = (min(bounds), max(bounds)) if bounds else (0.0, 1.0)
    if high == low:
        low, high = low - 1, high + 1
    plot_w, plot_h = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN

    def x(index: int) -> float:
        return MARGIN + (plot_w * index / (len(points) - 1) if len(points) > 1 else plot_w / 2)

    def y(value: float) -> float:
        return MARGIN + plot_h * (high - value) / (high - low)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}: {len(points)} runs on main</title>",
             f'<text x="{MARGIN}" y="{MARGIN - 16}" font-family="sans-serif" font-size="13">{escape(title)}</text>',
             f'<rect x="{MARGIN}" y="{MARGIN}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>',
             f'<text x="{MARGIN - 4}" y="{MARGIN + 4}" font-family="sans-serif" font-size="10" '
             f'text-anchor="end">{high:.4g}</text>',
             f'<text x="{MARGIN - 4}" y="{MARGIN + plot_h}" font-family="sans-serif" font-size="10" '
             f'text-anchor="end">{low:.4g}</text>']
    banded = [(i, p) for i, p in enumerate(points) if p.low is not None and p.high is not None]
    if len(banded) > 1:
        upper = " ".join(f"{x(i):.1f},{y(p.high):.1f}" for i, p in banded)  # type: ignore[arg-type]
        lower = " ".join(f"{x(i):.1f},{y(p.low):.1f}" for i, p in reversed(banded))  # type: ignore[arg-type]
        parts.append(f'<polygon points="{upper} {lower}" fill="#4a7fb5" fill-opacity="0.15"/>')
    if points:
        line = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        parts.append(f'<polyline points="{line}" fill="none" stroke="#4a7fb5" stroke-width="1.5"/>')
        for i, v in enumerate(values):  # each run's dot, a link to its commit where the run named its repository
            dot = (f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3" fill="#4a7fb5"><title>run {i + 1}, '
                   f"{escape(shown(points[i].recorded_at))}, commit {escape(short(points[i].commit))}"
                   f"{_vllm(points[i])}: {v:.6g}</title></circle>")
            parts.append(_linked(dot, points[i].commit_url))
        parts += axis(points, x, MARGIN + plot_h)
    for point in found:
        position = x(point.index) - (plot_w / (len(points) - 1) / 2 if len(points) > 1 else 0)
        parts.append(f'<line x1="{position:.1f}" y1="{MARGIN}" x2="{position:.1f}" y2="{MARGIN + plot_h}" '
                     f'stroke="#c0392b" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{position + 3:.1f}" y="{MARGIN + 12}" font-family="sans-serif" font-size="10" '
                     f'fill="#c0392b">{point.change_percent:+.1f} % (p = {point.p_value:.2g})</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


AXIS_LABELS = 5  # runs labelled under the plot at most: the first, the last and evenly between


def axis(points: Sequence[Point], x, bottom: float) -> list[str]:
    """The x axis: under a few runs, the date the run was made and its commit (a link to the commit's page)."""
    if not points:
        return []
    count = min(AXIS_LABELS, len(points))
    labelled = sorted({round(k * (len(points) - 1) / (count - 1)) for k in range(count)} if count > 1 else {0})
    parts = []
    for index in labelled:
        anchor = "start" if index == 0 and len(points) > 1 else "end" if index == len(points) - 1 and index else "middle"
        at = f'x="{x(index):.1f}" text-anchor="{anchor}" font-family="sans-serif" font-size="12"'
        parts.append(f'<line x1="{x(index):.1f}" x2="{x(index):.1f}" y1="{bottom:.1f}" y2="{bottom + 4:.1f}" '
                     'stroke="#999"/>')
        parts.append(f'<text {at} y="{bottom + 17:.1f}">{escape(shown(points[index].recorded_at[:10]))}</text>')
        parts.append(_linked(f'<text {at} y="{bottom + 32:.1f}" fill="#0969da">{escape(short(points[index].commit)[:9])}'
                             "</text>", points[index].commit_url))
    return parts


def _linked(element: str, url: str | None) -> str:
    return f'<a href="{escape(url)}" target="_top">{element}</a>' if url else element


def _vllm(point: Point) -> str:
    return f", vLLM {escape(short(point.vllm_commit))}" if point.vllm_commit else ""


def report_measures(measures: Sequence[str]) -> list[str]:
    """What report.html's "History of main" draws of a cell, of its measures in the order its run recorded them: its
    first accuracy filter (the task's own first, gsm8k's strict-match) and its requests per second."""
    accuracy = next((m for m in measures if m.startswith("accuracy:")), None)
    return [m for m in (accuracy, "throughput:requests_per_second") if m is not None and m in measures]


def stacked(plots: Sequence[str]) -> str:
    """Several plots of `svg` in one SVG document, one under another."""
    inner = [plot.replace("<svg ", f'<svg y="{index * HEIGHT}" ', 1) for index, plot in enumerate(plots)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{max(1, len(plots)) * HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {max(1, len(plots)) * HEIGHT}">\n' + "".join(inner) + "</svg>\n")
