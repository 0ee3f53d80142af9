"""Verdict -> GitHub Actions workflow commands: one `::error title=<check>::<reason>` line per failing check (GitHub
shows each as an annotation on the run and the pull request), and one `::warning` for a NEUTRAL verdict.

Escaped as GitHub's actions/toolkit escapes them (`escapeData`, `escapeProperty` in packages/core/src/command.ts), and
every `::` in a message too (kvgate.report.command_escapes), so a reason with a newline, a colon or a percent sign
stays one annotation. GitHub shows at most 10 error
annotations per step; the first 10 are the failures the report leads with, and the last line says how many more.
"""

from __future__ import annotations

from kvgate.gate.verdict import Verdict, sort_key
from kvgate.report.command_escapes import workflow_command
from kvgate.report.markdown import headline

GITHUB_ERROR_ANNOTATIONS_PER_STEP = 10  # docs.github.com: "up to 10 error annotations" per step


def workflow_commands(verdict: Verdict) -> list[str]:
    """The annotation lines for a verdict, worst failure first (none for a plain pass)."""
    failed = sorted(verdict.failed, key=sort_key)
    lines = [error_line(check.name, check.headline or check.detail) for check in failed]
    if len(lines) > GITHUB_ERROR_ANNOTATIONS_PER_STEP:
        more = len(lines) - (GITHUB_ERROR_ANNOTATIONS_PER_STEP - 1)
        lines = [*lines[:GITHUB_ERROR_ANNOTATIONS_PER_STEP - 1],
                 error_line("kvgate", f"{more} more failing checks: see the gate's report.md")]
    if verdict.neutral:
        lines.append(workflow_command("warning", headline(verdict), title="kvgate"))
    return lines


def error_line(title: str, message: str) -> str:
    return workflow_command("error", message, title=title)
