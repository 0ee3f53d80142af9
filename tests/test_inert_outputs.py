"""Hostile text in a results folder stays text in every output: report.md (the step summary), the PR comment
(ci/pr_comment.py) and the workflow commands GitHub Actions reads from a step's output (`::error::`). Played through
`kvgate gate` under GITHUB_ACTIONS=true, then ci/pr_comment.py on its artifact, and ci/gate_job.py's own lines.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import synthetic_run
from ci_scripts import load_ci_script
from kvgate.cli import main

ROOT = Path(__file__).resolve().parents[1]
HEAD = "0123456789abcdef0123456789abcdef01234567"
inert_markdown = load_ci_script("inert_markdown")

# What issue 32 found escaping the old sanitisers, and their kin: nested brackets, `www.` autolinks, images, raw HTML,
# mentions, references, and a newline that starts a workflow command of its own
HOSTILE = ("[a [b]](//evil.example/x) www.evil.example ![px](https://evil.example/p.png) <img src=//evil.example/i> "
           "@octocat vllm-project/vllm#1 https://github.com/vllm-project/vllm/issues/2 "
           "\n::warning::forged %0A::error::forged2 :: end")
KVGATE_COMMANDS = re.compile(r"::(error|warning) title=[^:\n]*::[^\n]*")


def hostile_run(tmp_path: Path) -> Path:
    """The seed cells, one stage failed with a hostile reason, one cell.json with a hostile model (refused: the matrix
    decides the model), and a folder whose name breaks lines."""
    run = synthetic_run.write_seed_run(tmp_path / "run", contract="1.6")
    fp8 = run / "flashinfer_mla-fp8-sm100"
    status = json.loads((fp8 / "status.json").read_text())
    status["throughput"] = {"status": "error", "reason": HOSTILE, "log_tail": HOSTILE}
    (fp8 / "status.json").write_text(json.dumps(status))
    auto = run / "flashinfer_mla-auto-sm100"
    record = json.loads((auto / "cell.json").read_text())
    (auto / "cell.json").write_text(json.dumps({**record, "model": HOSTILE}))
    odd = run / "x\n::warning::from-a-folder-name [l](https:evil.example)"
    odd.mkdir()
    (odd / "status.json").write_text("{}")  # a cell folder without cell.json: an unreadable cell, named by its folder
    return run


def command_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.lstrip().startswith("::")]


def test_attack_hostile_text_through_kvgate_gate_stays_text(tmp_path):
    run = hostile_run(tmp_path)
    summary = tmp_path / "summary.md"
    env = {**os.environ, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    gate = subprocess.run([sys.executable, "-I", "-m", "kvgate", "gate", str(run), "--today", "2026-12-02"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    print(gate.stdout, gate.stderr)
    assert gate.returncode == 1
    # every workflow command is kvgate's own, one line each, its data escaped (`::` inside as %3A%3A)
    commands = command_lines(gate.stdout + gate.stderr)
    assert commands and all(KVGATE_COMMANDS.fullmatch(line) for line in commands), commands
    assert all("::" not in line.split("::", 2)[2] for line in commands)
    assert "forged" in "".join(commands) and "%3A%3Awarning%3A%3Aforged" in "".join(commands)
    assert not any("from-a-folder-name" in line and line.startswith("::") for line in gate.stderr.splitlines())
    assert any(line.startswith("ERROR ") and "\\n::warning::from-a-folder-name" in line
               for line in gate.stderr.splitlines())  # the folder named, its newline written as \n
    # report.md (and the step summary, the same) parses as inert Markdown: no link, image or HTML from the folder
    report = (run / "gate" / "report.md").read_text(encoding="utf-8")
    assert summary.read_text(encoding="utf-8") == report
    assert inert_markdown.inert_problem(report, "") is None
    rendered = inert_markdown.parser().render(report)
    assert "<a " not in rendered and "<img" not in rendered and "https://evil.example" not in rendered
    assert re.search(r"[@\uff20][A-Za-z0-9_-]", report.replace("@\u2060", "")) is None  # no mention
    assert "vllm-project/vllm#\u20601" in report and "github[.]com/vllm-project" in report
    assert "www[.]evil.example" in report


def test_attack_hostile_text_through_the_pr_comment_stays_text(tmp_path):
    run = hostile_run(tmp_path)
    subprocess.run([sys.executable, "-I", "-m", "kvgate", "gate", str(run), "--today", "2026-12-02"],
                   capture_output=True, text=True, cwd=tmp_path, check=False)
    artifact = run / "gate"
    (artifact / "pull_request.json").write_text(json.dumps({"number": 7, "head_sha": HEAD}))
    env = {**os.environ, "GATE_DIR": str(artifact), "COMMENT_FILE": str(tmp_path / "comment.json"),
           "GITHUB_OUTPUT": str(tmp_path / "out"), "HEAD_SHA": HEAD, "RUN_CONCLUSION": "failure",
           "RUN_URL": "https://github.com/acme/vllm/actions/runs/9", "GITHUB_REPOSITORY": "acme/vllm"}
    comment = subprocess.run([sys.executable, "-I", str(ROOT / "ci" / "pr_comment.py")], capture_output=True, text=True,
                             env=env, cwd=tmp_path, check=False)
    assert comment.returncode == 0, comment.stderr
    body = json.loads((tmp_path / "comment.json").read_text())["body"]
    assert body.startswith("<!-- kvgate-gate-report -->\n")  # the comment's own marker, then nothing but inert
    assert inert_markdown.inert_problem(body.split("\n", 1)[1], "acme/vllm") is None
    links = re.findall(r'href="([^"]*)"', inert_markdown.parser().render(body))
    assert links == ["https://github.com/acme/vllm/actions/runs/9"]  # the run's own link, no other
    assert "<img" not in inert_markdown.parser().render(body)
    assert re.search(r"[@\uff20][A-Za-z0-9_-]", body) is None


def test_attack_an_artifacts_identity_values_cannot_issue_workflow_commands(tmp_path, capsys):
    """ci/gate_job.py names a folder holding another cell's cell.json by that cell's identity: its values are data."""
    gate_job = load_ci_script("gate_job")
    seed = synthetic_run.write_seed_run(tmp_path / "seed")
    artifact = tmp_path / "artifacts" / "kvgate-cell-flashinfer_mla-fp8-sm100" / "flashinfer_mla-fp8-sm100"
    artifact.parent.mkdir(parents=True)
    (artifact.parent / "run.json").write_text("{}")
    import shutil

    shutil.copytree(seed / "flashinfer_mla-auto-sm100", artifact)  # the auto cell's folder under the fp8 cell's name
    record = json.loads((artifact / "cell.json").read_text())
    (artifact / "cell.json").write_text(json.dumps({**record, "model": "m\n::error::forged,title=x"}))
    found = gate_job.assemble(tmp_path / "artifacts", tmp_path / "run", [{"cell": "flashinfer_mla-fp8-sm100"}])
    assert len(found.problems) == 1 and "\n::error::forged" in found.problems[0]  # the problem quotes it whole
    print(gate_job.workflow_command("warning", found.problems[0]))
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("::warning::artifact kvgate-cell-flashinfer_mla-fp8-sm100: ")
    assert "%0A%3A%3Aerror%3A%3Aforged" in out


def test_attack_a_cell_folders_name_in_a_logs_link_stays_text(tmp_path):
    """A broken stage's first error links its log by its path, which starts with the cell folder's name (free: the
    identity is cell.json's): the name is the link's text, escaped, and its address, encoded, never Markdown."""
    run = synthetic_run.write_seed_run(tmp_path / "run", contract="1.6")
    name = "x`) @octocat <b>bold<b> [l](https:evil.example) | y"
    (run / "flashinfer_mla-fp8-sm100").rename(run / name)
    status = json.loads((run / name / "status.json").read_text())
    status["throughput"] = {"status": "error", "reason": "boom", "log_tail": "RuntimeError: CUDA error: bad"}
    (run / name / "status.json").write_text(json.dumps(status))
    assert main(["gate", str(run), "--today", "2026-12-02"]) == 1
    report = (run / "gate" / "report.md").read_text(encoding="utf-8")
    line = next(line for line in report.splitlines() if line.startswith("  - first error: "))
    print(line)
    rendered = inert_markdown.parser().render(report)
    links = re.findall(r'<a href="([^"]*)"', rendered)
    assert links == ["../x%60%29%20%40octocat%20%3Cb%3Ebold%3Cb%3E%20%5Bl%5D%28https%3Aevil.example%29%20%7C%20y/"
                     "status.json"]  # the log's own link, and no other
    assert "<b>" not in rendered
    assert re.search(r"[@\uff20][A-Za-z0-9_-]", line.split("](", 1)[0].replace("@\u2060", "")) is None  # no mention


def test_attack_a_filter_name_that_scored_zero_stays_text(tmp_path):
    """lm-eval's results name their filters (`exact_match,<filter>`): a filter the policy does not judge is reported,
    and one that answered nothing right is listed under Needs attention by its name, which is the folder's text."""
    run = synthetic_run.write_seed_run(tmp_path / "run", contract="1.6")
    hostile = "x](https:evil.example) @octocat <b>b<b> | y"
    for cell in ("flashinfer_mla-fp8-sm100", "flashinfer_mla-auto-sm100"):
        results = next((run / cell / "accuracy").rglob("results_*.json"))
        record = json.loads(results.read_text())
        block = next(iter(record["results"].values()))
        block[f"exact_match,{hostile}"], block[f"exact_match_stderr,{hostile}"] = 0.0, 0.0
        results.write_text(json.dumps(record))
        samples = next((run / cell / "accuracy").rglob("samples_*.jsonl"))
        lines = samples.read_text().splitlines()
        zeros = [json.dumps({**json.loads(line), "filter": hostile, "exact_match": 0.0}) for line in lines
                 if json.loads(line)["filter"] == "strict-match"]
        samples.write_text("\n".join([*lines, *zeros]) + "\n")
    assert main(["gate", str(run), "--today", "2026-12-02"]) == 0
    report = (run / "gate" / "report.md").read_text(encoding="utf-8")
    silent = [line for line in report.splitlines() if "no question answered right" in line]
    print("\n".join(silent))
    assert len(silent) == 2
    assert inert_markdown.inert_problem(report, "") is None
    rendered = inert_markdown.parser().render(report)
    assert "<b>" not in rendered and "<a " not in rendered
    assert re.search(r"[@\uff20][A-Za-z0-9_-]", report.replace("@\u2060", "")) is None  # no mention
