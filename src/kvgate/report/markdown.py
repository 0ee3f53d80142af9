"""Verdict -> report.md, for a PR comment or $GITHUB_STEP_SUMMARY.

The first line is what a reviewer reads in two seconds; then the checks that need attention, the
multiplicity note, the weaker-check notes, and every other check folded away.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgate.gate.verdict import STATUS_LABEL, STATUSES, Check, Verdict, sort_key

ICON = {"pass": "✅", "fail": "❌", "error": "💥", "missing": "❔", "waived": "⚠️", "not_run": "➖", "info": "ℹ️"}  # noqa: RUF001
MULTIPLICITY = {
    "holm": "Holm (family-wise error rate ≤ alpha over the whole run)",
    "bh": "Benjamini-Hochberg (false-discovery rate ≤ alpha over the whole run)",
    "none": "no adjustment: each is a test against its margin (matrix/policy.toml states the run-level false "
            "alarms this buys)",
}
MAX_ROWS_PER_SECTION = 400
COMPARISON_KINDS = ("fp8_accuracy", "baseline_accuracy", "fp8_throughput", "throughput", "probe", "probe_ab",
                    "fp8_kv_cache")
OPEN_COMPARISONS = 40  # shown unfolded up to this many rows
# which failure the first line names: regressions first, then broken kernels, then absent or crashed stages
HEADLINE_PRIORITY = ("fp8_kv_cache", "fp8_accuracy", "baseline_accuracy", "probe_ab", "probe", "kernels", "throughput",
                     "fp8_throughput", "accuracy", "cell", "contract", "host")  # GitHub step summaries hold 1 MiB


def headline(verdict: Verdict) -> str:
    judged = verdict.judged
    # a comparison that could not run because its stage failed ("cannot compare: ...") names the stage's failure
    # second-hand: the stage's own check goes first
    failed = sorted(verdict.failed, key=lambda c: (STATUSES.index(c.status), c.detail.startswith("cannot compare"),
                                                   HEADLINE_PRIORITY.index(c.kind)
                                                   if c.kind in HEADLINE_PRIORITY else len(HEADLINE_PRIORITY),
                                                   sort_key(c)))
    waived = sum(c.status == "waived" for c in judged)
    if failed:
        first = failed[0]
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        what = first.headline or first.detail
        subject = f" [{first.subject}]" if first.subject and first.kind.endswith("accuracy") else ""
        return (f"❌ kvgate: {len(failed)} of {len(judged)} checks failed — {first.cell} {first.kind}{subject} "
                f"{what}{more}")
    tail = f" ({waived} waived)" if waived else ""
    if not judged:
        not_run = sum(c.status == "not_run" and c.kind != "baseline" for c in verdict.checks)
        return (f"⚠️ kvgate: nothing was checked ({not_run} stages not run); pass --require to make missing stages "
                "fail")
    if verdict.neutral:
        return (f"⚪ kvgate: NEUTRAL — {len(judged)} check{'s' if len(judged) != 1 else ''} passed{tail}, but "
                f"{neutral_reasons(verdict)}")
    if len(judged) == 1:
        return f"✅ kvgate: the 1 check passed{tail}"
    return f"✅ kvgate: all {len(judged)} checks passed{tail}"


def neutral_reasons(verdict: Verdict) -> str:
    """Why a passing verdict is NEUTRAL, in words: the cells the host could not run, and no baseline."""
    parts = []
    hosts = [c for c in verdict.untested if c.kind == "host"]
    if hosts:
        reasons = list(dict.fromkeys(c.headline.removeprefix("not run on this host: ") for c in hosts))
        parts.append(f"{', '.join(c.cell for c in hosts)} {'was' if len(hosts) == 1 else 'were'} not run: this host "
                     f"could not ({'; '.join(reasons)})")
    if any(c.kind == "baseline" for c in verdict.untested):
        parts.append("the change was compared with nothing (no base side, no --baseline)")
    return "; and ".join(parts)


def render_markdown(verdict: Verdict) -> str:
    lines = [headline(verdict), ""]
    lines.append(_context(verdict))
    lines.append("")
    counts = verdict.counts()
    lines.append(" · ".join(f"{ICON[s]} {STATUS_LABEL[s]} {n}" for s, n in counts.items() if n))
    lines.append("")
    weaker = [c for c in verdict.checks if any("weaker" in note for note in c.notes)]
    if weaker:
        lines += [f"⚠️ {len(weaker)} check{'s' if len(weaker) > 1 else ''} used a weaker test than the paired one "
                  "(see the notes under Method).", ""]
    attention = [c for c in verdict.checks if c.status in ("fail", "error", "missing", "waived")]
    if attention:
        lines += ["### Needs attention", "", *_table(sorted(attention, key=sort_key)), ""]
    comparisons = sorted((c for c in verdict.checks if c not in attention and c.kind in COMPARISON_KINDS
                          and c.reference and c.status in ("pass", "info")), key=sort_key)
    if comparisons:
        opened = " open" if len(comparisons) <= OPEN_COMPARISONS else ""
        lines += [f"<details{opened}><summary>Comparisons that passed or are only reported ({len(comparisons)})"
                  "</summary>", "", *_table(comparisons), "", "</details>", ""]
    others = sorted((c for c in verdict.checks if c not in attention and c not in comparisons), key=sort_key)
    if others:
        lines += [f"<details><summary>Stage checks ({len(others)})</summary>", "", *_table(others), "",
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
                     "`accuracy.kv_cache`): 1-byte cache elements, attention layers built for an FP8 dtype, and "
                     "about twice the auto cell's tokens in its KV cache; 2-byte elements or the auto cell's size mean "
                     "the FP8 setting was ignored.")
    if verdict.baseline:
        lines.append(f"- Baseline: `{verdict.baseline}` (accuracy with the baseline margin; throughput as the "
                     "ratio of medians over repeats).")
    for note, names in sorted(_notes(verdict).items(), key=lambda item: -len(item[1])):
        shown = ", ".join(f"`{n}`" for n in names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        lines.append(f"- Note: {note} ({shown}).")
    return "\n".join(lines) + "\n"


def multiplicity_text(verdict: Verdict) -> str:
    parts = []
    for family, spec in verdict.multiplicity.items():
        method = spec.get("method", "none")
        if method == "none":
            parts.append(f"the run's {spec.get('family_size', 0)} {family} checks each at alpha {spec.get('alpha')}, "
                         f"{MULTIPLICITY['none']}")
            continue
        parts.append(f"the run's {spec.get('family_size', 0)} {family} p-values adjusted together with "
                     f"{MULTIPLICITY.get(method, method)}, alpha {spec.get('alpha')}")
    return "; ".join(parts) or "no p-values"


def _context(verdict: Verdict) -> str:
    parts = [f"Run `{verdict.run}`", *run_facts(verdict.run_info)]
    if verdict.baseline:
        parts.append(f"baseline `{verdict.baseline}`")
    parts.append(f"judged {verdict.today}")
    if verdict.required_stages:
        parts.append(f"required stages: {', '.join(verdict.required_stages)}")
    return " · ".join(parts)


def run_facts(info: Mapping[str, Any]) -> list[str]:
    """What run.json says about where the run ran (the runners' keys; hand-made ones may have fewer)."""
    facts = []
    if isinstance(info.get("commit"), str):
        facts.append(f"commit {info['commit'][:12]}")
    versions = info.get("versions") if isinstance(info.get("versions"), Mapping) else {}
    for name in ("vllm", "lm_eval", "torch"):
        value = versions.get(name, info.get(f"{name}_version"))
        if isinstance(value, str):
            facts.append(f"{name.replace('_', '-')} {value}")
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
            facts.append(f"{side}: {described}" if "base" in under_test else f"vLLM under test: {described}")
    return facts


def vllm_text(record: Any) -> str:
    """One side's vLLM in a few words: the spec, the source commit, how many files differ and their hash."""
    if not isinstance(record, Mapping) or not isinstance(record.get("spec"), str):
        return ""
    spec = record["spec"]
    if record.get("kind") == "release":
        return f"{spec} (vllm {record.get('version', '?')})"
    parts = [spec]
    if isinstance(record.get("source_commit"), str):
        parts.append(f"@ {record['source_commit'][:12]}")
    changed = record.get("changed_files") if isinstance(record.get("changed_files"), list) else []
    deleted = record.get("deleted_files") if isinstance(record.get("deleted_files"), list) else []
    parts.append(f"({len(changed) + len(deleted)} files differ from vllm {record.get('release', '?')}")
    if isinstance(record.get("changes_sha256"), str):
        parts[-1] += f", sha256 {record['changes_sha256'][:12]}"
    parts[-1] += ")"
    return " ".join(parts)


def _table(checks: list[Check]) -> list[str]:
    rows = ["| status | cell | check | measured | interval | threshold | p (adj.) |",
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
        adjusted = check.adjusted_p_value
        p = _p(check.p_value) + (f" ({_p(adjusted)})" if adjusted is not None and adjusted != check.p_value else "")
    return [f"{ICON[check.status]} {STATUS_LABEL[check.status]}", f"`{check.cell}`", kind, _escape(check.detail),
            interval, _escape(check.threshold_text), p]


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _notes(verdict: Verdict) -> dict[str, list[str]]:
    notes: dict[str, list[str]] = {}
    for check in verdict.checks:
        for note in check.notes:
            notes.setdefault(note, []).append(check.name)
    return notes
