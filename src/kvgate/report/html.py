"""Verdict -> report.html: one self-contained page (inline CSS and SVG, no script, no network), as readable on a
phone as on a laptop (tests/test_report_browser.py measures both in a real headless Chromium).

First the headline and, where anything failed, "Needs attention": each failing check with its one-line reason, so
the first screen shows it. Then a legend (one colour per status word, kvgate.report.words, and the marks) and the
plots, one row per figure, each with its threshold drawn and labelled and an axis title:
- accuracy per cell and filter (the reported mean ± 1.96 stderr), auto and FP8 side by side per backend/arch/model,
  with the auto cell's accuracy floor;
- the paired accuracy drops (FP8 against auto, head against baseline) with their bounds and margins;
- throughput ratios (FP8/auto, and head/baseline) with their bounds and minimum ratios, around 1.0.
A check whose stage errored or is missing keeps its row, as a cross with its reason.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvgate.gate import rerun
from kvgate.gate.verdict import Check, Verdict, sort_key
from kvgate.report import grid
from kvgate.report.markdown import (
    adjusted,
    headline,
    multiplicity_text,
    plain_headline,
    run_facts,
    shorten,
    totals_text,
)
from kvgate.report.words import ATTENTION, COLOR, LABEL, MEANING, ORDER, WAIVED, word_of

STATUS_COLORS = COLOR  # one colour per status word, in the badges, the plots and their legend
NEEDS_ATTENTION_WORDS = 200  # characters of a failing check's own words in Needs attention (the table has them all)

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:20px auto;padding:0 20px;
color:#1f2328;max-width:1200px} @media (max-width:600px){body{margin:10px auto;padding:0 10px}}
h1{font-size:20px;margin:0 0 6px} h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
.ctx{color:#57606a;margin-bottom:10px} table{border-collapse:collapse;width:100%;font-size:12.5px}
th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left;vertical-align:top} th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:0 8px;font-size:11.5px;font-weight:600;white-space:nowrap}
svg text{font:12px system-ui,sans-serif;fill:#1f2328} svg text.axis-title,svg text.threshold{font-weight:600}
svg.plot{display:block} .note{color:#57606a;font-size:12.5px} .scroll{overflow-x:auto} svg a text{fill:#0969da}
h1,.ctx,li,td{overflow-wrap:anywhere}
code{font-size:12px;background:#f6f8fa;padding:0 3px;border-radius:3px;white-space:nowrap}
code.wrap{white-space:pre-wrap;overflow-wrap:anywhere;display:inline}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12.5px;margin:6px 0}
.legend svg{vertical-align:middle;margin-right:4px} #needs-attention li{margin:4px 0}
#needs-attention .more{display:block;color:#57606a;font-size:12.5px}
.totals{color:#57606a;font-size:12.5px;margin-top:4px}
.cards{display:none;list-style:none;padding:0;margin:0}
.cards li{border:1px solid #d0d7de;border-left-width:4px;border-radius:4px;padding:4px 8px;margin:0 0 6px}
@media (max-width:600px){
  .grid-wide{display:none} .cards{display:block}
  table.checks,table.checks tbody,table.checks tr,table.checks td{display:block;width:auto}
  table.checks tr:first-child{display:none} table.checks tr{border:1px solid #d0d7de;margin:0 0 6px}
  table.checks td{border:0;padding:1px 6px;text-align:left;white-space:normal}
  table.checks td:empty{display:none}
  table.checks td[data-label]:before{content:attr(data-label) ": ";color:#57606a}
}
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class HistoryPlots:
    """The history of main of a run the gate recorded in it: one SVG per cell (kvgate.history.trends, drawn by the
    CLI, which holds the store), of the `cells` the run has."""

    plots: tuple[str, ...]
    cells: int
    runs: int  # the newest runs of each series drawn


def render_html(verdict: Verdict, history: HistoryPlots | None = None) -> str:
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{_e(_plain(headline(verdict)))}</title>", f"<style>{CSS}</style></head><body>",
             f"<h1>{_badge(*_verdict_badge(verdict))} "
             f"{_e(_plain(headline(verdict)))}</h1>", f'<div class="ctx">{_e(_context(verdict))}</div>',
             "<div>" + " ".join(_badge(w, f"{LABEL[w]} {n}") for w, n in verdict.totals().words.items() if n)
             + f'</div><div class="totals">{_e(totals_text(verdict))}</div>', _needs_attention(verdict),
             grid_html(verdict)]  # what failed first: on the first screen
    plotted = [row.word for rows in (_accuracy_rows(verdict), _drop_rows(verdict), _ratio_rows(verdict))
               for row in rows]
    if plotted:
        parts.append(_legend(plotted))
    accuracy = _accuracy_plot(verdict)
    if accuracy:
        parts += ["<h2>Accuracy per cell</h2>",
                  '<p class="note">Reported mean with ±1.96 standard errors (lm-eval); FP8 cells beside the auto '
                  "cell of the same backend, arch and model. The gate itself tests the paired drop on the same "
                  "questions, which is much tighter than these bars.</p>", accuracy]
    drops = _drop_plot(verdict)
    if drops:
        parts += ["<h2>Accuracy drop against the reference (paired)</h2>",
                  '<p class="note">Drop in points of each FP8 cell against its auto cell (and of each cell against '
                  "the baseline), with its bounds, each one-sided at the decision's level; dashed: the allowed "
                  "margin. A check fails when the lower bound is above the margin (the data reject "
                  "\"drop ≤ margin\").</p>", drops]
    ratios = _ratio_plot(verdict)
    if ratios:
        parts += ["<h2>Throughput ratios</h2>",
                  '<p class="note">Ratio of medians over repeats (requests/s) with the bounds of the tested '
                  "ratio, each one-sided at the decision's level; dashed line: the threshold where one is judged (a "
                  "check fails when the upper bound is below it).</p>", ratios]
    if history is not None and history.plots:
        parts.append(history_html(history))
    p_header = "p (adj.)" if adjusted(verdict) else "p"  # as report.md: "adj." only where a family was adjusted
    parts += ["<h2>Checks</h2>", _table(sorted(verdict.checks, key=sort_key), p_header=p_header)]
    parts += ["<h2>Method</h2>", "<ul>",
              f"<li>Multiplicity: {_e(multiplicity_text(verdict))}.</li>"]
    notes: dict[str, list[str]] = {}
    for check in verdict.checks:
        for note in check.notes:
            notes.setdefault(note, []).append(check.name)
    for note, names in notes.items():
        parts.append(f"<li>{_e(note)} <span class=note>({_e(', '.join(names[:8]))}"
                     f"{' …' if len(names) > 8 else ''})</span></li>")
    parts += ["</ul>", "</body></html>", ""]
    return "\n".join(parts)


def history_html(history: HistoryPlots) -> str:
    """"History of main": each plot at its own size (its text stays legible) in a box that scrolls sideways on a
    narrow screen, so that the page itself never gets wider than the window."""
    shown = len(history.plots)
    which = (f"the trends of {shown} of its {history.cells} cells, those that need attention first"
             if shown < history.cells else f"the trend of each of its {shown} cell{'s' if shown != 1 else ''}")
    return ('<section id="history"><h2>History of main</h2>'
            f'<p class="note">This run is recorded in the history of main; here {which}, over the newest '
            f"{history.runs} runs at most (accuracy with its 95 % interval as a band, requests/s). "
            "<code>kvgate history</code> shows every series, kernel timings included, and <code>--detect</code> "
            "finds their change points.</p>"
            + "".join(f'<div class="scroll">{plot}</div>' for plot in history.plots) + "</section>")


def _needs_attention(verdict: Verdict, most: int = 20) -> str:
    """The failing checks, near the top, so that the first screen shows what failed: each with its few words, the
    first real error of its log with a link to the log at that line's place, and the command that reruns its cell."""
    failed = sorted(verdict.failed, key=sort_key)
    if not failed:
        return ""
    items = []
    for c in failed[:most]:
        what = shorten(c.headline or c.detail, NEEDS_ATTENTION_WORDS)
        more = []
        if c.log is not None:
            where = (f'<a href="{_e(c.log.url)}">{_e(c.log.where)}</a>' if c.log.url else f"<code>{_e(c.log.where)}</code>")
            frame = f" (in {_e(c.log.frame)})" if c.log.frame else ""
            more.append(f'<span class="more">first error: <code class="wrap">{_e(c.log.error)}</code>{frame} — '
                        f"{where}</span>")
        command = rerun.rerun_command(c, verdict.run_info)
        if command:
            more.append(f'<span class="more">rerun this cell: <code class="wrap">{_e(command)}</code></span>')
        items.append(f"<li>{_badge(word_of(c), LABEL[word_of(c)])} <code>{_e(c.cell)}</code> {_e(c.kind)}"
                     f"{f' [{_e(c.subject)}]' if c.subject else ''}: {_e(what)}{''.join(more)}</li>")
    if len(failed) > most:
        items.append(f"<li>… and {len(failed) - most} more in Checks below</li>")
    return '<section id="needs-attention"><h2>Needs attention</h2><ul>' + "".join(items) + "</ul></section>"


def _legend(words: Iterable[str]) -> str:
    """What the plots' colours and marks mean: one colour per status word (kvgate.report.words), the same in every
    plot and badge."""
    present = sorted(set(words), key=ORDER.index)
    entries = [f'<span><svg width="12" height="12"><circle cx="6" cy="6" r="5" fill="{COLOR[w]}"/></svg>'
               f"<b>{_e(LABEL[w])}</b> {_e(MEANING[w])}</span>" for w in present]
    entries += ['<span><svg width="22" height="12"><line x1="1" x2="21" y1="6" y2="6" stroke="#57606a" '
                'stroke-width="2"/><circle cx="11" cy="6" r="4" fill="#57606a"/></svg>the figure and its interval</span>',
                '<span><svg width="8" height="14"><line x1="4" x2="4" y1="0" y2="14" stroke="#1f2328" '
                'stroke-dasharray="3,2"/></svg>its threshold (floor, margin or minimum ratio, labelled on top)</span>',
                '<span><svg width="8" height="14"><line x1="4" x2="4" y1="0" y2="14" stroke="#57606a"/></svg>'
                "no change (a drop of 0, a ratio of 1)</span>",
                '<span><svg width="12" height="12"><path d="M1 1L11 11M1 11L11 1" stroke="#57606a" stroke-width="2.5"/>'
                "</svg>no figure: the stage errored or is missing</span>"]
    return '<div class="legend" aria-label="legend">' + "".join(entries) + "</div>"


def _context(verdict: Verdict) -> str:
    parts = [f"run {verdict.run}", *run_facts(verdict.run_info)]
    if verdict.baseline:
        parts.append(f"baseline {verdict.baseline}")
    parts.append(f"judged {verdict.today}")
    return " · ".join(parts)


def _plain(text: str) -> str:
    """The headline without its leading emoji (the page shows a coloured badge instead; no emoji font needed)."""
    return plain_headline(text)


def _verdict_badge(verdict: Verdict) -> tuple[str, str]:
    if not verdict.passed:
        return "fail", "FAILED"
    return ("not_run", "NEUTRAL") if verdict.neutral else ("pass", "PASSED")


def _badge(status: str, text: str) -> str:
    return f'<span class="badge" style="background:{STATUS_COLORS[status]}">{_e(text)}</span>'


def _table(checks: Iterable[Check], *, p_header: str) -> str:
    """Every check, one row each; on a phone each row stacks into a block, each value labelled (no sideways scroll)."""
    rows = ['<table class="checks"><tr><th>status</th><th>cell</th><th>check</th><th>measured</th><th>interval</th>'
            f"<th>threshold</th><th>{p_header}</th></tr>"]
    for c in checks:
        interval = f"[{c.interval[0]:.3g}, {c.interval[1]:.3g}]" if c.interval else ""
        adjusted_p = c.adjusted_p_value
        p = "" if c.p_value is None or c.status == "info" else _p(c.p_value) + (
            f" ({_p(adjusted_p)})" if adjusted_p is not None and adjusted_p != c.p_value else "")
        kind = c.kind + (f" <code>{_e(c.subject)}</code>" if c.subject and c.kind.endswith("accuracy") else "")
        log = f' <a href="{_e(c.log.url)}">(open the log)</a>' if c.log is not None and c.log.url else ""
        rows.append(f"<tr><td>{_badge(word_of(c), LABEL[word_of(c)])}</td>"
                    f"<td><code>{_e(c.cell)}</code></td><td>{kind}</td><td>{_e(c.detail)}{log}</td>"
                    f'<td class="num" data-label="interval">{_e(interval)}</td>'
                    f'<td data-label="threshold">{_e(c.threshold_text)}</td>'
                    f'<td class="num" data-label="{_e(p_header)}">{p}</td></tr>')
    rows.append("</table>")
    return "\n".join(rows)


def _p(p: float) -> str:
    return "&lt;0.001" if p < 0.001 else f"{p:.3f}"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


# ---------------------------------------------------------------------------------------------- plots
# Each plot is an SVG as wide as the page: its x positions are percentages of its width and its text keeps the page's
# size in pixels, so a phone shows the same plot narrower with readable labels (never a scaled-down picture).
# One row per figure: the row's label on a line of its own (the cell id once per cell, then only what differs),
# the figure below it as a dot coloured by its status word (the legend above the plots), its interval as a bar,
# its threshold as a dashed tick. A check that has no figure (its stage errored or is missing) keeps its row: a
# cross at the left edge, with its reason.

LABEL_GAP = 14  # label baseline to the bar below it
ROW = 36
TOP = 30  # room for the thresholds' labels
BOTTOM = 58  # room for the tick labels and the axis title's two lines
PLOT_LEFT, PLOT_RIGHT = 3.0, 97.0  # per cent of the width
ROW_TEXT = 50  # characters of a row's label and reason: what a 390 px phone shows at 12 px


@dataclass(frozen=True, slots=True)
class _Row:
    cell: str
    label: str  # what the row shows after the cell id
    word: str  # the status word that colours it
    value: float | None  # None: no figure (a cross, with `reason`)
    interval: tuple[float, float] | None = None
    threshold: float | None = None
    reason: str = ""


def _accuracy_plot(verdict: Verdict) -> str:
    """One row per cell and filter: the mean and its ±1.96 stderr bar; dashed: the auto cell's accuracy floor."""
    return _plot(_accuracy_rows(verdict), aria="accuracy per cell", threshold_label="floor {:.3g}", floor=0.0,
                 ceil=1.0, axis_title="accuracy (share of questions right; bar: ±1.96 stderr)")


def _accuracy_rows(verdict: Verdict) -> list[_Row]:
    checks = sorted((c for c in verdict.checks if c.kind == "accuracy" and c.status != "not_run"),
                    key=lambda c: _group_key(c.cell))
    floors = {(c.cell, c.subject): c.threshold["floor"] for c in verdict.checks
              if c.kind == "accuracy_floor" and isinstance(c.threshold.get("floor"), (int, float))}
    filters = sorted({k for c in checks for k in c.figures if not k.endswith("_stderr") and k != "n"})
    rows = []
    for check in checks:
        means = [(name, check.figures[name]) for name in filters if isinstance(check.figures.get(name), (int, float))]
        if not means:
            rows.append(_Row(check.cell, "", word_of(check), None, reason=check.detail))
        for name, mean in means:
            stderr = check.figures.get(f"{name}_stderr")
            interval = ((mean - 1.96 * stderr, mean + 1.96 * stderr) if isinstance(stderr, (int, float)) and stderr
                        else None)
            rows.append(_Row(check.cell, name, word_of(check), float(mean), interval, floors.get((check.cell, name))))
    return rows


def _ratio_plot(verdict: Verdict) -> str:
    return _plot(_ratio_rows(verdict), aria="throughput ratios", threshold_label="min {:.3g}", reference=1.0,
                 axis_title="throughput ratio (requests/s, FP8 or head over reference)")


def _ratio_rows(verdict: Verdict) -> list[_Row]:
    checks = sorted((c for c in verdict.checks if c.kind in ("fp8_throughput", "throughput")
                     and (isinstance(c.figures.get("ratio"), (int, float)) or c.status in ("error", "missing"))),
                    key=lambda c: (_group_key(c.cell), c.kind))
    return [_Row(c.cell, "fp8/auto" if c.kind == "fp8_throughput" else "vs baseline" if c.reference else "stage",
                 word_of(c),
                 _number(c.figures.get("ratio")), c.interval, _number(c.threshold.get("min_ratio")), c.detail)
            for c in checks]


def _drop_plot(verdict: Verdict) -> str:
    return _plot(_drop_rows(verdict), aria="accuracy drops", threshold_label="margin {:.3g}", reference=0.0,
                 axis_title="accuracy drop, points (reference minus FP8 or head)")


def _drop_rows(verdict: Verdict) -> list[_Row]:
    checks = sorted((c for c in verdict.checks if c.kind in ("fp8_accuracy", "baseline_accuracy")
                     and (isinstance(c.figures.get("drop_points"), (int, float)) or c.status in ("error", "missing"))),
                    key=lambda c: (_group_key(c.cell), c.kind, c.subject or ""))
    return [_Row(c.cell, f"{c.subject} · {'vs auto' if c.kind == 'fp8_accuracy' else 'vs baseline'}", word_of(c),
                 _number(c.figures.get("drop_points")), c.interval, _number(c.threshold.get("margin_points")),
                 c.detail) for c in checks]


def _plot(rows: list[_Row], *, aria: str, axis_title: str, threshold_label: str, reference: float | None = None,
          floor: float = -math.inf, ceil: float = math.inf) -> str:
    if not rows:
        return ""
    values = [v for r in rows for v in (r.value, r.threshold, *(r.interval or ())) if v is not None]
    values += [reference] if reference is not None else []
    lo, hi = _nice_range(min(values, default=0.0), max(values, default=1.0), floor=floor, ceil=ceil)
    height = TOP + ROW * len(rows) + BOTTOM
    x = _scale(lo, hi)
    out = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="100%" height="{height}" role="img" '
           f'aria-label="{aria}">']
    out += _axis(x, lo, hi, height, fmt=lambda v: f"{round(v, 4):g}")
    title, _, aside = axis_title.partition(" (")  # two lines: a phone's width holds neither whole on one
    out.append(f'<text x="50%" y="{height - 22}" text-anchor="middle" class="axis-title">{_e(title)}</text>')
    if aside:
        out.append(f'<text x="50%" y="{height - 6}" text-anchor="middle">({_e(aside)}</text>')
    if reference is not None:
        out.append(f'<line x1="{x(reference)}" x2="{x(reference)}" y1="{TOP - 6}" y2="{height - BOTTOM + 4}" '
                   'stroke="#57606a"/>')
    thresholds = sorted({r.threshold for r in rows if r.threshold is not None})
    for index, limit in enumerate(thresholds[:3]):  # more than three distinct ones: the ticks and tooltips say them
        anchor = "end" if (x_percent := _percent(lo, hi, limit)) > 80 else "start" if x_percent < 20 else "middle"
        out.append(f'<text x="{x(limit)}" y="{12 + 12 * (index % 2)}" text-anchor="{anchor}" class="threshold">'
                   f"{_e(threshold_label.format(limit))}</text>")
    y, previous = TOP, None
    for row in rows:
        color, continued = COLOR[row.word], row.cell == previous
        label = row.label if continued else f"{row.cell} · {row.label}" if row.label else row.cell
        if previous is not None and not continued:
            out.append(f'<line x1="0" x2="100%" y1="{y - 4}" y2="{y - 4}" stroke="#eaeef2"/>')
        previous, indent = row.cell, 16 if continued else 0
        bar = y + LABEL_GAP
        what = f"{row.cell} · {row.label}" if row.label else row.cell
        if row.value is None:  # the reason cut to what a phone's width holds; whole in its tooltip and the table
            said = f"{LABEL[row.word]}: {row.reason or 'no figure'}"
            out.append(f'<text x="{indent}" y="{y + 8}" class="row">{_e(label)} <tspan fill="{color}">'
                       f"{_e(shorten(said, max(16, ROW_TEXT - len(label))))}<title>{_e(said)}</title></tspan></text>")
            out.append(f'<svg x="{PLOT_LEFT}%" y="{bar}" overflow="visible"><path d="M-5-5L5 5M-5 5L5-5" '
                       f'stroke="{color}" stroke-width="2.5"><title>{_e(what)}: {_e(LABEL[row.word])}, no figure'
                       "</title></path></svg>")
        else:
            out.append(f'<text x="{indent}" y="{y + 8}" class="row">{_e(label)}</text>')
            if row.interval:
                out.append(f'<line x1="{x(row.interval[0])}" x2="{x(row.interval[1])}" y1="{bar}" y2="{bar}" '
                           f'stroke="{color}" stroke-width="2"/>')
            if row.threshold is not None:
                out.append(f'<line x1="{x(row.threshold)}" x2="{x(row.threshold)}" y1="{bar - 8}" y2="{bar + 8}" '
                           'stroke="#1f2328" stroke-dasharray="3,2"/>')
            bounds = f" [{row.interval[0]:.4g}, {row.interval[1]:.4g}]" if row.interval else ""
            limit = f"; {threshold_label.format(row.threshold)}" if row.threshold is not None else ""
            out.append(f'<circle cx="{x(row.value)}" cy="{bar}" r="5" fill="{color}"><title>{_e(what)}: '
                       f"{row.value:.4g}{bounds}{_e(limit)} ({_e(LABEL[row.word])})</title></circle>")
        y += ROW
    out.append("</svg>")
    return "\n".join(out)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _group_key(cell: str) -> tuple[str, str]:
    """(backend-arch[ model], dtype) from a check's cell name like flashinfer_mla-fp8_e4m3-sm100 [Model]."""
    name, _, model = cell.partition(" [")
    backend, _, rest = name.partition("-")
    dtype, _, arch = rest.rpartition("-")
    return f"{backend}-{arch}" + (f" [{model}" if model else ""), dtype


def _percent(lo: float, hi: float, value: float) -> float:
    return PLOT_LEFT + (PLOT_RIGHT - PLOT_LEFT) * (min(max(value, lo), hi) - lo) / ((hi - lo) or 1.0)


def _scale(lo: float, hi: float) -> Callable[[float], str]:
    """value -> an SVG x position, in per cent of the plot's width."""
    return lambda value: f"{_percent(lo, hi, value):.2f}%"


def _axis(x: Callable[[float], str], lo: float, hi: float, height: int, fmt: Callable[[float], str]) -> list[str]:
    out = []
    for value in _ticks(lo, hi):
        out.append(f'<line x1="{x(value)}" x2="{x(value)}" y1="{TOP - 6}" y2="{height - BOTTOM + 4}" '
                   'stroke="#eaeef2"/>')
        out.append(f'<text x="{x(value)}" y="{height - BOTTOM + 18}" text-anchor="middle">{fmt(value)}</text>')
    return out


def _ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 x 10^k apart) covering [lo, hi]."""
    raw = (hi - lo) / target or 1.0
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _nice_range(low: float, high: float, floor: float = -math.inf, ceil: float = math.inf) -> tuple[float, float]:
    if not (math.isfinite(low) and math.isfinite(high)):
        return 0.0, 1.0
    pad = max((high - low) * 0.08, 0.01)
    return max(floor, low - pad), min(ceil, high + pad)


# ---------------------------------------------------------------------------------------------- the grid

def grid_html(verdict: Verdict) -> str:
    """The report's first screen (kvgate.report.grid): per arch, backends x kv_cache_dtypes, each entry its word,
    accuracy per lm-eval filter, change in points against the base side and the auto cell, and throughput. On a phone
    the table gives way to one card per cell, those that need attention first (then the waived), so the failing cell is
    on the screen without a sideways swipe."""
    grids = grid.build(verdict)
    if not grids:
        return ""
    out = []
    for arch_grid in grids:
        rows = [f"<tr><th>{_e(arch_grid.arch)}</th>" + "".join(f"<th>{_e(c)}</th>" for c in arch_grid.columns)
                + "</tr>"]
        for row in arch_grid.rows:
            cells = []
            for column in arch_grid.columns:
                entry = row.entries.get(column)
                if entry is None:
                    cells.append("<td></td>")
                    continue
                title = f' title="{_e(entry.reason)}"' if entry.reason else ""
                cells.append(f'<td class="grid-entry" data-cell="{_e(entry.cell)}" data-word="{entry.word}"{title}>'
                             + "<br>".join(_entry_lines(entry)) + "</td>")
            label = f"<code>{_e(row.backend)}</code>" + (f" · <code>{_e(row.feature)}</code>" if row.feature else "") \
                + (f" {_e(row.model)}" if row.model else "")
            rows.append(f"<tr><th>{label}</th>{''.join(cells)}</tr>")
        out.append('<div class="scroll"><table class="grid">' + "".join(rows) + "</table></div>")
    entries = [e for g in grids for r in g.rows for e in r.entries.values()]
    order = {word: index for index, word in enumerate(ORDER)}
    first = sorted(entries, key=lambda e: (e.word not in ATTENTION, e.word != WAIVED, order.get(e.word, 99), e.cell))
    cards = [f'<li class="grid-entry" data-cell="{_e(e.cell)}" data-word="{e.word}" '
             f'style="border-left-color:{COLOR[e.word]}">' + "<br>".join(
                 [f"{_entry_lines(e)[0]} <code>{_e(e.cell)}</code>", *_entry_lines(e)[1:],
                  *([f'<span class="note">{_e(shorten(e.reason, NEEDS_ATTENTION_WORDS))}</span>'] if e.reason else [])])
             + "</li>" for e in first]
    attention = sum(e.word in ATTENTION for e in entries)
    return ('<section id="grid"><p class="note">Each entry: its word; accuracy per lm-eval filter; Δbase, Δauto: '
            "points against the base side, the auto cell, with the tested bounds; median req/s, output tok/s, and "
            f"the throughput ratio to each. {len(entries)} cells, {attention} needing attention.</p>"
            f'<div class="grid-wide">{"".join(out)}</div><ul class="cards" aria-label="cells, those that need '
            f'attention first">{"".join(cards)}</ul></section>')


def _entry_lines(entry: grid.Entry) -> list[str]:
    """A grid entry's lines, HTML: its word's badge, accuracy, changes, throughput."""
    lines = [_e(line) for line in ([" / ".join(f"{v:.3f}" for v in entry.accuracy.values())
                                    + (" (nothing right)" if entry.zero_filters else "")] if entry.accuracy else [])]
    lines += [_e(f"Δ{c.reference} {round(c.value, 1) + 0.0:+.1f}" + (
        f" [{round(c.bounds[0], 1) + 0.0:+.1f}, {round(c.bounds[1], 1) + 0.0:+.1f}]" if c.bounds else ""))
        for c in entry.accuracy_changes]
    speed = ([f"{entry.requests_per_second:.2f} req/s"] if entry.requests_per_second is not None else []) \
        + ([f"{entry.output_tokens_per_second:,.0f} tok/s"] if entry.output_tokens_per_second is not None else []) \
        + [f"x{c.value:.2f} {c.reference}" for c in entry.throughput_changes]
    if speed:
        lines.append(_e(", ".join(speed)))
    return [_badge(entry.word, LABEL[entry.word]), *lines]
