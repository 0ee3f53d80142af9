"""Verdict -> report.html: one self-contained page (inline CSS and SVG, no script, no network).

Plots:
- accuracy per cell with its interval (the reported mean ± 1.96 stderr), auto and FP8 side by side per
  backend/arch/model, one panel per lm-eval filter;
- throughput ratios (FP8/auto, and current/baseline) with their confidence intervals, around 1.0.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable

from kvgate.gate.verdict import STATUS_LABEL, Check, Verdict, sort_key
from kvgate.report.markdown import headline, multiplicity_text, run_facts

COLORS = {"auto": "#4575b4", "fp8": "#d73027", "fp8_e4m3": "#f46d43", "fp8_e5m2": "#fdae61"}
STATUS_COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "error": "#8250df", "missing": "#bf8700",
                 "waived": "#9a6700", "not_run": "#6e7781", "info": "#0969da"}
ROW = 18
LEFT = 340
WIDTH = 920

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1f2328;max-width:1200px}
h1{font-size:20px;margin:0 0 6px} h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
.ctx{color:#57606a;margin-bottom:10px} table{border-collapse:collapse;width:100%;font-size:12.5px}
th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left;vertical-align:top} th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:0 8px;font-size:11.5px;font-weight:600;white-space:nowrap}
svg text{font:11px system-ui,sans-serif;fill:#1f2328} .note{color:#57606a;font-size:12.5px}
code{font-size:12px;background:#f6f8fa;padding:0 3px;border-radius:3px}
"""


def render_html(verdict: Verdict) -> str:
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{_e(headline(verdict))}</title>", f"<style>{CSS}</style></head><body>",
             f"<h1>{_badge(*_verdict_badge(verdict))} "
             f"{_e(_plain(headline(verdict)))}</h1>", f'<div class="ctx">{_e(_context(verdict))}</div>',
             "<div>" + " ".join(_badge(s, f"{STATUS_LABEL[s]} {n}") for s, n in verdict.counts().items() if n)
             + "</div>"]
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
    parts += ["<h2>Checks</h2>", _table(sorted(verdict.checks, key=sort_key))]
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


def _context(verdict: Verdict) -> str:
    parts = [f"run {verdict.run}", *run_facts(verdict.run_info)]
    if verdict.baseline:
        parts.append(f"baseline {verdict.baseline}")
    parts.append(f"judged {verdict.today}")
    return " · ".join(parts)


def _plain(text: str) -> str:
    """The headline without its leading emoji (the page shows a coloured badge instead; no emoji font needed)."""
    return text.split(" ", 1)[1] if text[:1] in ("✅", "❌", "⚠") else text


def _verdict_badge(verdict: Verdict) -> tuple[str, str]:
    if not verdict.passed:
        return "fail", "FAILED"
    return ("not_run", "NEUTRAL") if verdict.neutral else ("pass", "PASSED")


def _badge(status: str, text: str) -> str:
    return f'<span class="badge" style="background:{STATUS_COLORS[status]}">{_e(text)}</span>'


def _table(checks: Iterable[Check]) -> str:
    rows = ["<table><tr><th>status</th><th>cell</th><th>check</th><th>measured</th><th>interval</th>"
            "<th>threshold</th><th>p (adj.)</th></tr>"]
    for c in checks:
        interval = f"[{c.interval[0]:.3g}, {c.interval[1]:.3g}]" if c.interval else ""
        adjusted = c.adjusted_p_value
        p = "" if c.p_value is None or c.status == "info" else _p(c.p_value) + (
            f" ({_p(adjusted)})" if adjusted is not None and adjusted != c.p_value else "")
        kind = c.kind + (f" <code>{_e(c.subject)}</code>" if c.subject and c.kind.endswith("accuracy") else "")
        rows.append(f"<tr><td>{_badge(c.status, STATUS_LABEL[c.status])}</td>"
                    f"<td><code>{_e(c.cell)}</code></td><td>{kind}</td><td>{_e(c.detail)}</td>"
                    f'<td class="num">{_e(interval)}</td><td>{_e(c.threshold_text)}</td><td class="num">{p}</td></tr>')
    rows.append("</table>")
    return "\n".join(rows)


def _p(p: float) -> str:
    return "&lt;0.001" if p < 0.001 else f"{p:.3f}"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


# ---------------------------------------------------------------------------------------------- plots

def _accuracy_plot(verdict: Verdict) -> str:
    """One row per cell and filter: the mean and its ±1.96 stderr bar, grouped by backend/arch/model."""
    checks = [c for c in verdict.checks if c.kind == "accuracy" and c.status in ("pass", "waived")]
    if not checks:
        return ""
    filters = sorted({k for c in checks for k in c.figures if not k.endswith("_stderr") and k != "n"})
    rows: list[tuple[str, str, str, float, float | None]] = []  # (group, label, dtype, mean, stderr)
    for check in sorted(checks, key=lambda c: _group_key(c.cell)):
        group, dtype = _group_key(check.cell)
        for name in filters:
            mean = check.figures.get(name)
            if isinstance(mean, (int, float)):
                stderr = check.figures.get(f"{name}_stderr")
                rows.append((group, f"{check.cell} · {name}", dtype, float(mean),
                             float(stderr) if isinstance(stderr, (int, float)) else None))
    if not rows:
        return ""
    lows = [m - 1.96 * (s or 0) for _, _, _, m, s in rows]
    highs = [m + 1.96 * (s or 0) for _, _, _, m, s in rows]
    lo, hi = _nice_range(min(lows), max(highs), floor=0.0, ceil=1.0)
    height = ROW * len(rows) + 40 + 10 * len({r[0] for r in rows})
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" '
           f'aria-label="accuracy per cell">']
    x = _scale(lo, hi)
    out += _axis(x, lo, hi, height, fmt=lambda v: f"{round(v, 4):g}")
    y, previous = 20, None
    for group, label, dtype, mean, stderr in rows:
        if previous is not None and group != previous:
            y += 10
            out.append(f'<line x1="4" x2="{WIDTH - 10}" y1="{y - 4}" y2="{y - 4}" stroke="#eaeef2"/>')
        previous = group
        color = COLORS.get(dtype, "#6e7781")
        out.append(f'<text x="{LEFT - 8}" y="{y + 4}" text-anchor="end">{_e(label)}</text>')
        if stderr:
            out.append(f'<line x1="{x(mean - 1.96 * stderr):.1f}" x2="{x(mean + 1.96 * stderr):.1f}" y1="{y}" '
                       f'y2="{y}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<circle cx="{x(mean):.1f}" cy="{y}" r="4" fill="{color}"><title>{_e(label)}: {mean:.4f}'
                   f'{f" ± {1.96 * stderr:.4f}" if stderr else ""}</title></circle>')
        y += ROW
    out.append("</svg>")
    return "\n".join(out)


def _ratio_plot(verdict: Verdict) -> str:
    checks = [c for c in verdict.checks if c.kind in ("fp8_throughput", "throughput")
              and isinstance(c.figures.get("ratio"), (int, float))]
    checks.sort(key=lambda c: (c.kind, _group_key(c.cell)))

    def marker(check: Check, x: float, y: int, color: str, label: str) -> str:
        ratio = check.figures["ratio"]
        return (f'<rect x="{x - 4:.1f}" y="{y - 4}" width="8" height="8" fill="{color}">'
                f"<title>{_e(label)}: {ratio:.3f} ({STATUS_LABEL[check.status]})</title></rect>")

    return _interval_plot(
        checks, value="ratio", threshold="min_ratio", reference=1.0, aria="throughput ratios", marker=marker,
        label=lambda c: f"{c.cell} · {'fp8/auto' if c.kind == 'fp8_throughput' else 'vs baseline'}")


def _drop_plot(verdict: Verdict) -> str:
    checks = [c for c in verdict.checks if c.kind in ("fp8_accuracy", "baseline_accuracy")
              and isinstance(c.figures.get("drop_points"), (int, float))]
    checks.sort(key=lambda c: (c.kind, _group_key(c.cell), c.subject or ""))

    def marker(check: Check, x: float, y: int, color: str, label: str) -> str:
        drop = check.figures["drop_points"]
        return (f'<circle cx="{x:.1f}" cy="{y}" r="4" fill="{color}"><title>{_e(label)}: drop {drop:.2f} '
                f"points ({STATUS_LABEL[check.status]})</title></circle>")

    return _interval_plot(
        checks, value="drop_points", threshold="margin_points", reference=0.0, aria="accuracy drops", marker=marker,
        label=lambda c: f"{c.cell} · {c.subject} · {'vs auto' if c.kind == 'fp8_accuracy' else 'vs baseline'}")


def _interval_plot(checks: list[Check], *, value: str, threshold: str, reference: float, aria: str,
                   label: Callable[[Check], str], marker: Callable[[Check, float, int, str, str], str]) -> str:
    """One row per check: its figure with its interval, a dashed tick at its threshold, a line at `reference`."""
    if not checks:
        return ""
    values = [c.figures[value] for c in checks] + [v for c in checks if c.interval for v in c.interval]
    values += [c.threshold[threshold] for c in checks if isinstance(c.threshold.get(threshold), (int, float))]
    lo, hi = _nice_range(min([*values, reference]), max([*values, reference]))
    height = ROW * len(checks) + 40
    x = _scale(lo, hi)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" '
           f'aria-label="{aria}">']
    out += _axis(x, lo, hi, height, fmt=lambda v: f"{round(v, 4):g}")
    out.append(f'<line x1="{x(reference):.1f}" x2="{x(reference):.1f}" y1="8" y2="{height - 22}" stroke="#57606a"/>')
    y = 20
    for check in checks:
        text = label(check)
        color = STATUS_COLORS[check.status]
        out.append(f'<text x="{LEFT - 8}" y="{y + 4}" text-anchor="end">{_e(text)}</text>')
        if check.interval:
            out.append(f'<line x1="{x(check.interval[0]):.1f}" x2="{x(check.interval[1]):.1f}" y1="{y}" y2="{y}" '
                       f'stroke="{color}" stroke-width="2"/>')
        limit = check.threshold.get(threshold)
        if isinstance(limit, (int, float)):
            out.append(f'<line x1="{x(limit):.1f}" x2="{x(limit):.1f}" y1="{y - 7}" y2="{y + 7}" '
                       f'stroke="#cf222e" stroke-dasharray="3,2"/>')
        out.append(marker(check, x(check.figures[value]), y, color, text))
        y += ROW
    out.append("</svg>")
    return "\n".join(out)


def _group_key(cell: str) -> tuple[str, str]:
    """(backend-arch[ model], dtype) from a check's cell name like flashinfer_mla-fp8_e4m3-sm100 [Model]."""
    name, _, model = cell.partition(" [")
    backend, _, rest = name.partition("-")
    dtype, _, arch = rest.rpartition("-")
    return f"{backend}-{arch}" + (f" [{model}" if model else ""), dtype


def _scale(lo: float, hi: float):
    span = (hi - lo) or 1.0
    return lambda v: LEFT + (WIDTH - LEFT - 20) * (min(max(v, lo), hi) - lo) / span


def _axis(x, lo: float, hi: float, height: int, fmt) -> list[str]:
    out = []
    for value in _ticks(lo, hi):
        out.append(f'<line x1="{x(value):.1f}" x2="{x(value):.1f}" y1="8" y2="{height - 22}" stroke="#eaeef2"/>')
        out.append(f'<text x="{x(value):.1f}" y="{height - 8}" text-anchor="middle">{fmt(value)}</text>')
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
