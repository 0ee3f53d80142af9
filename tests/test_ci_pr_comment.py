"""ci/pr_comment.py: the gate artifact is untrusted; the comment is rendered from it, inert and bounded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import synthetic_run
from ci_scripts import load_ci_script
from kvgate.cli import main
from kvgate.results import schema

ROOT = Path(__file__).resolve().parents[1]
HEAD = "0123456789abcdef0123456789abcdef01234567"
RUN_URL = "https://github.com/acme/kvgate/actions/runs/123456"

pr_comment = load_ci_script("pr_comment")
inert_markdown = load_ci_script("inert_markdown")
WJ = "\u2060"  # the word joiner the sanitiser puts after a broken `@`, `#` or `GH-`


def verdict(passed: bool, failed: int = 0, neutral: bool = False, exit_status: int | None = None) -> str:
    return json.dumps({"verdict_version": "1.1", "passed": passed, "neutral": neutral, "run": "runs/r",
                       "exit_status": (0 if passed else 1) if exit_status is None else exit_status,
                       "summary": {"checks": 4, "failed": failed}, "checks": []})


def gate_artifact(tmp_path: Path, report: str | bytes, pr: object = None, verdict_json: str | bytes | None = None) -> Path:
    folder = tmp_path / "kvgate-gate"
    folder.mkdir()
    write = (folder / "report.md").write_bytes if isinstance(report, bytes) else (folder / "report.md").write_text
    write(report)
    pr = {"number": 17, "head_sha": HEAD} if pr is None else pr
    (folder / "pull_request.json").write_text(pr if isinstance(pr, str) else json.dumps(pr), encoding="utf-8")
    if verdict_json is not None:
        target = folder / "verdict.json"
        (target.write_bytes if isinstance(verdict_json, bytes) else target.write_text)(verdict_json)
    return folder


def test_a_report_becomes_a_comment_with_marker_and_conclusion(tmp_path):
    folder = gate_artifact(tmp_path, "## kvgate gate: FAIL\n\n| cell | check |\n|---|---|\n| `a` | b |\n",
                           verdict_json=verdict(False, failed=1))
    data = pr_comment.comment(folder, {"HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": "failure"})
    assert data["pull_request"] == 17
    assert data["body"] == (f"{pr_comment.MARKER}\n### kvgate gate failed\n\nFrom the [workflow run]({RUN_URL}); the "
                            "full report is its step summary and its kvgate-gate artifact.\n\n## kvgate gate: FAIL\n\n| cell | check |\n"
                            "|---|---|\n| `a` | b |\n\n")


def test_html_is_escaped_except_inert_tags():
    text = '<details><summary>All</summary>\n<img src=x onerror=alert(1)><!-- kvgate-gate-report -->\n</details>'
    assert pr_comment.sanitise(text) == ('<details><summary>All</summary>\n&lt;img src=x onerror=alert(1)&gt;'
                                         '&lt;!-- kvgate-gate-report --&gt;\n</details>\n')


def test_mentions_do_not_ping_and_hidden_characters_are_dropped():
    text = "cc @octocat and @org/team, mail a@b.c\u202e\x07\x85\ufeff `@code`"
    assert pr_comment.sanitise(text) == f"cc @{WJ}octocat and @{WJ}org/team, mail a@{WJ}b.c `@{WJ}code`\n"


@pytest.mark.parametrize(("text", "expected"), [
    ("see `@octocat for details", f"see \\`@{WJ}octocat for details"),  # a backtick never closed: not code
    ("café@octocat", f"café@{WJ}octocat"),  # after a non-ASCII letter
    ("x@octocat_ @-dash @_under", f"x@{WJ}octocat\\_ @{WJ}-dash @{WJ}\\_under"),
    ("\uff20octocat", f"\uff20{WJ}octocat"),  # the full-width at sign
    ("@\u200boctocat", f"@{WJ}octocat"),  # a zero-width space removed must not leave a mention behind
    # character references are characters once parsed: each `@` they make is broken like any other
    ("&#64;octocat &#x40;octocat &commat;octocat", f"@{WJ}octocat @{WJ}octocat @{WJ}octocat"),
    ("a @ b, 100@%, email@", "a @ b, 100@%, email@"),  # an @ before no name character pings nobody
])
def test_attack_every_at_before_a_name_character_is_broken(text, expected):
    assert pr_comment.sanitise(text) == expected + "\n"


@pytest.mark.parametrize(("text", "expected"), [
    ("fixes vllm-project/vllm#123", f"fixes vllm-project/vllm#{WJ}123"),
    ("see #7 and GH-9", f"see #{WJ}7 and GH-{WJ}9"),
    ("at vllm-project/vllm@0123abcd", f"at vllm-project/vllm@{WJ}0123abcd"),
    ("https://github.com/vllm-project/vllm/issues/1", "https[:]//github[.]com/vllm-project/vllm/issues/1"),
    ("[x](HTTPS://WWW.GitHub.com/o/r/pull/2#issuecomment-3)", "x"),
    ("https://github.com/acme/kvgate/actions/runs/5 (this repository)", "https://github.com/acme/kvgate/actions/runs/5 "
     "(this repository)"),
    ("https://github.com/acme/kvgate-fork/issues/5", "https[:]//github[.]com/acme/kvgate-fork/issues/5"),
    ("api.github.com/repos/o/r and notgithub.com/o/r", "api.github.com/repos/o/r and notgithub.com/o/r"),
    # `..` is resolved before the check: these name another repository
    ("https://github.com/acme/kvgate/../../evil/repo/issues/1", "https[:]//github[.]com/acme/kvgate/../../evil/repo/"
                                                                "issues/1"),
    ("[x](https://github.com/acme/kvgate/../../evil/repo/issues/1)", "x"),
    ("[x](https://github.com/acme/kvgate/%2e%2e/%2E%2E/evil/repo/pull/2)", "x"),
    ("[x](https://github.com/acme/kvgate/..%5c..%5cevil/repo/pull/2)", "x"),
    ("[x](https://github.com/acme/kvgate/docs/../README.md)", "[x](<https://github.com/acme/kvgate/README.md>)"),
    ("[x](https://user:pw@github.com/acme/kvgate/issues/1)", "x"),
])
def test_attack_cross_repository_references_are_escaped(text, expected):
    assert pr_comment.sanitise(text, "acme/kvgate") == expected + "\n"


def test_without_a_repository_every_github_link_is_defanged():
    assert pr_comment.sanitise("https://github.com/acme/kvgate/issues/5") == \
        "https[:]//github[.]com/acme/kvgate/issues/5\n"


def test_a_huge_report_is_cut_under_the_comment_limit(tmp_path):
    folder = gate_artifact(tmp_path, "| row |\n" * 200_000)
    body = pr_comment.comment(folder, {"HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": "success"})["body"]
    assert len(body) <= pr_comment.BODY_LIMIT + 1
    assert body.endswith(f"_(report cut to fit a comment; see the [workflow run]({RUN_URL}))_\n")


def test_a_report_bigger_than_kvgate_reads_is_not_read_whole(tmp_path):
    path = tmp_path / "report.md"
    path.write_bytes(b"x" * (pr_comment.READ_LIMIT + 10))
    text = pr_comment.read_capped(path)
    assert text.startswith("x" * pr_comment.READ_LIMIT) and text.endswith("kvgate reads)_\n")


@pytest.mark.parametrize(("pr", "head", "message"), [
    ({"number": "17", "head_sha": HEAD}, HEAD, "pull_request.json: 'number' is not a positive integer"),
    ({"number": True, "head_sha": HEAD}, HEAD, "pull_request.json: 'number' is not a positive integer"),
    ({"number": -3, "head_sha": HEAD}, HEAD, "pull_request.json: 'number' is not a positive integer"),
    ({"number": 2**53, "head_sha": HEAD}, HEAD, "pull_request.json: 'number' is not a positive integer"),
    ({"number": 10**400, "head_sha": HEAD}, HEAD, "pull_request.json: 'number' is not a positive integer"),
    ({"number": 17, "head_sha": "f" * 40}, HEAD, "pull_request.json: its head_sha is not this run's head commit"),
    ({"number": 17, "head_sha": HEAD}, "main", "HEAD_SHA: not a commit SHA"),
])
def test_the_pull_request_number_is_checked(tmp_path, pr, head, message):
    folder = gate_artifact(tmp_path, "report", pr)
    with pytest.raises(pr_comment.ArtifactError) as error:
        pr_comment.comment(folder, {"HEAD_SHA": head})
    assert str(error.value) == message


def test_a_link_in_place_of_a_file_is_refused(tmp_path):
    folder = gate_artifact(tmp_path, "report")
    (folder / "report.md").unlink()
    (folder / "report.md").symlink_to("/etc/passwd")
    with pytest.raises(pr_comment.ArtifactError, match=r"report\.md: not a plain file"):
        pr_comment.comment(folder, {"HEAD_SHA": HEAD})


def test_an_odd_run_url_is_not_linked():
    body = pr_comment.render("r", "success", "javascript:alert(1)")
    assert "javascript" not in body and "From the workflow run;" in body


def test_no_artifact_posts_nothing_and_does_not_fail(tmp_path):
    env = {**os.environ, "GATE_DIR": str(tmp_path / "absent"), "COMMENT_FILE": str(tmp_path / "c.json"),
           "GITHUB_OUTPUT": str(tmp_path / "out"), "HEAD_SHA": HEAD}
    result = subprocess.run([sys.executable, "ci/pr_comment.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0
    assert "::notice::kvgate: no comment posted" in result.stdout
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "out").exists()


def test_the_script_writes_the_comment_and_the_post_flag(tmp_path):
    folder = gate_artifact(tmp_path, "## kvgate gate: PASS\n", verdict_json=verdict(True))
    env = {**os.environ, "GATE_DIR": str(folder), "COMMENT_FILE": str(tmp_path / "c.json"),
           "GITHUB_OUTPUT": str(tmp_path / "out"), "HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": "success"}
    result = subprocess.run([sys.executable, "ci/pr_comment.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out").read_text() == "post=true\n"
    data = json.loads((tmp_path / "c.json").read_text())
    assert (data["pull_request"], data["marker"]) == (17, pr_comment.MARKER)
    assert data["body"].startswith(pr_comment.MARKER + "\n### kvgate gate passed\n")


# ------------------------------------------------------------------------------------------------ the heading

@pytest.mark.parametrize(("verdict_json", "conclusion", "title"), [
    (verdict(True), "success", "kvgate gate passed"),
    (verdict(False, failed=2), "failure", "kvgate gate failed"),
    (verdict(False, failed=2), "success", "kvgate gate failed (though the workflow run passed)"),
    (verdict(True), "failure", "kvgate gate did not pass: the workflow run failed, though the verdict says it passed"),
    (verdict(True), "cancelled",
     "kvgate gate did not pass: the workflow run was cancelled, though the verdict says it passed"),
    (verdict(True, neutral=True), "success",
     "kvgate gate is neutral: nothing was compared with a baseline (the workflow run passed)"),
    # a verdict that contradicts itself is a failed one
    (verdict(True, failed=1), "success", "kvgate gate failed (though the workflow run passed)"),
    (verdict(True, exit_status=1), "success", "kvgate gate failed (though the workflow run passed)"),
    (None, "success", "kvgate gate: no verdict (the workflow run passed)"),
])
def test_attack_the_heading_does_not_trust_the_run_conclusion_alone(tmp_path, verdict_json, conclusion, title):
    folder = gate_artifact(tmp_path, "report\n", verdict_json=verdict_json)
    body = pr_comment.comment(folder, {"HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": conclusion})["body"]
    assert body.splitlines()[1] == f"### {title}"


def test_a_verdict_that_is_a_link_is_refused(tmp_path):
    folder = gate_artifact(tmp_path, "report\n")
    (folder / "verdict.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(pr_comment.VerdictError) as error:
        pr_comment.comment(folder, {"HEAD_SHA": HEAD, "RUN_CONCLUSION": "success"})
    assert str(error.value) == "verdict.json: not a plain file"


VALID = json.loads(verdict(True))
INVALID_VERDICTS = {
    "4 KiB of [": ("[" * 4096, "JSON nested too deeply"),
    "invalid UTF-8": (b"\xff\xfe{", "not JSON the verdict schema allows (Expecting value: line 1 column 1 (char 0))"),
    "a word for passed": (json.dumps({**VALID, "passed": "yes"}), "'yes' is not of type 'boolean' in passed"),
    "no run": (json.dumps({k: v for k, v in VALID.items() if k != "run"}), "'run' is a required property in the "
                                                                            "top level"),
    "a count below 0": (json.dumps({**VALID, "summary": {"failed": -1}}), "-1 is less than the minimum of 0 in "
                                                                          "summary.failed"),
    "a check of no status": (json.dumps({**VALID, "checks": [{"cell": "c", "kind": "probe", "status": "passed"}]}),
                             "'passed' is not one of ['pass', 'fail', 'waived', 'missing', 'error', 'not_run', "
                             "'info'] in checks[0].status"),
    "a NaN p-value": (verdict(True).replace('"checks": []', '"checks": [{"cell": "c", "kind": "probe", '
                                                              '"status": "pass", "p_value": NaN}]'),
                      "not JSON the verdict schema allows (NaN is not a number JSON allows)"),
    "an infinite exit status": (verdict(True).replace('"exit_status": 0', '"exit_status": 1e999'),
                                "not JSON the verdict schema allows (number 1e999 is out of range (it reads as "
                                "infinity))"),
}


@pytest.mark.parametrize("name", INVALID_VERDICTS)
def test_a_verdict_against_the_verdict_schema_is_refused_in_one_line(tmp_path, name):
    """Its heading could not be trusted: no comment, one line naming the file, the place and what is wrong."""
    text, message = INVALID_VERDICTS[name]
    folder = gate_artifact(tmp_path, "report\n", verdict_json=text)
    with pytest.raises(pr_comment.VerdictError) as error:
        pr_comment.comment(folder, {"HEAD_SHA": HEAD, "RUN_CONCLUSION": "success"})
    assert str(error.value) == f"verdict.json: {message}"


def test_a_verdict_the_gate_wrote_meets_the_schema_the_comment_checks(tmp_path):
    run = synthetic_run.write_seed_run(tmp_path / "run", probes=True)
    assert main(["gate", str(run), "--today", "2026-11-30", "--out", str(tmp_path / "gate")]) == 0
    pr_comment.check_verdict((tmp_path / "gate" / "verdict.json").read_text(encoding="utf-8"))
    assert pr_comment.VERDICT_SCHEMA.read_text(encoding="utf-8") == schema.schema_text("verdict")


def test_the_script_refuses_a_verdict_against_the_schema_with_exit_status_2_and_no_comment(tmp_path):
    hostile = json.dumps({**VALID, "verdict_version": "1.1\n::warning::forged"})
    folder = gate_artifact(tmp_path, "report\n", verdict_json=hostile)
    env = {**os.environ, "GATE_DIR": str(folder), "COMMENT_FILE": str(tmp_path / "c.json"),
           "GITHUB_OUTPUT": str(tmp_path / "out"), "HEAD_SHA": HEAD, "RUN_CONCLUSION": "success"}
    result = subprocess.run([sys.executable, "ci/pr_comment.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("ERROR verdict.json: '1.1\\n::warning::forged' does not match "
                             "'^[0-9]{1,6}(\\\\.[0-9]{1,6})*$' in verdict_version\n")  # one line, no workflow command
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ hostile files

HOSTILE_REPORTS = {
    "4 KiB of [": "[" * 4096,
    "deep emphasis and links": "*_" * 50_000 + "[a](" * 20_000,
    "invalid UTF-8": b"## kvgate\n\xff\xfe\xc3(\xed\xa0\x80 @octocat\n",
    "2 MiB of mentions": "@octocat " * 240_000,
    "NUL bytes": "a\x00b\x00@c\n",
    "unclosed everything": "<details><summary>`@x ```\n<!-- " + "<" * 10_000,
}


@pytest.mark.parametrize("name", HOSTILE_REPORTS)
def test_attack_hostile_report_files_never_raise(tmp_path, name):
    folder = gate_artifact(tmp_path, HOSTILE_REPORTS[name], verdict_json=verdict(True))
    data = pr_comment.comment(folder, {"HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": "success"})
    body = data["body"]
    assert len(body) <= pr_comment.BODY_LIMIT + 1
    assert body.startswith(pr_comment.MARKER + "\n### kvgate gate passed\n")
    assert re.search(r"[@\uff20][A-Za-z0-9_-]", body) is None  # no mention survives
    assert "\x00" not in body and "<!--" not in body.removeprefix(pr_comment.MARKER)


@pytest.mark.parametrize(("pr", "notice"), [
    ("[" * 4096, "::notice::kvgate: no comment posted: pull_request.json: nested too deep"),
    ("{\"number\": 17, \"head_sha\": \"" + "a" * 5000 + "\"}", "::notice::kvgate: no comment posted: "
     "pull_request.json: not JSON"),  # cut at 4 KiB: no longer JSON
    ("\xff", "::notice::kvgate: no comment posted: pull_request.json: not JSON"),
])
def test_attack_a_hostile_pull_request_file_posts_nothing_and_does_not_fail(tmp_path, pr, notice):
    folder = gate_artifact(tmp_path, "report", pr)
    env = {**os.environ, "GATE_DIR": str(folder), "COMMENT_FILE": str(tmp_path / "c.json"),
           "GITHUB_OUTPUT": str(tmp_path / "out"), "HEAD_SHA": HEAD}
    result = subprocess.run([sys.executable, "ci/pr_comment.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, notice, "")
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "out").exists()


def test_an_unexpected_error_is_a_warning_not_a_traceback(tmp_path, monkeypatch, capsys):
    def broken(gate_dir, environ):
        raise MemoryError
    monkeypatch.setattr(pr_comment, "comment", broken)
    monkeypatch.setenv("COMMENT_FILE", str(tmp_path / "c.json"))

    assert pr_comment.main() == 0
    assert capsys.readouterr().out == ("::warning::kvgate: no comment posted: the artifact could not be rendered "
                                       "(MemoryError)\n")
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("![pixel](https://evil.example/p.png?pr=1)", "pixel"),
    ("[the run](/acme/kvgate/actions/runs/5)", "the run"),  # root-relative: resolves on github.com, dropped
    ("[docs](https://evil.example/x)", "docs"),
    ("[report](https://github.com/acme/kvgate/actions/runs/5)", "[report](<https://github.com/acme/kvgate/actions/runs/5>)"),
    ("[ref][1]\n\n[1]: https://evil.example/x", "ref"),  # the definition goes with the link
    ("see https://evil.example/x now", "see https[:]//evil.example/x now"),
    ("javascript:alert(1)", "javascript[:]alert(1)"),
    ("[x](<https://evil.example/a b>)", "x"),
    # issue 32's escapes: a link text with brackets, a `www.` autolink, an image in a link, an autolink in brackets
    ("[a [b]](//host/x)", "a [b]"),
    ("go to www.evil.example/x", "go to www[.]evil.example/x"),
    ("[![i](https://evil.example/p.png)](https://evil.example/)", "i"),
    ("<https://evil.example/x>", "https[:]//evil.example/x"),
    ("mail@evil.example", f"mail@{WJ}evil.example"),
])
def test_attack_images_and_links_out_of_the_repository_keep_only_their_text(text, expected):
    assert pr_comment.sanitise(text, "acme/kvgate") == expected + "\n"


HOSTILE_MARKDOWN = [
    "[a [b]](//host/x)", "[a [b [c]]](https://evil.example/)", "[a](//host/x \"t\") [b](<//host/y>)",
    "www.evil.example and http://evil.example and https://evil.example/x?y=1#z", "![i](x) ![j][k]\n\n[k]: y",
    "<a href=//evil.example>x</a> <img src=x> <svg onload=x> <details open>y</details>",
    "[x](javascript:alert(1)) [y](data:text/html,x) [z](vbscript:x)", "<https://evil.example> <mailto:a@b.c>",
    "| a | [b](//h) |\n|---|---|\n| ![c](//i) | <img src=//j> |", "> [q](//h)\n> ![r](//i)",
    "- [l](//h)\n  - ![m](//i)\n1. www.n.example", "```\n[f](//h)\n```\n~~~ mermaid\nx\n~~~",
    "[x]( //h ) [y](\\\\h) [z](%2F%2Fh)", "[x](https://github.com/acme/kvgate/../../e/r/issues/1)",
    "&lt;img src=x&gt; &#60;img src=x&#62;", "*[x](//h)* **![y](//i)** ~~[z](//j)~~", "[x\n](//h)", "[\n]:\n//h",
    "<details><summary>[s](//h)</summary>\n\n[t](//i)\n\n</details>", "<sub>[x](//h)</sub> <br> <b>y</b>",
]


@pytest.mark.parametrize("text", HOSTILE_MARKDOWN)
def test_attack_what_is_left_parses_as_inert_markdown(text):
    """Parsed again as GitHub would, the comment holds no image, no link out of the repository and no raw HTML but
    the inert tags, whatever the artifact held; and the text of every link and image is still there."""
    import inert_markdown

    out = pr_comment.sanitise(text, "acme/kvgate")
    assert inert_markdown.inert_problem(out, "acme/kvgate") is None, out
    assert not out.startswith("_(the report could not be shown safely"), out  # never needed the fallback


def test_the_comment_job_renders_from_its_sparse_checkout_alone(tmp_path):
    """kvgate-comment.yml checks out only the paths its sparse-checkout names, and runs the renderer isolated (-I):
    those paths are all it needs."""
    import shutil

    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "kvgate-comment.yml").read_text())
    checkout = next(s for s in workflow["jobs"]["comment"]["steps"] if s.get("uses", "").startswith("actions/checkout"))
    sparse = tmp_path / "sparse"
    for pattern in checkout["with"]["sparse-checkout"].split():
        source = ROOT / pattern.strip("/")
        target = sparse / pattern.strip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    folder = gate_artifact(tmp_path, "## kvgate gate: FAIL\n\n- @octocat [x](//evil.example)\n",
                           verdict_json=verdict(False, failed=1))
    env = {**os.environ, "GATE_DIR": str(folder), "COMMENT_FILE": str(tmp_path / "c.json"),
           "GITHUB_OUTPUT": str(tmp_path / "out"), "HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": "failure"}
    result = subprocess.run([sys.executable, "-I", "ci/pr_comment.py"], cwd=sparse, env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
    body = json.loads((tmp_path / "c.json").read_text())["body"]
    assert body.endswith(f"- @{WJ}octocat x\n\n")


FILLER = "\n\n".join(["filler paragraph " + "x" * 200] * 400)  # ~80,000 characters: the comment must be folded


def folded_comment(tmp_path: Path, report: str) -> str:
    folder = gate_artifact(tmp_path, report)
    body = pr_comment.comment(folder, {"HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": "failure",
                                       "GITHUB_REPOSITORY": "acme/kvgate"})["body"]
    assert len(body) <= pr_comment.BODY_LIMIT + 1
    return body


@pytest.mark.parametrize("code", [
    "```\n</details>\n[evil](https://evil.example/x) ![i](https://evil.example/i.png) <img src=x>\n```",
    "~~~\n</details>\n<script>alert(1)</script> [evil](https://evil.example/y)\n~~~",
    "    </details>\n    [evil](https://evil.example/z)",  # an indented code block: written out as a fence
])
def test_attack_folding_a_details_block_never_takes_a_code_fence_away(tmp_path, code):
    """A report too long for a comment has its `<details>` blocks folded, matched from `<details>` to the next line
    `</details>`: one inside a code block ended the match there, the fence that opened the code went with the block,
    and the code's verbatim text after it (a link, an image, raw HTML) became live Markdown in the comment."""
    body = folded_comment(tmp_path, f"<details>\n<summary>s</summary>\n\n{code}\n\n</details>\n\n{FILLER}")
    rest = body.split("\n", 1)[1]
    assert inert_markdown.inert_problem(rest.replace(f"[workflow run]({RUN_URL})", ""), "acme/kvgate") is None
    rendered = inert_markdown.parser().render(body)
    assert "evil.example" not in "".join(re.findall(r'(?:href|src)="([^"]*)"', rendered))
    assert "<img" not in rendered and "<script" not in rendered


def test_attack_a_folded_blocks_summary_stays_text(tmp_path):
    """The summary of a folded block (an HTML block's text, which Markdown did not parse) went into a Markdown line:
    a link in it, `[l](/other/repo/issues/1)`, became a live link (a backlink on another repository's issue)."""
    report = ("<details>\n<summary>[l](/other/repo/issues/1) [m](https://evil.example) *x*</summary>\n\nbody\n\n"
              f"</details>\n\n{FILLER}")
    body = folded_comment(tmp_path, report)
    assert "Folded to fit a comment: \\[l\\]\\(/other/repo/issues/1\\)" in body
    links = re.findall(r'href="([^"]*)"', inert_markdown.parser().render(body))
    assert set(links) == {RUN_URL}


def test_a_details_block_outside_code_is_folded(tmp_path):
    body = folded_comment(tmp_path, f"<details>\n<summary>The cells' logs</summary>\n\n```\nlog\n```\n\n</details>\n\n"
                                    f"kept\n\n<details>\n<summary>big</summary>\n\n{FILLER}\n\n</details>\n")
    assert f"<sub>Folded to fit a comment: big; see the [workflow run]({RUN_URL}).</sub>" in body
    assert "<summary>The cells' logs</summary>" in body and "kept" in body


@pytest.mark.parametrize(("text", "expected"), [
    # the text of an image or a dropped link meets the text beside it: escaped apart, `@` and `octocat` made a mention
    ("&#64;![octocat](x.png)", f"@{WJ}octocat"),
    ("@[octocat](https://evil.example)", f"@{WJ}octocat"),
    ("#![12](x.png)", f"\\#{WJ}12"),
    ("GH-[12](https://evil.example)", f"GH-{WJ}12"),
    ("https:![//evil.example/x](y.png)", "https[:]//evil.example/x"),
    ("![@octocat](x.png)", f"@{WJ}octocat"),
    # GitHub's autolinker (cmark-gfm) takes a scheme after `_` or a digit, and `www.` after `_`, which `\b` missed
    ("a_https://evil.example/x", "a_https[:]//evil.example/x"),
    ("1https://evil.example/x", "1https[:]//evil.example/x"),
    ("a_www.evil.example", "a_www[.]evil.example"),
    # one match of an address took a second one with it, and only the first was defanged
    ("x(https://a.example)(https://evil.example/b)", "x(https[:]//a.example)(https[:]//evil.example/b)"),
    ("https://a.example/*https://evil.example/b", "https[:]//a.example/\\*https[:]//evil.example/b"),
    ("https://a.example/_www.evil.example", "https[:]//a.example/\\_www[.]evil.example"),
])
def test_attack_no_mention_reference_or_autolink_forms_across_a_boundary(text, expected):
    assert pr_comment.sanitise(text, "acme/kvgate") == expected + "\n"


@pytest.mark.parametrize(("text", "expected"), [
    ("[# Passed](https://evil.example)", "\\# Passed"),  # a heading of the attacker's words
    ("[> quoted](https://evil.example)", "\\> quoted"),
    ("[- item](https://evil.example)", "\\- item"),
    ("[1. item](https://evil.example)", "1\\. item"),
    ("![# h](x.png)", "\\# h"),
])
def test_attack_a_dropped_links_text_first_in_a_line_opens_no_block(text, expected):
    """A link out of the repository keeps only its text; first in a line, that text was written unescaped there and
    opened a heading, a quote or a list item of the pull request's words."""
    assert pr_comment.sanitise(text, "acme/kvgate") == expected + "\n"


@pytest.mark.parametrize(("variable", "message"), [
    ("COMMENT_FILE", "ERROR $COMMENT_FILE {folder}: cannot write the comment (Is a directory). Point it at a file this "
                     "job may write\n"),
    ("GITHUB_OUTPUT", "ERROR $GITHUB_OUTPUT {folder}: cannot append to it (it is a folder). Point it at a file this job "
                      "may write (GitHub Actions sets it for each step), or unset it\n"),
])
def test_a_comment_file_or_output_that_cannot_be_written_is_one_error_line(tmp_path, variable, message):
    """Either naming a folder was an IsADirectoryError traceback, though the renderer says it never raises."""
    folder = gate_artifact(tmp_path, "## kvgate gate: PASS\n", verdict_json=verdict(True))
    (tmp_path / "folder").mkdir()
    env = {**os.environ, "GATE_DIR": str(folder), "COMMENT_FILE": str(tmp_path / "c.json"),
           "GITHUB_OUTPUT": str(tmp_path / "out"), "HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": "success",
           variable: str(tmp_path / "folder")}
    result = subprocess.run([sys.executable, "-I", "ci/pr_comment.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False)
    assert (result.returncode, result.stderr) == (2, message.format(folder=tmp_path / "folder"))
    assert not (tmp_path / "out").exists()  # no post=true: nothing is posted
