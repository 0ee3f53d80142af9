"""One vocabulary of totals (kvgate.gate.verdict.Totals), said alike by every output: the headline ("N of M checks
failed"), the badges of report.md and report.html, the grid, verdict.json's summary and junit.xml. Each output is read
back here on its own terms (Markdown text, HTML, JSON, JUnit XML) and held against the others, on a real H200 run, the
seed run failing, a shipped CPU canary run and a generated A/B run of 48 cells. Also: the headline is a commit
status's description (at most 140 characters) naming the first failing cell and check, whatever the inputs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from junitparser import JUnitXml

import archives
from kvgate.cli import main
from kvgate.gate.rerun import rerun_command, vllm_specs
from kvgate.gate.verdict import Check, Verdict
from kvgate.report import render_all
from kvgate.report.markdown import STATUS_LIMIT, headline, status_description
from synthetic_run import ab_run_axes, write_ab_run, write_kernels, write_seed_run
from test_fp8_kv_cache_check import TODAY, gate_cli, h200_matrix, h200_unpacked  # noqa: F401 (fixtures)

CANARIES = Path(__file__).parent / "fixtures" / "canaries" / "ci-canaries.tar.xz"
LABELS = {"FAIL": "fail", "ERROR": "error", "MISSING": "missing", "WAIVED": "waived", "PASS": "pass", "RAN": "ran",
          "SKIPPED": "skipped", "NOT RUN": "not_run", "INFO": "info"}


@pytest.fixture(scope="module")
def gate_outputs(tmp_path_factory, h200_unpacked, h200_matrix) -> dict[str, Path]:  # noqa: F811
    root = tmp_path_factory.mktemp("totals")
    outs = {}
    assert gate_cli(h200_unpacked, h200_matrix, root / "h200") == 1
    outs["h200"] = root / "h200"
    failing = write_seed_run(root / "seed", fp8_drop_points=7.1)
    write_kernels(failing / "flashinfer_mla-auto-sm100", passed=0, skipped=3)
    ab = write_ab_run(root / "ab", ab_run_axes(48, ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")),
                      head_drop={"triton_attn-fp8-sm120": 30})
    archives.extract(CANARIES, root / "canaries")
    for name, run in (("seed", failing), ("ab-48", ab), ("canary", root / "canaries" / "fp8-scale-mismatch"),
                      ("harmless", root / "canaries" / "harmless-refactor")):
        assert main(["gate", str(run), "--out", str(root / name), "--today", TODAY]) in (0, 1)
        outs[name] = root / name
    return outs


@pytest.mark.parametrize("name", ["h200", "seed", "ab-48", "canary", "harmless"])
def test_every_output_states_the_same_totals(gate_outputs, name):
    out = gate_outputs[name]
    summary = json.loads((out / "verdict.json").read_text(encoding="utf-8"))["summary"]
    words = {w: summary[w] for w in LABELS.values()}
    report = (out / "report.md").read_text(encoding="utf-8").splitlines()
    print(summary, report[0], report[4], sep="\n")
    # the headline: failed of checks, or all checks passed; never the stages that ran unjudged as checks
    failed = re.match(r"❌ kvgate: (\d+) of (\d+) checks failed — ", report[0])
    if failed:
        assert (int(failed[1]), int(failed[2])) == (summary["failed"], summary["checks"])
    else:
        assert summary["failed"] == 0 and f" {summary['checks']} check" in report[0]
    assert summary["checks"] == sum(words[w] for w in ("fail", "error", "missing", "waived", "pass"))
    assert summary["failed"] == words["fail"] + words["error"] + words["missing"]
    assert summary["stages_ran"] == words["ran"]
    assert summary["entries"] == sum(words.values())
    # report.md's badges, and the sentence after them
    badges = dict((LABELS[label], int(n)) for label, n in re.findall(r"(FAIL|ERROR|MISSING|WAIVED|PASS|RAN|SKIPPED|"
                                                                     r"NOT RUN|INFO) (\d+)", report[4].split(" — ")[0]))
    assert badges == {w: n for w, n in words.items() if n}
    assert report[4].split(" — ")[1].startswith(f"{summary['failed']} of {summary['checks']} check")
    # report.html's badges: the same words, never PASS for what ran unjudged
    page = (out / "report.html").read_text(encoding="utf-8")
    head = page.split('<section id="needs-attention">')[0].split('<div class="ctx">')[1]
    html_badges = dict((LABELS[label], int(n)) for label, n in re.findall(
        r'<span class="badge" style="background:#[0-9a-f]+">(FAIL|ERROR|MISSING|WAIVED|PASS|RAN|SKIPPED|NOT RUN|INFO) '
        r"(\d+)</span>", head))
    assert html_badges == badges
    # the grid: its cells that need attention are those with a failing check; its cards hold every cell once
    grid = page.split('<section id="grid">')[1].split("</section>")[0]
    table = dict(re.findall(r'<td class="grid-entry" data-cell="([^"]+)" data-word="([a-z_]+)"', grid))
    cards = dict(re.findall(r'<li class="grid-entry" data-cell="([^"]+)" data-word="([a-z_]+)"', grid))
    assert table == cards
    checks = json.loads((out / "verdict.json").read_text(encoding="utf-8"))["checks"]
    failing_cells = {c["cell"] for c in checks if c["word"] in ("fail", "error", "missing") and c["cell"] in table}
    assert {cell for cell, word in table.items() if word in ("fail", "error", "missing")} == failing_cells
    assert f"{len(table)} cells, {len(failing_cells)} needing attention" in grid
    # junit.xml: one case per check (a kernels check with tests: one per test), in its word's outcome
    xml = JUnitXml.fromfile(str(out / "junit.xml"))
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (
        summary["junit_tests"], summary["junit_failures"], summary["junit_errors"], summary["junit_skipped"])
    outcomes = [outcome for check in checks for outcome in junit_cases(check)]
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (
        len(outcomes), outcomes.count("failure"), outcomes.count("error"), outcomes.count("skipped"))


WORD_OUTCOME = {"fail": "failure", "error": "error", "missing": "error", "pass": "passed", "waived": "skipped",
                "ran": "skipped", "skipped": "skipped", "not_run": "skipped", "info": "skipped"}
TEST_OUTCOME = {"passed": "passed", "failed": "failure", "error": "error", "skipped": "skipped"}


def junit_cases(check: dict) -> list[str]:
    """The outcomes of the cases junit.xml writes for a check of verdict.json: its word's, or its kernel tests' (a
    waived check's failed tests skipped; a failing check whose tests did not fail stays one case, never a pass)."""
    tests = check.get("tests") or []
    failing = any(t["outcome"] in ("failed", "error") for t in tests)
    if not tests or (check["word"] in ("fail", "error", "missing") and not failing):
        return [WORD_OUTCOME[check["word"]]]
    return ["skipped" if check["word"] == "waived" and t["outcome"] in ("failed", "error") else TEST_OUTCOME[t["outcome"]]
            for t in tests]

def test_the_totals_catch_a_disagreement(gate_outputs, tmp_path):
    """The test above can fail: an output that counts a stage that ran unjudged as a pass (what report.html did) is
    caught by it."""
    out = Path(shutil.copytree(gate_outputs["seed"], tmp_path / "seed"))
    page = (out / "report.html").read_text(encoding="utf-8")
    (out / "report.html").write_text(page.replace(">PASS 2</span>", ">PASS 6</span>", 1), encoding="utf-8")
    gate_outputs = {**gate_outputs, "seed": out}
    with pytest.raises(AssertionError):
        test_every_output_states_the_same_totals(gate_outputs, "seed")


# ---------------------------------------------------------------------------------------------- the status line

def _verdict(checks: list[Check], run_info: dict | None = None) -> Verdict:
    return Verdict(checks=tuple(checks), run="r", baseline=None, today=TODAY, multiplicity={}, run_info=run_info or {})


@pytest.mark.parametrize("detail", ["x", "drop 7.1 pts, lower bound 5.0 > margin 3.0 (p<0.001)", "y" * 5000,
                                    "a: b; c, " * 200, "ünïcødé 🚀 " * 80])
@pytest.mark.parametrize("cell", ["flashmla-fp8-sm90", "flashinfer_mla-fp8_e4m3-sm100",
                                  "a_very_long_backend_name_of_a_hostile_matrix-fp8_e4m3-sm120"])
def test_the_status_description_fits_140_characters_and_names_the_first_failing_cell_and_check(detail, cell):
    checks = [Check(cell=cell, kind="fp8_accuracy", subject="strict-match", status="fail", detail=detail,
                    threshold={"margin_points": 3.0}),
              *[Check(cell=f"b{i}-auto-sm90", kind="throughput", status="error", detail=detail) for i in range(150)]]
    verdict = _verdict(checks)
    line = headline(verdict)
    assert len(line) <= STATUS_LIMIT and len(status_description(verdict)) <= STATUS_LIMIT
    assert line.startswith(f"❌ kvgate: 151 of 151 checks failed — {cell} fp8_accuracy [strict-match]")
    assert line.endswith(" (+150 more)")
    assert status_description(verdict) == line.removeprefix("❌ ")
    record = json.loads(render_all(verdict)["verdict.json"])
    assert record["status_description"] == status_description(verdict)


def test_a_passing_or_neutral_headline_fits_too():
    checks = [Check(cell=f"cell{i}-fp8-sm90", kind="accuracy_floor", status="pass", threshold={"floor": 0.5})
              for i in range(300)]
    host = [Check(cell=f"cpu_attn{i}-fp8-cpu", kind="host", status="not_run",
                  headline="not run on this host: needs a CPU with AVX-512 or AMX " * 3) for i in range(40)]
    for verdict in (_verdict(checks), _verdict([*checks, *host])):
        assert len(headline(verdict)) <= STATUS_LIMIT, headline(verdict)
    assert headline(_verdict([*checks, *host])).startswith("⚪ kvgate: NEUTRAL — 300 checks passed, but cpu_attn0-fp8-cpu")


# ---------------------------------------------------------------------------------------------- the rerun command

@pytest.mark.parametrize(("run_info", "expected"), [
    ({}, "nox -s 'cell(flashmla-fp8-sm90)' -- --stages accuracy"),
    ({"versions": {"vllm": "0.26.0"}}, "nox -s 'cell(flashmla-fp8-sm90)' -- --stages accuracy --vllm release:0.26.0"),
    ({"versions": {"vllm": "0.26.0"}, "vllm_under_test": {"head": {"spec": "patch:/w/my change.diff"},
                                                          "base": {"spec": "release"}}},
     "nox -s 'cell(flashmla-fp8-sm90)' -- --stages accuracy --vllm 'patch:/w/my change.diff' --base-vllm release"),
    ({"vllm_under_test": {"head": {"spec": "source:/w/vllm@abc'; rm -rf /"}}},
     "nox -s 'cell(flashmla-fp8-sm90)' -- --stages accuracy --vllm 'source:/w/vllm@abc'\"'\"'; rm -rf /'"),
    ({"vllm_under_test": {"head": {"spec": "x" * 5000}}, "versions": {"vllm": 7}},
     "nox -s 'cell(flashmla-fp8-sm90)' -- --stages accuracy"),
])
def test_the_rerun_command_takes_the_runs_own_vllm_specs_quoted(run_info, expected):
    check = Check(cell="flashmla-fp8-sm90", kind="fp8_accuracy", status="fail")
    assert rerun_command(check, run_info) == expected
    assert vllm_specs(run_info)[0] is None or expected.count("--vllm ") == 1


def test_a_check_of_the_whole_run_has_no_rerun_command():
    assert rerun_command(Check(cell="(run)", kind="baseline", status="missing"), {}) is None
    assert rerun_command(Check(cell="flashmla-fp8-sm90", kind="cell", status="missing"), {}) == (
        "nox -s 'cell(flashmla-fp8-sm90)'")  # a missing cell: every stage of it
