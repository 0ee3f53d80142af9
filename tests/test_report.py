"""Reports of a verdict: verdict.json (versioned), report.md, report.html (self-contained), junit.xml."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from junitparser import JUnitXml

from kvgate import InputError
from kvgate.gate import evaluation as gate
from kvgate.gate import policy as policy_module
from kvgate.gate.verdict import VERDICT_VERSION, Verdict, check_version
from kvgate.matrix import cells as matrix_module
from kvgate.report import headline, render_all, write_all
from kvgate.report.words import COLOR, FAIL
from kvgate.results.run_loader import KnownNames, load_run
from synthetic_run import AB_DTYPES, ab_run_axes, write_ab_run, write_kernels, write_seed_run

MATRIX = matrix_module.load()
POLICY = policy_module.load(matrix=MATRIX)


def verdict_of(run: Path, today: dt.date = dt.date(2026, 11, 30)) -> Verdict:
    return gate.evaluate(load_run(run, KnownNames.from_matrix(MATRIX)), policy=POLICY, waiver_for=MATRIX.waiver_for,
                         today=today)


@pytest.fixture(scope="module")
def failing(tmp_path_factory) -> Verdict:
    run = write_seed_run(tmp_path_factory.mktemp("r") / "run", fp8_drop_points=7.1)
    write_kernels(run / "flashinfer_mla-auto-sm100", passed=0, skipped=3)
    return verdict_of(run)


def test_verdict_json_is_versioned_and_complete(failing):
    data = json.loads(render_all(failing)["verdict.json"])
    assert data["verdict_version"] == VERDICT_VERSION
    # checks (judged against a threshold): the 2 kernels checks, the auto cell's accuracy floor and the FP8 cell's
    # strict-match comparison = 4 (one decision per cell: flexible-extract is info, beside the fp8/auto throughput
    # ratio); the 4 accuracy and throughput stages ran with nothing to judge them (RAN: no floor on the FP8 cell, no
    # baseline), never counted as passes
    assert data["summary"] == {"checks": 4, "failed": 2, "stages_ran": 3, "not_judged": 8, "entries": 15,
                               "fail": 2, "error": 0, "missing": 0, "waived": 0, "pass": 2, "ran": 3, "skipped": 0,
                               "not_run": 4, "info": 4,  # not_run: 2 stages + no baseline + the FP8 cell's
                               # fp8_kv_cache (synthetic results of contract 1, written before the KV cache evidence);
                               # info: the other filter, the throughput ratio, the contract note (results before
                               # 1.6) and the broken FP8 cell's speed
                               "junit_tests": 18, "junit_failures": 2, "junit_errors": 0, "junit_skipped": 11}
    assert data["exit_status"] == 1 and data["passed"] is False
    assert {c["status"] for c in data["checks"]} <= {"pass", "fail", "waived", "missing", "error", "not_run", "info"}
    for check in data["checks"]:
        assert set(check) >= {"cell", "kind", "status", "figures", "threshold", "p_value", "interval", "detail"}


def test_a_verdict_of_a_newer_major_version_is_refused():
    check_version({"verdict_version": "1.7"}, "v.json")
    with pytest.raises(InputError) as error:
        check_version({"verdict_version": "2.0"}, "v.json")
    assert str(error.value) == f"v.json: verdict version 2.0 is newer than this kvgate reads ({VERDICT_VERSION}) in verdict_version. Upgrade kvgate"


def test_markdown_leads_with_the_worst_failure_and_lists_what_needs_attention(failing):
    text = render_all(failing)["report.md"].decode()
    lines = text.splitlines()
    print(text)
    # of the 8 judged checks, the 4 stages that ran with nothing to judge them (both accuracy stages, both throughput
    # stages without a baseline) read RAN and are not counted as checks; the 2 kernel checks, the auto cell's floor
    # and the comparison are
    assert lines[0] == ("❌ kvgate: 2 of 4 checks failed — flashinfer_mla-fp8-sm100 fp8_accuracy [strict-match] "
                        "drop 7.1 pts, lower bound 5.0 > margin 3.0 … (+1 more)")  # a commit status's 140 characters
    assert len(lines[0]) <= 140
    # the FP8 cell's throughput is the speed of a broken cell (its comparison failed): info, not RAN
    assert lines[4] == ("❌ FAIL 2 · ✅ PASS 2 · ▶️ RAN 3 · ➖ NOT RUN 4 · ℹ️ INFO 4 — 2 of 4 checks failed; 3 stages ran "  # noqa: RUF001
                        "with nothing to judge them; 8 not judged (skipped, not run or info)")
    attention = text.split("### Needs attention (2)\n\n")[1].split("\n\n")[0].splitlines()
    # each failure, then the command that reruns its cell alone (the run names no vLLM: the engine's release)
    assert attention == ["- ❌ FAIL `flashinfer_mla-auto-sm100` kernels: 0 kernel tests ran (3 skipped of 3); the "
                         "policy needs at least 1",
                         "  - rerun this cell: `nox -s 'cell(flashinfer_mla-auto-sm100)' -- --stages kernels`",
                         "- ❌ FAIL `flashinfer_mla-fp8-sm100` fp8_accuracy [strict-match]: drop 7.1 pts, lower bound "
                         "5.0 > margin 3.0 (p<0.001)",
                         "  - rerun this cell: `nox -s 'cell(flashinfer_mla-fp8-sm100)' -- --stages accuracy`"]
    # the throughput family had no check (no baseline): the line says nothing of it, never "the run's 0 ... checks"
    size = failing.multiplicity["accuracy"]["family_size"]
    tested = f"{size} accuracy checks each at" if size != 1 else "1 accuracy check at"
    assert (f"- Multiplicity: the run's {tested} alpha 0.01, no adjustment: each is a test against its margin "
            "(matrix/policy.toml states the run-level false alarms this buys).") in lines
    assert failing.multiplicity["throughput"]["family_size"] == 0 and "throughput check" not in text


def test_a_waived_run_says_so_in_its_first_line(tmp_path):
    run = write_seed_run(tmp_path / "run", backend="FLASHINFER", arch="sm120")
    # the waiver covers the FP8 cell's 4 judged checks; of the auto cell's 3, its accuracy and throughput stages ran
    # with nothing to judge them (no floor, no baseline): RAN, not passed
    # (the 2 stages that ran unjudged are left to the totals line: the whole would not fit a commit status)
    assert headline(verdict_of(run)) == ("⚪ kvgate: NEUTRAL — 5 checks passed (4 waived), but the change was compared "
                                         "with nothing (no base side, no --baseline)")


def test_html_is_self_contained_with_both_plots(failing):
    page = render_all(failing)["report.html"].decode()
    assert page.count('<svg class="plot"') == 3  # accuracy per cell, paired drops, throughput ratios
    assert "<script" not in page
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page)  # nothing fetched from the network
    assert "flashinfer_mla-fp8-sm100 · strict-match" in page


def test_html_fits_any_width_and_leads_with_what_needs_attention(failing):
    """The page scales to a phone (tests/test_report_browser.py measures it in a real browser): a viewport, plots as
    wide as the page; the failing checks with their reasons come before the plots; one colour per status word."""
    page = render_all(failing)["report.html"].decode()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert re.findall(r"<svg class=\"plot\"[^>]*width=\"([^\"]+)\"", page) == ["100%"] * 3
    attention = page.split('<section id="needs-attention">')[1].split("</section>")[0]
    assert attention.index("flashinfer_mla-auto-sm100</code> kernels: 0 kernel tests ran") < attention.index(
        "flashinfer_mla-fp8-sm100</code> fp8_accuracy [strict-match]: drop 7.1 pts")
    assert page.index("needs-attention") < page.index('aria-label="accuracy per cell"')
    # the FP8 cell's accuracy stage ran well: its dots are not the colour of FAIL (its drop, judged apart, is)
    accuracy = page.split('aria-label="accuracy per cell"')[1].split("</svg>")[0]
    drops = page.split('aria-label="accuracy drops"')[1].split("</svg>")[0]
    assert COLOR[FAIL] not in accuracy and COLOR[FAIL] in drops
    assert "margin 3</text>" in drops and "accuracy drop, points" in drops  # the margin labelled, an axis title
    legend = page.split('<div class="legend"')[1].split("</div>")[0]
    assert f'fill="{COLOR[FAIL]}"/></svg><b>FAIL</b>' in legend
    # nothing was adjusted for multiplicity: the checks table says "p", as report.md does
    assert "<th>threshold</th><th>p</th></tr>" in page and "p (adj.)" not in page


def test_the_checks_table_says_adjusted_only_where_a_family_was(tmp_path):
    text = policy_module.default_policy_path().read_text().replace('multiplicity = "none"', 'multiplicity = "bh"', 1)
    (tmp_path / "policy.toml").write_text(text)
    policy = policy_module.load(tmp_path / "policy.toml", matrix=MATRIX)
    run = write_seed_run(tmp_path / "run", fp8_drop_points=7.1)
    verdict = gate.evaluate(load_run(run, KnownNames.from_matrix(MATRIX)), policy=policy,
                            waiver_for=MATRIX.waiver_for, today=dt.date(2026, 11, 30))
    rendered = render_all(verdict)
    assert "<th>threshold</th><th>p (adj.)</th></tr>" in rendered["report.html"].decode()
    assert "| threshold | p (adj.) |" in rendered["report.md"].decode()
    assert re.search(r"the run's \d+ accuracy p-values? adjusted together with", rendered["report.md"].decode())


def test_a_throughput_regression_names_its_kind_once(tmp_path):
    """The headline prints the check's kind, then the check's own words: "throughput ratio …", not "throughput
    throughput ratio …"."""
    axes = ab_run_axes(2, MATRIX.backends)
    slow = "-".join((axes[1][0].lower(), *axes[1][1:]))
    results = load_run(write_ab_run(tmp_path / "run", axes, slower={slow: 0.8}),
                       KnownNames(backends=tuple(MATRIX.backends), kv_cache_dtypes=AB_DTYPES,
                                  archs=tuple(MATRIX.archs)))
    verdict = gate.evaluate(results.side("head"), baseline=results.side("base"), ab=True, policy=POLICY,
                            waiver_for=MATRIX.waiver_for, today=dt.date(2026, 11, 30))
    report = render_all(verdict)["report.md"].decode()
    print(report)
    first = report.splitlines()[0]
    assert first.startswith("❌ kvgate: 1 of ") and first.endswith(
        f" checks failed — {slow} throughput ratio 0.800, upper bound 0.800 < 0.95 vs base side (p<0.001)")
    assert "throughput throughput" not in report
    assert "the run's 2 throughput checks each at alpha 0.05" in report


def test_junit_has_one_case_per_check_with_figures_in_the_message(failing, tmp_path):
    (tmp_path / "junit.xml").write_bytes(render_all(failing)["junit.xml"])
    xml = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    cases = [case for suite in xml for case in suite]
    # one case per check, except the FP8 cell's passing kernels check: its 4 pytest tests, one case each
    assert len(cases) == len(failing.checks) - 1 + 4 == 18
    assert [c.name for c in cases if c.classname == "kvgate.kernels.flashinfer_mla-fp8-sm100"] == [
        "tests.kernels.test_decode::test_decode[0]", "tests.kernels.test_decode::test_decode[1]",
        "tests.kernels.test_decode::test_decode[2]", "tests.kernels.test_decode::test_decode[3]"]
    # skipped: 4 RAN (stages with nothing to judge them) + 4 not run (the baseline check and the FP8 cell's
    # fp8_kv_cache among them) + 3 info (one the contract): the verdict's totals
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (18, 2, 0, 11)
    kernels = next(c for c in cases if c.classname == "kvgate.kernels" and c.name == "flashinfer_mla-auto-sm100")
    assert kernels.result[0].message == ("FAIL: 0 kernel tests ran (3 skipped of 3); the policy needs at least 1 | "
                                         "threshold 0 failed, 0 errors | rerun: nox -s 'cell(flashinfer_mla-auto-sm100)' "
                                         "-- --stages kernels")


def test_outputs_replace_only_their_own_files(failing, tmp_path):
    out = tmp_path / "gate"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "report.md").write_text("old")
    paths = write_all(failing, out)
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "notes.txt", "report.html", "report.md", "verdict.json"]
    assert (out / "notes.txt").read_text() == "mine"
    assert paths["report.md"].read_text().startswith("❌ kvgate")
    # readable by every user: an artifact uploader that runs as another user must read them (mkstemp makes 0600)
    assert {name: oct(path.stat().st_mode & 0o777) for name, path in paths.items()} == dict.fromkeys(paths, "0o644")


def test_a_run_where_nothing_ran_says_so(tmp_path):
    from synthetic_run import write_cell

    run = tmp_path / "run"
    write_cell(run, backend="FLASHINFER_MLA", kv_cache_dtype="auto", arch="sm100")
    verdict = verdict_of(run)
    assert verdict.exit_status == 0  # docs/results-folder.md: stages never requested fail only with --require
    assert headline(verdict) == ("⚠️ kvgate: nothing was checked (4 stages not run); pass --require to make missing "
                                 "stages fail")


def test_text_of_the_folder_that_xml_and_utf8_cannot_hold_is_escaped_and_the_report_written(tmp_path):
    """A failed stage's reason with a control character (BEL), a cell folder named with one, and a folder name that is
    not UTF-8 (it reads with a lone surrogate): every output is written, junit.xml parses, the characters escaped."""
    import os

    from kvgate.cli import main

    run = write_seed_run(tmp_path / "run")
    fp8 = next(p for p in run.iterdir() if p.name.endswith("-fp8-sm100"))
    (fp8 / "status.json").write_text(json.dumps({"throughput": {"status": "error",
                                                                "reason": "vllm bench exited \u0007with status 1"}}))
    (run / "bell\u0007cell").mkdir()
    (run / "bell\u0007cell" / "status.json").write_text("{}")
    os.mkdir(os.fsencode(run) + b"/latin\xe9")
    (run / os.fsdecode(b"latin\xe9") / "status.json").write_text("{}")
    assert main(["gate", str(run), "--out", str(tmp_path / "gate")]) == 1
    verdict = json.loads((tmp_path / "gate" / "verdict.json").read_text(encoding="utf-8"))
    assert {"bell\u0007cell", "latin\udce9"} <= {check["cell"] for check in verdict["checks"]}
    junit = (tmp_path / "gate" / "junit.xml").read_text(encoding="utf-8")
    assert "exited \\x07with status 1" in junit and "bell\\x07cell" in junit and "latin\\udce9" in junit
    JUnitXml.fromfile(str(tmp_path / "gate" / "junit.xml"))
    for name in ("report.md", "report.html"):
        (tmp_path / "gate" / name).read_text(encoding="utf-8")
