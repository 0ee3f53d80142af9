"""Verdict -> report.md, for a PR comment or $GITHUB_STEP_SUMMARY.

The first line is what a reviewer reads in two seconds; then the grid (kvgate.report.grid: per arch, backends x
kv_cache_dtypes, each cell's word, accuracy, change and throughput); then only what failed or needs attention,
one line each, and the waived checks apart; every other check folded away (`<details>`), then the method. The
blocks a PR comment may fold out to fit its size (ci/pr_comment.py) are the `<details>` ones; tables are never cut.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from kvgate.gate import rerun
from kvgate.gate.verdict import STATUSES, Check, Verdict, sort_key
from kvgate.report import grid, words
from kvgate.report.inert_text import escape_text, start_of_line

MULTIPLICITY = {
    "holm": "Holm (family-wise error rate ≤ alpha over the whole run)",
    "bh": "Benjamini-Hochberg (false-discovery rate ≤ alpha over the whole run)",
    "none": "no adjustment: each is a test against its margin (matrix/policy.toml states the run-level false "
            "alarms this buys)",
}
MAX_ROWS_PER_SECTION = 400
ATTENTION_LINES = 25  # one line each up to this many; the rest in the folded table
HEADLINE_WHAT = 110  # characters of the first failure's own words in the first line
FILTER_SHORT = {"strict-match": "strict", "flexible-extract": "flex"}
COMPARISON_KINDS = ("fp8_accuracy", "baseline_accuracy", "fp8_long_context", "baseline_long_context", "fp8_throughput",
                    "throughput", "probe", "probe_ab", "fp8_kv_cache")
# which failure the first line names: regressions first, then broken kernels, then absent or crashed stages
HEADLINE_PRIORITY = ("fp8_kv_cache", "fp8_accuracy", "baseline_accuracy", "fp8_long_context", "baseline_long_context",
                     "probe_ab", "probe", "kernels", "throughput",
                     "fp8_throughput", "accuracy", "cell", "contract", "host")  # GitHub step summaries hold 1 MiB


STATUS_LIMIT = 140  # characters of a commit status's description (GitHub's limit): the headline fits it


def headline(verdict: Verdict) -> str:
    """One line of at most STATUS_LIMIT characters: what failed first (its cell and check, in a few words), or that
    everything judged passed; counts from the verdict's totals (kvgate.gate.verdict.Totals): checks, and apart from
    them the stages that ran with nothing to judge them (RAN), never counted as passes."""
    totals = verdict.totals()
    ran = totals.stages_ran
    failed = first_failures(verdict)
    if failed:
        first = failed[0]
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        subject = f" [{first.subject}]" if first.subject and first.kind.endswith("accuracy") else ""
        head = f"❌ kvgate: {totals.failed} of {totals.checks} checks failed — {first.cell} {first.kind}{subject}"
        room = STATUS_LIMIT - len(head) - len(more) - 1
        what = f" {shorten(first.headline or first.detail, room)}" if room >= 12 else ""
        return fit(f"{head}{what}{more}")
    waived = f" ({totals.words[words.WAIVED]} waived)" if totals.words[words.WAIVED] else ""
    zero = [e for g in grid.build(verdict) for r in g.rows for e in r.entries.values()
            if e.zero_filters and e.word not in words.ATTENTION]
    held = f"and no check held {'it' if len(zero) == 1 else 'them'}"
    ran_text = f"; {ran} stage{'s' if ran != 1 else ''} ran with nothing to judge {'it' if ran == 1 else 'them'}" \
        if ran else ""
    scored = [f"{e.cell} scored 0 on {' and '.join(e.zero_filters)}" for e in zero]
    cells = f"{len(zero)} cell{'s' if len(zero) != 1 else ''}"
    # the whole tail, then shorter ones: what a reader must not miss (a cell that answered nothing right) stays longest
    named = f"; {', '.join(e.cell for e in zero)} scored 0"
    tails = [f"; {', '.join(scored)}, {held}{ran_text}", f"{named}, {held}{ran_text}", f"{named}, {held}", named,
             f"; {cells} scored 0, {held}", f"; {cells} scored 0", ""] if zero else [ran_text, ""]
    if not totals.checks:
        not_run = sum(c.status == "not_run" and c.kind != "baseline" for c in verdict.checks)
        ran_text = f"{ran} stage{'s' if ran != 1 else ''} ran with nothing to judge, " if ran else ""
        return fit(f"⚠️ kvgate: nothing was checked ({ran_text}{not_run} stages not run); pass --require to make "
                   "missing stages fail")
    checks = f"{totals.checks} check{'s' if totals.checks != 1 else ''}"
    if verdict.neutral:  # why it is neutral matters more than the stages that ran unjudged (the totals say those)
        start, reasons = f"⚪ kvgate: NEUTRAL — {checks} passed{waived}", neutral_reasons(verdict)
        line = _first_fitting([f"{start}{tail}, but {reasons}" for tail in tails])
        if line is not None:
            return line
        head = f"{start}, but "  # why it is neutral comes first: the reasons, cut
        return fit(head + shorten(reasons, STATUS_LIMIT - len(head)))
    start = f"✅ kvgate: the 1 check passed{waived}" if totals.checks == 1 else f"✅ kvgate: all {checks} passed{waived}"
    return _first_fitting([start + tail for tail in tails]) or fit(start + tails[-1])


def _first_fitting(lines: list[str]) -> str | None:
    return next((line for line in lines if len(line) <= STATUS_LIMIT), None)


def first_failures(verdict: Verdict) -> list[Check]:
    """The failing checks, the one the headline names first: a stage's own failure before a comparison that could
    not run because of it ("cannot compare: ..."), regressions before broken kernels before absent stages."""
    return sorted(verdict.failed, key=lambda c: (STATUSES.index(c.status), c.detail.startswith("cannot compare"),
                                                 HEADLINE_PRIORITY.index(c.kind)
                                                 if c.kind in HEADLINE_PRIORITY else len(HEADLINE_PRIORITY),
                                                 sort_key(c)))


def fit(text: str, limit: int = STATUS_LIMIT) -> str:
    """At most `limit` characters; cut with "…" (a cell id or reason too long for the line)."""
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def status_description(verdict: Verdict) -> str:
    """The commit status's description: the headline without its emoji, at most STATUS_LIMIT characters."""
    return plain_headline(headline(verdict))


def plain_headline(text: str) -> str:
    """A headline without its leading emoji."""
    return text.split(" ", 1)[1] if text[:1] in ("✅", "❌", "⚠", "⚪") else text


def shorten(text: str, limit: int) -> str:
    """One line of at most `limit` characters, cut after a clause (": ", "; ", ", ", before " (") where one ends early
    enough, else after a word; "…" says it was cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    end = max(1, limit - 2)  # a cut at `end` leaves room for " …": the result is never longer than limit
    cut = max(text.rfind(mark, 0, end + len(mark)) for mark in (": ", "; ", ", ", " | ", " ("))
    if cut < limit // 3:
        cut = text.rfind(" ", 0, end + 1)
    return (text[:cut] if cut > 0 else text[:end]).rstrip(" :;,|") + " …"


def neutral_reasons(verdict: Verdict, *, whole: bool = False) -> str:
    """Why a passing verdict is NEUTRAL, in words: the cells the host could not run (what it lacks; `whole`: the
    host's whole reason), and no baseline."""
    parts = []
    hosts = [c for c in verdict.untested if c.kind == "host"]
    if hosts:
        reasons = [c.headline.removeprefix("not run on this host: ") for c in hosts]
        reasons = list(dict.fromkeys(r if whole else r.split("; ", 1)[0] for r in reasons))
        parts.append(f"{', '.join(c.cell for c in hosts)} {'was' if len(hosts) == 1 else 'were'} not run: this host "
                     f"could not ({'; '.join(reasons)})")
    if any(c.kind == "baseline" for c in verdict.untested):
        parts.append("the change was compared with nothing (no base side, no --baseline)")
    return "; and ".join(parts)


def render_markdown(verdict: Verdict) -> str:
    lines = [start_of_line(_escape(headline(verdict))), ""]
    lines.append(_context(verdict))
    lines.append("")
    lines.append(totals_line(verdict))
    lines.append("")
    if verdict.neutral:
        lines += [f"**NEUTRAL**: nothing failed, but {neutral_reasons(verdict, whole=True)}.", ""]
    lines += grid_markdown(verdict)
    weaker = [c for c in verdict.checks if any("weaker" in note for note in c.notes)]
    if weaker:
        lines += [f"⚠️ {len(weaker)} check{'s' if len(weaker) > 1 else ''} used a weaker test than the paired one "
                  "(see the notes under Method).", ""]
    attention = sorted((c for c in verdict.checks if c.status in words.ATTENTION), key=sort_key)
    silent = [e for g in grid.build(verdict) for r in g.rows for e in r.entries.values()
              if e.zero_filters and e.word not in words.ATTENTION]
    if attention or silent:
        lines += [f"### Needs attention ({len(attention) + len(silent)})", ""]
        for check in attention[:ATTENTION_LINES]:
            lines.append(_attention_line(check))
            lines += [f"  {line}" for line in follow_up(check, verdict.run_info)]
        lines += [f"- {words.icon_label(e.word)} {_code(e.cell)} accuracy: {_escape(' and '.join(e.zero_filters))} 0.0000, no "
                  "question answered right, and no check failed it (no accuracy floor holds this workload)"
                  for e in silent]
        if len(attention) > ATTENTION_LINES:
            lines.append(f"- … and {len(attention) - ATTENTION_LINES} more (the table below)")
        lines.append("")
        if attention:
            lines += [f"<details><summary>Needs attention: the figures ({len(attention)})</summary>", "",
                      *_table(attention, verdict), "", "</details>", ""]
    waived = sorted((c for c in verdict.checks if c.status == "waived"), key=sort_key)
    if waived:
        lines += [f"<details><summary>Waived ({len(waived)}): judged, and covered by a waiver</summary>", "",
                  *[_attention_line(c) for c in waived], "", "</details>", ""]
    shown = {id(c) for c in (*attention, *waived)}
    comparisons = sorted((c for c in verdict.checks if id(c) not in shown and c.kind in COMPARISON_KINDS
                          and c.reference and c.status in ("pass", "info")), key=sort_key)
    if comparisons:
        lines += [f"<details><summary>Comparisons that passed or are only reported ({len(comparisons)})"
                  "</summary>", "", *_table(comparisons, verdict), "", "</details>", ""]
    shown |= {id(c) for c in comparisons}
    others = sorted((c for c in verdict.checks if id(c) not in shown), key=sort_key)
    if others:
        lines += [f"<details><summary>Stage checks ({len(others)})</summary>", "", *_table(others, verdict), "",
                  "</details>", ""]
    lines += ["### Method", ""]
    lines.append(f"- Multiplicity: {multiplicity_text(verdict)}.")
    lines.append("- Accuracy: FP8 vs the auto cell of the same backend, arch and model (and each cell vs its "
                 "baseline), paired on the same questions and decided on one lm-eval filter: a check fails only when "
                 "the data reject \"drop ≤ margin\" at alpha (its one-sided lower bound of the drop is above the "
                 "margin); the interval shown is [lower, upper], each bound one-sided at the decision's level. "
                 "Throughput: fails only when the upper bound of the ratio is below 1 - tolerance.")
    if any(c.kind == "fp8_kv_cache" for c in verdict.checks):
        lines.append("- KV cache: each FP8 cell's accuracy engine must have held an FP8 cache (status.json "
                     "`accuracy.kv_cache`): 1-byte cache elements, attention layers built for an FP8 dtype, and about "
                     "half the auto cell's bytes a token in the engine's KV cache spec; 2-byte elements or the auto "
                     "cell's bytes a token mean the FP8 setting was ignored. A passkey task answered in an engine of "
                     "its own model is judged the same way (`long_context.engine.kv_cache`). The cache's size in "
                     "tokens is reported, not judged: it is what the memory free at engine start allowed.")
    if verdict.baseline:
        lines.append(f"- Baseline: {_code(verdict.baseline)} (accuracy with the baseline margin; throughput as the "
                     "ratio of medians over repeats).")
    for note, names in sorted(_notes(verdict).items(), key=lambda item: -len(item[1])):
        shown = ", ".join(_code(n) for n in names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        lines.append(f"- Note: {_escape(note)} ({shown}).")
    return "\n".join(lines) + "\n"


def multiplicity_text(verdict: Verdict) -> str:
    parts = []
    for family, spec in verdict.multiplicity.items():
        size = spec.get("family_size", 0)
        if not size:
            continue  # a family with no check this run: nothing was tested, so there is nothing to say of it
        method = spec.get("method", "none")
        if method == "none":
            checks = "check at" if size == 1 else "checks each at"
            parts.append(f"the run's {size} {family} {checks} alpha {spec.get('alpha')}, {MULTIPLICITY['none']}")
            continue
        parts.append(f"the run's {size} {family} p-value{'s' if size != 1 else ''} adjusted together with "
                     f"{MULTIPLICITY.get(method, method)}, alpha {spec.get('alpha')}")
    return "; ".join(parts) or "no p-values"


def _context(verdict: Verdict) -> str:
    parts = [f"Run {_code(verdict.run)}", *(_escape(fact) for fact in run_facts(verdict.run_info))]
    if verdict.baseline:
        parts.append(f"baseline {_code(verdict.baseline)}")
    parts.append(f"judged {verdict.today}")
    if verdict.required_stages:
        parts.append(f"required stages: {', '.join(verdict.required_stages)}")
    return " · ".join(parts)


def run_facts(info: Mapping[str, Any]) -> list[str]:
    """What run.json says about where the run ran (the runners' keys; hand-made ones may have fewer)."""
    facts = []
    if isinstance(info.get("commit"), str):
        facts.append(f"{commit_owner(info)} commit {info['commit'][:12]}")
    versions = info.get("versions") if isinstance(info.get("versions"), Mapping) else {}
    for name, shown in (("vllm", "vLLM"), ("lm_eval", "lm-eval"), ("torch", "torch")):
        value = versions.get(name, info.get(f"{name}_version"))
        if isinstance(value, str):
            facts.append(f"{shown} {value}")
    gpu = info.get("gpu") or info.get("gpu_name")
    if isinstance(gpu, str):
        facts.append(gpu)
    elif isinstance(info.get("cpu"), str):
        facts.append(f"CPU {info['cpu']}")
    if isinstance(info.get("host"), str):
        facts.append(f"host {info['host']}")
    under_test = info.get("vllm_under_test") if isinstance(info.get("vllm_under_test"), Mapping) else {}
    for side in ("head", "base"):
        described = vllm_text(under_test.get(side))
        if described:
            facts.append(f"{side} vLLM: {described}" if "base" in under_test else f"vLLM under test: {described}")
    return facts


def commit_owner(info: Mapping[str, Any]) -> str:
    """Whose commit run.json's `commit` is: kvgate's checkout for kvgate's runners; in CI, the repository the workflow
    or pipeline ran for (`repository`: a vLLM repository when kvgate gates vLLM's pull requests)."""
    repository = info.get("repository")
    if isinstance(repository, str) and repository.strip():
        name = repository.strip().removesuffix(".git").rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        return "kvgate" if name.lower() == "kvgate" else f"{name[:40]} (the repository CI ran for)"
    return "kvgate"


def vllm_text(record: Any) -> str:
    """One side's vLLM in a few words: the spec, the source commit, how many files differ and their hash."""
    if not isinstance(record, Mapping) or not isinstance(record.get("spec"), str):
        return ""
    spec = record["spec"]
    if record.get("kind") == "release":
        return f"{spec} (vllm {record.get('version', '?')})"
    parts = [spec]
    if isinstance(record.get("source_commit"), str):
        parts.append(f"at vLLM commit {record['source_commit'][:12]}")
    changed = record.get("changed_files") if isinstance(record.get("changed_files"), list) else []
    deleted = record.get("deleted_files") if isinstance(record.get("deleted_files"), list) else []
    parts.append(f"({len(changed) + len(deleted)} files differ from vllm {record.get('release', '?')}")
    if isinstance(record.get("changes_sha256"), str):
        parts[-1] += f", sha256 {record['changes_sha256'][:12]}"
    parts[-1] += ")"
    return " ".join(parts)


def word_counts(verdict: Verdict) -> dict[str, int]:
    """How many checks read each word (kvgate.report.words), worst first: the verdict's totals."""
    return dict(verdict.totals().words)


def totals_line(verdict: Verdict) -> str:
    """The badges: each word with its count, then what they add up to (checks; stages that ran unjudged)."""
    totals = verdict.totals()
    badges = " · ".join(f"{words.icon_label(w)} {n}" for w, n in totals.words.items() if n)
    return f"{badges} — {totals_text(verdict)}" if badges else totals_text(verdict)


def totals_text(verdict: Verdict) -> str:
    """e.g. "2 of 6 checks failed; 3 stages ran with nothing to judge them; 7 not judged" (kvgate.gate.verdict)."""
    totals = verdict.totals()
    parts = [f"{totals.failed} of {totals.checks} check{'s' if totals.checks != 1 else ''} failed"]
    if totals.stages_ran:
        parts.append(f"{totals.stages_ran} stage{'s' if totals.stages_ran != 1 else ''} ran with nothing to judge "
                     f"{'it' if totals.stages_ran == 1 else 'them'}")
    if totals.not_judged:
        parts.append(f"{totals.not_judged} not judged (skipped, not run or info)")
    return "; ".join(parts)


def follow_up(check: Check, run_info: Mapping[str, Any]) -> list[str]:
    """Under a failure: its log's first real error with where it is (linked), and the command that reruns its cell."""
    lines = []
    if check.log is not None:
        frame = f" (in {_escape(check.log.frame)})" if check.log.frame else ""
        where = f"[{_link_text(check.log.where)}]({_destination(check.log.url)})" if check.log.url \
            else _code(check.log.where)
        lines.append(f"- first error: `{_code(check.log.error)}`{frame} — {where}")
    command = rerun.rerun_command(check, run_info)
    if command:
        lines.append(f"- rerun this cell: `{_code(command)}`")
    return lines


def _code(text: str) -> str:
    """Text inside one Markdown code span (a backtick in it would end the span)."""
    return text.replace("`", "'").replace("\n", " ")


def adjusted(verdict: Verdict) -> bool:
    """Whether any family's p-values were adjusted for multiplicity (only then is there a "p (adj.)" to show)."""
    return any(spec.get("method", "none") != "none" for spec in verdict.multiplicity.values())


def grid_markdown(verdict: Verdict) -> list[str]:
    """The grid (kvgate.report.grid) as one Markdown table per arch, with a line saying what an entry holds."""
    grids = grid.build(verdict)
    if not grids:
        return []
    entries = [e for g in grids for r in g.rows for e in r.entries.values()]
    filters = list(dict.fromkeys(name for e in entries for name in e.accuracy))
    references = {c.reference for e in entries for c in (*e.accuracy_changes, *e.throughput_changes)}
    against = {"base": "the base side", "auto": "the auto cell"}
    shown = [r for r in against if r in references]
    legend = [f"accuracy {' / '.join(_escape(name) for name in filters)}" if filters else "",
              f"{', '.join(f'Δ{r}' for r in shown)}: points against {', '.join(against[r] for r in shown)}, with the "
              "tested bounds" if shown else "",
              "throughput: median req/s, output tok/s" + "".join(f", x{r}: the ratio to {against[r]}" for r in shown)]
    lines = ["_Each entry: its word; " + "; ".join(part for part in legend if part) + "._", ""]
    for arch_grid in grids:
        lines += [f"| **{_escape(arch_grid.arch)}** | " + " | ".join(_code(c) for c in arch_grid.columns) + " |",
                  "|---" * (len(arch_grid.columns) + 1) + "|"]
        for row in arch_grid.rows:
            label = _code(row.backend) + (f" · {_code(row.feature)}" if row.feature else "") + \
                (f" {_escape(row.model)}" if row.model else "")
            lines.append(f"| {label} | " + " | ".join(
                entry_text(row.entries[c]) if c in row.entries else "" for c in arch_grid.columns) + " |")
        lines.append("")
    return lines


def entry_text(entry: grid.Entry) -> str:
    """One grid entry in one table cell, its lines joined by <br>."""
    parts = [words.icon_label(entry.word)]
    if entry.accuracy:
        parts.append(" / ".join(f"{value:.3f}" for value in entry.accuracy.values())
                     + (" (nothing right)" if entry.zero_filters else ""))
    for change in entry.accuracy_changes:
        bounds = f" [{_points(change.bounds[0])}, {_points(change.bounds[1])}]" if change.bounds else ""
        parts.append(f"Δ{change.reference} {_points(change.value)}{bounds}")
    speed = []
    if entry.requests_per_second is not None:
        rps = entry.requests_per_second
        speed.append(f"{rps:.2f} req/s" if rps < 100 else f"{rps:,.0f} req/s")
    if entry.output_tokens_per_second is not None:
        speed.append(f"{entry.output_tokens_per_second:,.0f} tok/s")
    speed += [f"x{change.value:.2f} {change.reference}" for change in entry.throughput_changes]
    if speed:
        parts.append(", ".join(speed))
    return "<br>".join(_escape(part) for part in parts)


def _points(value: float) -> str:
    """A signed change in points, one decimal, never "-0.0"."""
    return f"{round(value, 1) + 0.0:+.1f}"


def _attention_line(check: Check) -> str:
    subject = f" [{check.subject}]" if check.subject else ""
    return (f"- {words.icon_label(words.word_of(check))} {_code(check.cell)} {check.kind}{subject}: "
            f"{_escape(shorten(check.headline or check.detail, HEADLINE_WHAT + 50))}")


def _table(checks: list[Check], verdict: Verdict) -> list[str]:
    p_header = "p (adj.)" if adjusted(verdict) else "p"
    rows = [f"| status | cell | check | measured | interval | threshold | {p_header} |",
            "|---|---|---|---|---|---|---|"]
    for check in checks[:MAX_ROWS_PER_SECTION]:
        rows.append("| " + " | ".join(_cells(check)) + " |")
    if len(checks) > MAX_ROWS_PER_SECTION:
        rows.append(f"| … | {len(checks) - MAX_ROWS_PER_SECTION} more in verdict.json | | | | | |")
    return rows


def _cells(check: Check) -> list[str]:
    kind = check.kind + (f" `{check.subject}`" if check.subject and check.kind.endswith("accuracy") else "")
    interval = f"[{check.interval[0]:.3g}, {check.interval[1]:.3g}]" if check.interval else ""
    p = ""
    if check.p_value is not None and check.status != "info":
        adjusted_p = check.adjusted_p_value
        p = _p(check.p_value) + (f" ({_p(adjusted_p)})" if adjusted_p is not None and adjusted_p != check.p_value
                                 else "")
    return [words.icon_label(words.word_of(check)), _code(check.cell), kind, _escape(check.detail),
            interval, _escape(check.threshold_text), p]


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _escape(text: str) -> str:
    """Text that may come from a results folder, as one line of inert Markdown (kvgate.report.inert_text): no link,
    image, HTML, emphasis, mention or table cell break can form from it."""
    return escape_text(" ".join(str(text).split()), "")


def _link_text(text: str) -> str:
    """Text of a results folder (a cell folder's name in a log's path) as a link's text: escaped as any text, and every
    bracket too, so none closes the link early or opens one inside it."""
    return re.sub(r"\\.|[\[\]]", lambda m: m[0] if len(m[0]) == 2 else "\\" + m[0], _escape(text))


def _destination(url: str) -> str:
    """A link's address as one Markdown link destination: what would end it or break its line (a space, a parenthesis,
    `<`, `>`, a backtick, a newline: a cell folder's name may hold any of them) percent-encoded; `%` kept, so an address
    already encoded stays as it is."""
    return quote(url, safe="/:?#&=%~+,;@!$'*")


SAFE_CODE = re.compile(r"[A-Za-z0-9_.:/+=, -]{1,300}")


def _code(text: str) -> str:
    """A name in a code span (cell ids, paths) when it is plainly one; else the same, escaped as text."""
    return f"`{text}`" if SAFE_CODE.fullmatch(str(text)) else _escape(text)


def _notes(verdict: Verdict) -> dict[str, list[str]]:
    notes: dict[str, list[str]] = {}
    for check in verdict.checks:
        for note in check.notes:
            notes.setdefault(note, []).append(check.name)
    return notes
