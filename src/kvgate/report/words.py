"""The words every report uses for what happened to a check or a stage: one meaning each, one colour each.

    PASS     judged against a threshold, and it held
    FAIL     judged against a threshold, and it did not hold (a regression, broken kernels)
    ERROR    could not be judged: the stage or the test itself broke
    MISSING  planned or required, and absent
    WAIVED   judged, and covered by a waiver in matrix/waivers.toml (never PASS)
    RAN      the stage ran and wrote its outputs, but nothing judged them (no threshold, nothing to compare)
    SKIPPED  the runner chose not to run it, with a reason (e.g. the host cannot)
    NOT RUN  neither planned nor required, so nothing ran
    INFO     a figure reported, never judged

A verdict's check keeps its status (verdict.json: pass | fail | error | missing | waived | not_run | info); the
reports show `word_of(check)`, which tells RAN apart from PASS: a passing check with no threshold judged nothing.
The words and the totals they add up to are defined in kvgate.gate.verdict (verdict.json counts them too). Pure: no I/O. report.html and report.md take their labels, icons and colours from here.
"""

from __future__ import annotations

from kvgate.gate.verdict import ERROR, FAIL, INFO, MISSING, NOT_RUN, PASS, RAN, SKIPPED, WAIVED, WORDS, Check

# worst first: a grid entry that holds several checks shows the first of its words in this order
ORDER = WORDS
LABEL = {PASS: "PASS", FAIL: "FAIL", ERROR: "ERROR", MISSING: "MISSING", WAIVED: "WAIVED", RAN: "RAN",
         SKIPPED: "SKIPPED", NOT_RUN: "NOT RUN", INFO: "INFO"}
ICON = {PASS: "✅", FAIL: "❌", ERROR: "💥", MISSING: "❔", WAIVED: "⚠️", RAN: "▶️", SKIPPED: "⏭️",
        NOT_RUN: "➖", INFO: "ℹ️"}  # noqa: RUF001
COLOR = {PASS: "#1a7f37", FAIL: "#cf222e", ERROR: "#8250df", MISSING: "#bf8700", WAIVED: "#9a6700", RAN: "#57606a",
         SKIPPED: "#6e7781", NOT_RUN: "#8c959f", INFO: "#0969da"}
MEANING = {
    PASS: "judged against its threshold, and it held",
    FAIL: "judged against its threshold, and it did not hold",
    ERROR: "could not be judged: the stage or the test broke",
    MISSING: "planned or required, and absent",
    WAIVED: "judged, and covered by a waiver (matrix/waivers.toml)",
    RAN: "ran and wrote its outputs; nothing judged them",
    SKIPPED: "not run, for a stated reason",
    NOT_RUN: "neither planned nor required",
    INFO: "a figure reported, never judged",
}
ATTENTION = frozenset({FAIL, ERROR, MISSING})  # what a maintainer must act on (WAIVED is listed apart)


def word_of(check: Check) -> str:
    """The word a report shows for a check (kvgate.gate.verdict.Check.word): its status, except that a pass that
    judged nothing (no threshold: a stage's outputs were read, a throughput with no baseline to compare) is RAN, and
    a host that could not run a cell is SKIPPED."""
    return check.word


def label(word: str) -> str:
    return LABEL[word]


def icon_label(word: str) -> str:
    """e.g. "❌ FAIL", for Markdown."""
    return f"{ICON[word]} {LABEL[word]}"


def worst(words: list[str] | tuple[str, ...] | set[str]) -> str:
    """The word that a group of words reads as (the first of ORDER among them; NOT RUN for none)."""
    return min(words, key=ORDER.index) if words else NOT_RUN
