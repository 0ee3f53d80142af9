"""kvgate-comment.yml's renderer: the gate artifact (untrusted data) -> the body of one PR comment.

    GATE_DIR=<downloaded kvgate-gate> COMMENT_FILE=comment.json HEAD_SHA=<run head sha> \
    RUN_URL=<run url> RUN_CONCLUSION=<success|failure|...> GITHUB_REPOSITORY=<owner/repo> python3 ci/pr_comment.py

The artifact was written by a workflow that ran the pull request's code, so anything in it may be hostile.
It is read, never executed: files are read with a size cap and decoded leniently (invalid UTF-8 becomes U+FFFD),
JSON nested too deep is refused, the pull request number must be a positive integer and the artifact's head
commit must be this run's. The report is made inert by parsing it (ci/inert_markdown.py: markdown-it-py, CommonMark
with GFM's tables, never a pattern over the source) and writing it out again: control and bidi characters dropped;
raw HTML kept only as a few inert tags; images reduced to their text; links kept only into this run's repository (the
address's `..` resolved first); every `@` before a name character broken, so nobody is pinged; issue references
(`#12`, `owner/repo#12`, `GH-12`) broken and autolinks (`https://`, `www.`) out of the repository defanged, so no
other issue or pull request gets a backlink. The body
is fitted to a comment by folding, never by cutting a table: the report's `<details>` blocks outside code blocks,
largest first, each become one line naming what was folded (its summary escaped; the step summary and the artifact
keep the whole report), then whole paragraphs from the end go; the fitted body is parsed again, and folding that
would leave anything live is not done. The heading says "passed" only when the run concluded success AND the artifact's
verdict.json says the gate passed; otherwise it says what each of them said.

verdict.json, when the artifact holds one, must meet the results contract's verdict schema (the default branch's
docs/schemas/verdict.schema.json, checked with jsonschema, which the workflow installs from ci/requirements-core.txt):
a verdict that breaks it (not JSON, NaN or a number out of range included) is one ERROR line, exit status 2, and no
comment, since its heading could not be trusted.

Writes COMMENT_FILE = {"pull_request": N, "marker": ..., "body": ...}, or nothing (exit 0, a notice) when there
is no usable artifact. Never raises on any input: an unexpected error is a warning and no comment. A COMMENT_FILE or
$GITHUB_OUTPUT that cannot be written (ci/step_files.py) is one ERROR line, exit status 2, and `post` is not set.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run isolated (python -I), Python puts no folder there
import step_files

MARKER = "<!-- kvgate-gate-report -->"
# GitHub refuses comment bodies over 65,536 characters.
BODY_LIMIT = 60_000
DETAILS = re.compile(r"(?ms)^<details[^>\n]*>.*?^</details>[ \t]*$\n?")
SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.IGNORECASE)
# Never read more than this from one artifact file (verdict.json of 256 cells is larger than the report).
READ_LIMIT = 1024 * 1024
# The gate's verdict.json takes ~15 KB a compared cell (an A/B run of 1,072 cells: 16.0 MB): 64 MiB holds ~4,000.
VERDICT_READ_LIMIT = 64 * 1024 * 1024
CONCLUSIONS = {"success": "passed", "failure": "failed", "cancelled": "was cancelled", "timed_out": "timed out",
               "skipped": "was skipped", "neutral": "is neutral", "action_required": "needs approval",
               "stale": "is stale", "startup_failure": "failed to start"}
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
SHA = re.compile(r"[0-9a-f]{40}")
RUN_URL = re.compile(r"https://[A-Za-z0-9.-]+/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/actions/runs/[0-9]+(?:/attempts/[0-9]+)?")
REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+")


VERDICT_SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "schemas" / "verdict.schema.json"


class ArtifactError(Exception):
    """The artifact cannot be used; said as a notice, no comment posted."""


class VerdictError(Exception):
    """The artifact's verdict.json breaks the verdict schema: one ERROR line, exit status 2, no comment posted."""


def read_capped(path: Path, limit: int = READ_LIMIT) -> str:
    """At most `limit` bytes of a file, decoded leniently; refuses links and non-files."""
    if path.is_symlink() or not path.is_file():
        raise ArtifactError(f"{path.name}: not a plain file")
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        raise ArtifactError(f"{path.name}: cannot read ({error.strerror})") from None
    text = data[:limit].decode("utf-8", errors="replace")
    return text + ("\n\n_(cut: the report is larger than kvgate reads)_\n" if len(data) > limit else "")


def _json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise ArtifactError(f"{name}: not JSON") from None
    except RecursionError:
        raise ArtifactError(f"{name}: nested too deep") from None


def _refuse_number(literal: str) -> float:
    raise ValueError(f"{literal[:24]} is not a number JSON allows")


def _finite(literal: str) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {literal[:24]} is out of range (it reads as infinity)")
    return value


def _float_sized(literal: str) -> int:
    if len(literal) > 309:  # 1.8e308, the largest float, has 309 digits
        _finite(literal)
    return int(literal)


def _place(parts: Any) -> str:
    where = ""
    for part in parts:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    return where or "the top level"


def check_verdict(text: str, name: str = "verdict.json", schema_path: Path = VERDICT_SCHEMA) -> None:
    """Raise VerdictError, one line naming the file, the place and what is wrong, unless `text` is JSON (no NaN,
    no Infinity, no number out of a float's range) that meets the verdict schema."""
    try:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import best_match
    except ImportError:
        raise VerdictError(f"{name}: cannot be checked: jsonschema is not installed. Install ci/requirements-core.txt"
                           ) from None
    try:
        schema = json.loads(schema_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise VerdictError(f"{schema_path.name}: cannot read the verdict schema ({error})") from None
    try:
        data = json.loads(text, parse_constant=_refuse_number, parse_int=_float_sized, parse_float=_finite)
        error = best_match(Draft202012Validator(schema).iter_errors(data))
    except RecursionError:
        raise VerdictError(f"{name}: JSON nested too deeply") from None
    except ValueError as error:  # not JSON, NaN / Infinity, out of range, an integer of over 4300 digits
        raise VerdictError(f"{name}: not JSON the verdict schema allows ({str(error)[:120]})") from None
    if error is not None:
        raise VerdictError(f"{name}: {error.message[:160]} in {_place(error.absolute_path)}")


def _one_line(text: str) -> str:
    """A message from untrusted text as one inert line (no control characters, so no workflow command)."""
    return " ".join(CONTROL.sub(" ", text).split())


def pull_request_number(text: str, head_sha: str) -> int:
    data = _json(text, "pull_request.json")
    number = data.get("number") if isinstance(data, dict) else None
    # past 2**53 - 1 the posting step's JavaScript cannot hold it: its job would fail instead of posting nothing
    if isinstance(number, bool) or not isinstance(number, int) or not 0 < number < 2**53:
        raise ArtifactError("pull_request.json: 'number' is not a positive integer")
    if not SHA.fullmatch(head_sha or ""):
        raise ArtifactError("HEAD_SHA: not a commit SHA")
    if data.get("head_sha") != head_sha:
        raise ArtifactError("pull_request.json: its head_sha is not this run's head commit")
    return number


def sanitise(markdown: str, repository: str = "") -> str:
    """Markdown from the artifact, made inert by ci/inert_markdown.py: parsed with a real CommonMark/GFM parser
    (markdown-it-py) and written out again from its tokens, so that no raw HTML but a few inert tags, no image, no
    ping, no backlink and no link but into this run's own repository (`repository`, owner/repo; `..` resolved first)
    survives."""
    import inert_markdown  # markdown-it-py: ci/requirements-core.txt (the gate job imports this file without it)

    return inert_markdown.sanitise(markdown, repository)


FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$")
# What Markdown gives a meaning within a line, in a folded block's summary (text of an HTML block, which Markdown did
# not parse) moved into a paragraph: backslash-escaped, so that `[x](/other/repo/issues/1)` in it stays text
SUMMARY_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>!|~$])")


def code_spans(text: str) -> list[tuple[int, int]]:
    """Where fenced code blocks lie in `text` (start, end offsets), an unclosed one to the end. A fence at any
    indentation counts (one in a list item is indented): too many spans only fold fewer blocks."""
    spans, opened, offset = [], None, 0
    for line in text.splitlines(keepends=True):
        fence = FENCE.match(line.rstrip("\n"))
        if opened is None:
            if fence and not (fence.group(1)[0] == "`" and "`" in fence.group(2)):
                opened = (offset, fence.group(1)[0], len(fence.group(1)))
        elif fence and fence.group(1)[0] == opened[1] and len(fence.group(1)) >= opened[2] and not fence.group(2).strip():
            spans.append((opened[0], offset + len(line)))
            opened = None
        offset += len(line)
    if opened is not None:
        spans.append((opened[0], len(text)))
    return spans


def foldable(text: str) -> list[re.Match[str]]:
    """The `<details>` blocks of `text` that can be folded whole: none that starts or ends inside a code block or
    holds only part of one (folding it would take a fence away and turn the code after it into live Markdown)."""
    spans = code_spans(text)
    blocks = []
    for block in DETAILS.finditer(text):
        start, end = block.start(), block.end()
        if all(span_end <= start or span_start >= end or (start <= span_start and span_end <= end)
               for span_start, span_end in spans):
            blocks.append(block)
    return blocks


def fit(text: str, limit: int, folded: str, note: str, *, fold: bool = True) -> str:
    """`text` in at most `limit` characters, degraded by folding, never cut inside a table or a line: first each
    `<details>` block (outside code), largest first, becomes the line `folded` with {what} its summary (escaped);
    then whole paragraphs (a table is one) go from the end, and `note` says so. fold=False: paragraphs only."""
    if len(text) <= limit:
        return text
    blocks = sorted(foldable(text) if fold else [], key=lambda m: len(m.group(0)), reverse=True)
    replaced: dict[int, tuple[int, str]] = {}  # start -> (end, replacement)
    size = len(text)
    for block in blocks:
        summary = SUMMARY.search(block.group(0))
        what = SUMMARY_SPECIAL.sub(r"\\\1", " ".join(summary.group(1).split())) if summary else "details"
        line = folded.replace("{what}", what or "details") + "\n"
        replaced[block.start()] = (block.end(), line)
        size += len(line) - len(block.group(0))
        if size <= limit:
            break
    out, last = [], 0
    for start in sorted(replaced):
        end, line = replaced[start]
        out += [text[last:start], line]
        last = end
    text = "".join(out) + text[last:]
    if len(text) <= limit:
        return text
    kept, used = [], len(note) + 2
    for paragraph in text.split("\n\n"):
        if used + len(paragraph) + 2 > limit:
            break
        kept.append(paragraph)
        used += len(paragraph) + 2
    return "\n\n".join([*kept, note])


def verdict_outcome(text: str | None) -> str:
    """What the artifact's verdict.json says: passed, neutral, failed, absent or unreadable.

    It says passed only when it is self-consistent: `passed` true, exit status 0, no failed check counted.
    """
    if text is None:
        return "absent"
    try:
        data = _json(text, "verdict.json")
    except ArtifactError:
        return "unreadable"
    if not isinstance(data, dict) or not isinstance(data.get("passed"), bool):
        return "unreadable"
    summary = data.get("summary") if isinstance(data.get("summary"), dict) else {}
    failed = summary.get("failed")
    consistent = data.get("exit_status") == 0 and isinstance(failed, int) and not isinstance(failed, bool) and failed == 0
    if not data["passed"] or not consistent:
        return "failed"
    return "neutral" if data.get("neutral") is True else "passed"


def heading(outcome: str, conclusion: str) -> str:
    """The comment's heading from the verdict and the run's conclusion; "passed" needs both to say so."""
    said = CONCLUSIONS.get(conclusion, "finished")
    if outcome == "passed" and conclusion == "success":
        return "kvgate gate passed"
    if outcome == "failed":
        return "kvgate gate failed" + ("" if conclusion == "failure" else f" (though the workflow run {said})")
    if outcome == "neutral":
        return f"kvgate gate is neutral: nothing was compared with a baseline (the workflow run {said})"
    if outcome == "passed":
        return f"kvgate gate did not pass: the workflow run {said}, though the verdict says it passed"
    what = "no verdict" if outcome == "absent" else "an unreadable verdict"
    return f"kvgate gate: {what} (the workflow run {said})"


def render(report_md: str, conclusion: str, run_url: str, outcome: str = "absent", repository: str = "") -> str:
    """The comment body: a marker, a heading from the verdict and the run's conclusion, the sanitised report."""
    link = f"[workflow run]({run_url})" if RUN_URL.fullmatch(run_url or "") else "workflow run"
    head = (f"{MARKER}\n### {heading(outcome, conclusion)}\n\nFrom the {link}; the full report is its step "
            "summary and its kvgate-gate artifact.\n\n")
    note = f"_(report cut to fit a comment; see the {link})_"
    folded = f"<sub>Folded to fit a comment: {{what}}; see the {link}.</sub>"
    inert = sanitise(report_md, repository)
    body = fit(inert, BODY_LIMIT - len(head), folded, note)
    if body != inert and not _still_inert(body, repository, link):  # folding must never make anything live
        body = fit(inert, BODY_LIMIT - len(head), folded, note, fold=False)
        if not _still_inert(body, repository, link):
            body = note
    return head + body + "\n"


def _still_inert(body: str, repository: str, link: str) -> bool:
    """Whether a fitted body parses as inert as the sanitised report did; its own lines' link to the run aside."""
    import inert_markdown  # markdown-it-py: ci/requirements-core.txt

    return inert_markdown.inert_problem(body.replace(link, "workflow run"), repository) is None


def comment(gate_dir: Path, environ: Mapping[str, str]) -> dict[str, object]:
    if not gate_dir.is_dir():
        raise ArtifactError(f"{gate_dir}: no gate artifact was downloaded")
    number = pull_request_number(read_capped(gate_dir / "pull_request.json", 4096), environ.get("HEAD_SHA", ""))
    report = read_capped(gate_dir / "report.md")
    verdict_path = gate_dir / "verdict.json"
    verdict = None
    if verdict_path.exists() or verdict_path.is_symlink():
        try:  # one past the cap is refused as such, not cut and then refused as broken JSON
            if not verdict_path.is_symlink() and verdict_path.is_file() and \
                    verdict_path.stat().st_size > VERDICT_READ_LIMIT:
                raise ArtifactError(f"verdict.json: larger than {VERDICT_READ_LIMIT >> 20} MiB, the most kvgate reads")
            verdict = read_capped(verdict_path, VERDICT_READ_LIMIT)
        except ArtifactError as error:
            raise VerdictError(str(error)) from None
        check_verdict(verdict)
    repository = environ.get("GITHUB_REPOSITORY", "")
    body = render(report, environ.get("RUN_CONCLUSION", ""), environ.get("RUN_URL", ""), verdict_outcome(verdict),
                  repository if REPOSITORY.fullmatch(repository) else "")
    return {"pull_request": number, "marker": MARKER, "body": body}


def main() -> int:
    gate_dir = Path(os.environ.get("GATE_DIR", "kvgate-gate"))
    out = Path(os.environ.get("COMMENT_FILE", "comment.json"))
    try:
        data = comment(gate_dir, os.environ)
    except VerdictError as error:
        print(f"ERROR {_one_line(str(error))}", file=sys.stderr)
        return 2
    except ArtifactError as error:
        print(f"::notice::kvgate: no comment posted: {error}")
        return 0
    except Exception as error:
        print(f"::warning::kvgate: no comment posted: the artifact could not be rendered ({type(error).__name__})")
        return 0
    try:
        out.write_text(json.dumps(data), encoding="utf-8")
    except OSError as error:
        print(f"ERROR {_one_line(f'$COMMENT_FILE {out}')[:200]}: cannot write the comment ({error.strerror or error}). "
              "Point it at a file this job may write", file=sys.stderr)
        return 2
    try:
        step_files.append("GITHUB_OUTPUT", os.environ.get("GITHUB_OUTPUT"), "post=true\n")
    except step_files.StepFileError as error:
        print(f"ERROR {_one_line(str(error))}", file=sys.stderr)
        return 2
    print(f"kvgate: comment for pull request #{data['pull_request']} ({len(str(data['body']))} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
