"""ci/pr_comment.py: the gate artifact is untrusted; the comment is rendered from it, inert and bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci_scripts import load_ci_script

ROOT = Path(__file__).resolve().parents[1]
HEAD = "0123456789abcdef0123456789abcdef01234567"
RUN_URL = "https://github.com/acme/kvgate/actions/runs/123456"




pr_comment = load_ci_script("pr_comment")


def gate_artifact(tmp_path: Path, report: str, pr: object = None) -> Path:
    folder = tmp_path / "kvgate-gate"
    folder.mkdir()
    (folder / "report.md").write_text(report, encoding="utf-8")
    pr = {"number": 17, "head_sha": HEAD} if pr is None else pr
    (folder / "pull_request.json").write_text(json.dumps(pr), encoding="utf-8")
    return folder


def test_a_report_becomes_a_comment_with_marker_and_conclusion(tmp_path):
    folder = gate_artifact(tmp_path, "## kvgate gate: FAIL\n\n| cell | check |\n|---|---|\n| `a` | b |\n")
    data = pr_comment.comment(folder, {"HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": "failure"})
    assert data["pull_request"] == 17
    assert data["body"] == (f"{pr_comment.MARKER}\n### kvgate gate failed\n\nFrom the [workflow run]({RUN_URL}); the "
                            "full report is its kvgate-gate artifact.\n\n## kvgate gate: FAIL\n\n| cell | check |\n"
                            "|---|---|\n| `a` | b |\n\n")


def test_html_is_escaped_except_inert_tags():
    text = '<details><summary>All</summary>\n<img src=x onerror=alert(1)><!-- kvgate-gate-report -->\n</details>'
    assert pr_comment.sanitise(text) == ('<details><summary>All</summary>\n&lt;img src=x onerror=alert(1)>'
                                         '&lt;!-- kvgate-gate-report -->\n</details>')


def test_mentions_do_not_ping_and_hidden_characters_are_dropped():
    text = "cc @octocat and @org/team, mail a@b.c\u202e\x07 `@code`"
    assert pr_comment.sanitise(text) == "cc @\u2060octocat and @\u2060org/team, mail a@b.c `@code`"


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
    folder = gate_artifact(tmp_path, "## kvgate gate: PASS\n")
    env = {**os.environ, "GATE_DIR": str(folder), "COMMENT_FILE": str(tmp_path / "c.json"),
           "GITHUB_OUTPUT": str(tmp_path / "out"), "HEAD_SHA": HEAD, "RUN_URL": RUN_URL, "RUN_CONCLUSION": "success"}
    result = subprocess.run([sys.executable, "ci/pr_comment.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out").read_text() == "post=true\n"
    data = json.loads((tmp_path / "c.json").read_text())
    assert (data["pull_request"], data["marker"]) == (17, pr_comment.MARKER)
    assert data["body"].startswith(pr_comment.MARKER + "\n### kvgate gate passed\n")
