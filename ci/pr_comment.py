"""kvgate-comment.yml's renderer: the gate artifact (untrusted data) -> the body of one PR comment.

    GATE_DIR=<downloaded kvgate-gate> COMMENT_FILE=comment.json HEAD_SHA=<run head sha> \
    RUN_URL=<run url> RUN_CONCLUSION=<success|failure|...> python3 ci/pr_comment.py

The artifact was written by a workflow that ran the pull request's code, so anything in it may be hostile.
It is read, never executed: files are read with a size cap, the pull request number must be a positive
integer and the artifact's head commit must be this run's, control characters are dropped, HTML is escaped
except a few inert tags, @mentions are broken so nobody is pinged, and the body is cut to fit a comment.
Writes COMMENT_FILE = {"pull_request": N, "marker": ..., "body": ...}, or nothing (exit 0, a notice)
when there is no usable artifact. Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

MARKER = "<!-- kvgate-gate-report -->"
# GitHub refuses comment bodies over 65,536 characters.
BODY_LIMIT = 60_000
# Never read more than this from one artifact file.
READ_LIMIT = 1024 * 1024
CONCLUSIONS = {"success": "passed", "failure": "failed", "cancelled": "was cancelled", "timed_out": "timed out",
               "skipped": "was skipped", "neutral": "is neutral", "action_required": "needs approval",
               "stale": "is stale", "startup_failure": "failed to start"}
ALLOWED_TAGS = re.compile(r"</?(?:details|summary|sub|sup|b|i|code|br)\s*/?>", re.IGNORECASE)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
MENTION = re.compile(r"(?<![\w`])@(?=[A-Za-z0-9])")
SHA = re.compile(r"[0-9a-f]{40}")
RUN_URL = re.compile(r"https://[A-Za-z0-9.-]+/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/actions/runs/[0-9]+(?:/attempts/[0-9]+)?")


class ArtifactError(Exception):
    """The artifact cannot be used; said as a notice, no comment posted."""


def read_capped(path: Path, limit: int = READ_LIMIT) -> str:
    """At most `limit` bytes of a file, decoded leniently; refuses links and non-files."""
    if path.is_symlink() or not path.is_file():
        raise ArtifactError(f"{path.name}: not a plain file")
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    text = data[:limit].decode("utf-8", errors="replace")
    return text + ("\n\n_(cut: the report is larger than kvgate reads)_\n" if len(data) > limit else "")


def pull_request_number(text: str, head_sha: str) -> int:
    try:
        data = json.loads(text)
    except ValueError:
        raise ArtifactError("pull_request.json: not JSON") from None
    number = data.get("number") if isinstance(data, dict) else None
    if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
        raise ArtifactError("pull_request.json: 'number' is not a positive integer")
    if not SHA.fullmatch(head_sha or ""):
        raise ArtifactError("HEAD_SHA: not a commit SHA")
    if data.get("head_sha") != head_sha:
        raise ArtifactError("pull_request.json: its head_sha is not this run's head commit")
    return number


def _escape_html(text: str) -> str:
    out, last = [], 0
    for match in ALLOWED_TAGS.finditer(text):
        out.append(text[last:match.start()].replace("<", "&lt;"))
        out.append(match.group(0))
        last = match.end()
    out.append(text[last:].replace("<", "&lt;"))
    return "".join(out)


def sanitise(markdown: str) -> str:
    """Markdown from the artifact, made inert: no control or bidi characters, no raw HTML, no pings."""
    text = CONTROL.sub("", markdown.replace("\r\n", "\n").replace("\r", "\n"))
    text = _escape_html(text)
    return MENTION.sub("@\u2060", text)


def clip(text: str, limit: int, note: str) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit - len(note) - 2]
    return cut[: cut.rfind("\n") + 1] + "\n" + note


def render(report_md: str, conclusion: str, run_url: str) -> str:
    """The comment body: a marker, a heading with the run's conclusion, the sanitised report."""
    said = CONCLUSIONS.get(conclusion, "finished")
    link = f"[workflow run]({run_url})" if RUN_URL.fullmatch(run_url or "") else "workflow run"
    head = f"{MARKER}\n### kvgate gate {said}\n\nFrom the {link}; the full report is its kvgate-gate artifact.\n\n"
    note = f"_(report cut to fit a comment; see the {link})_"
    return head + clip(sanitise(report_md), BODY_LIMIT - len(head), note) + "\n"


def comment(gate_dir: Path, environ: Mapping[str, str]) -> dict[str, object]:
    if not gate_dir.is_dir():
        raise ArtifactError(f"{gate_dir}: no gate artifact was downloaded")
    number = pull_request_number(read_capped(gate_dir / "pull_request.json", 4096), environ.get("HEAD_SHA", ""))
    report = read_capped(gate_dir / "report.md")
    body = render(report, environ.get("RUN_CONCLUSION", ""), environ.get("RUN_URL", ""))
    return {"pull_request": number, "marker": MARKER, "body": body}


def main() -> int:
    gate_dir = Path(os.environ.get("GATE_DIR", "kvgate-gate"))
    out = Path(os.environ.get("COMMENT_FILE", "comment.json"))
    try:
        data = comment(gate_dir, os.environ)
    except ArtifactError as error:
        print(f"::notice::kvgate: no comment posted: {error}")
        return 0
    out.write_text(json.dumps(data), encoding="utf-8")
    github_output = os.environ.get("GITHUB_OUTPUT")
    if github_output:
        with open(github_output, "a", encoding="utf-8") as handle:
            handle.write("post=true\n")
    print(f"kvgate: comment for pull request #{data['pull_request']} ({len(str(data['body']))} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
