"""The report's first screen (kvgate.report.grid, kvgate.report.words) and its size at any scale.

Runs are written by tests/synthetic_run.py (A/B runs of 2, 52 and 256 cells, a few regressions planted) or are the
real H200 run of tests/fixtures/h200_run; each is judged by the gate and rendered, and the PR comment is made from
its report.md by ci/pr_comment.py, as kvgate-comment.yml does.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

import archives
import h200_matrix
from ci_scripts import load_ci_script
from kvgate.gate import evaluation as gate
from kvgate.gate import policy as policy_module
from kvgate.gate.verdict import Check, Verdict
from kvgate.matrix import cells as matrix_module
from kvgate.report import grid, render_all, words
from kvgate.results.run_loader import KnownNames, load_run
from synthetic_run import AB_DTYPES, ab_run_axes, write_ab_run, write_seed_run

pr_comment = load_ci_script("pr_comment")

MATRIX = matrix_module.load()
POLICY = policy_module.load(matrix=MATRIX)
# the matrix's backends and five more, so that 16 backends x 4 dtypes x 4 archs make 256 cells
BACKENDS = (*MATRIX.backends, "SYNTH_A", "SYNTH_B", "SYNTH_C", "SYNTH_D", "SYNTH_E")
KNOWN = KnownNames(backends=BACKENDS, kv_cache_dtypes=AB_DTYPES, archs=tuple(MATRIX.archs))
GITHUB_COMMENT_LIMIT = 65_536
STEP_SUMMARY_LIMIT = 1024 * 1024
RUN_URL = "https://github.com/acme/vllm/actions/runs/7"


def judge_ab(run: Path) -> Verdict:
    """As `kvgate gate` judges an A/B run: the head side against the base side."""
    results = load_run(run, KNOWN)
    assert results.has_base_side
    return gate.evaluate(results.side("head"), baseline=results.side("base"), ab=True, policy=POLICY,
                         waiver_for=MATRIX.waiver_for, today=dt.date(2026, 11, 30))


def planted_ab_run(run: Path, cells: int) -> tuple[Path, list[str]]:
    """An A/B run of `cells` cells with regressions planted: the last cell's head loses 30 answers, a middle one's
    too, and the second cell's head runs at 0.8x its base's throughput."""
    axes = ab_run_axes(cells, BACKENDS)
    ids = [f"{b.lower()}-{d}-{a}" for b, d, a in axes]
    write_ab_run(run, axes, head_drop={ids[-1]: 30, ids[len(ids) // 2]: 30}, slower={ids[1]: 0.8})
    return run, ids


def table_rows_are_whole(text: str) -> list[str]:
    """Every line of every Markdown table of `text` that is not whole: as many cells as its header row."""
    broken = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.startswith("|")]
        if not lines:
            continue
        width = len(re.findall(r"(?<!\\)\|", lines[0]))
        broken += [line for line in lines if not line.endswith("|") or len(re.findall(r"(?<!\\)\|", line)) != width]
    return broken


def test_each_word_has_one_label_and_one_colour():
    assert len(set(words.LABEL.values())) == len(words.ORDER) == len(set(words.COLOR.values()))
    assert set(words.LABEL) == set(words.COLOR) == set(words.ICON) == set(words.MEANING) == set(words.ORDER)
    assert [words.LABEL[w] for w in ("ran", "skipped", "not_run", "pass", "fail", "error", "waived")] == [
        "RAN", "SKIPPED", "NOT RUN", "PASS", "FAIL", "ERROR", "WAIVED"]


def test_a_pass_with_nothing_to_judge_reads_ran():
    stage = Check(cell="a-auto-sm90", kind="accuracy", status="pass", figures={"strict-match": 0.0})
    kernels = Check(cell="a-auto-sm90", kind="kernels", status="pass", threshold={"failed": 0})
    host = Check(cell="a-fp8-sm90", kind="host", status="not_run")
    assert [words.word_of(c) for c in (stage, kernels, host)] == ["ran", "pass", "skipped"]
    assert words.worst(["ran", "pass", "info"]) == "pass" and words.worst(["ran", "not_run"]) == "ran"


def test_the_seed_case_reads_in_its_own_terms(tmp_path):
    run = write_seed_run(tmp_path / "run", fp8_drop_points=7.1)
    verdict = gate.evaluate(load_run(run, KnownNames.from_matrix(MATRIX)), policy=POLICY,
                            waiver_for=MATRIX.waiver_for, today=dt.date(2026, 11, 30))
    (sm100,) = grid.build(verdict)
    assert (sm100.arch, sm100.columns, [r.backend for r in sm100.rows]) == ("sm100", ("auto", "fp8"),
                                                                            ["flashinfer_mla"])
    auto, fp8 = sm100.rows[0].entries["auto"], sm100.rows[0].entries["fp8"]
    print(auto, fp8, sep="\n")
    assert auto.word == "pass" and fp8.word == "fail"
    assert round(auto.accuracy["strict-match"], 4) == 0.6444 and round(auto.accuracy["flexible-extract"], 4) == 0.652
    (change,) = fp8.accuracy_changes
    assert (change.reference, round(change.value, 1), change.word) == ("auto", -7.1, "fail")
    assert change.bounds[1] < -3.0  # the upper bound of the change is below -margin: the drop is past it
    assert round(fp8.requests_per_second, 2) == 3.55 and round(fp8.throughput_changes[0].value, 3) == round(3.55 / 3.22, 3)
    assert fp8.reason.startswith("drop 7.1 pts")
    text = render_all(verdict)["report.md"].decode()
    assert "| `flashinfer_mla` | ✅ PASS<br>0.644 / 0.652<br>" in text
    assert "❌ FAIL<br>0.573 / 0.581<br>Δauto -7.1 [" in text


def test_an_accuracy_of_zero_that_no_check_failed_needs_attention(tmp_path):
    # a model without an expected accuracy, so no floor: auto and FP8 alike answer nothing, and FP8 vs auto passes
    run = write_ab_run(tmp_path / "run", ab_run_axes(2, BACKENDS), n=1319, model="acme/untrained", right=0)
    verdict = judge_ab(run)
    assert verdict.passed  # the gate's decision: nothing failed
    assert render_all(verdict)["report.md"].decode().splitlines()[0] == (
        # the cells that answered nothing right, by name, within a commit status's 140 characters (the stages that
        # ran unjudged are left to the totals line)
        "✅ kvgate: all 8 checks passed; flashinfer_mla-auto-sm80, flashinfer_mla-fp8-sm80 scored 0, and no check "
        "held them")
    entries = [e for g in grid.build(verdict) for r in g.rows for e in r.entries.values()]
    assert [e.zero_filters for e in entries] == [("strict-match", "flexible-extract")] * 2
    assert [e.word for e in entries] == ["ran", "ran"]  # never PASS: comparisons of nothing with nothing
    text = render_all(verdict)["report.md"].decode()
    print(text[:3000])
    attention = text.split("### Needs attention (2)\n\n")[1].split("\n\n")[0].splitlines()
    assert len(attention) == 2
    assert attention[0] == ("- ▶️ RAN `flashinfer_mla-auto-sm80` accuracy: strict-match and flexible-extract 0.0000, no "
                            "question answered right, and no check failed it (no accuracy floor holds this workload)")
    assert "0.000 / 0.000 (nothing right)" in text
    assert not re.search(r"PASS[^|]*\| accuracy \|", text)  # the accuracy stage itself reads RAN, never PASS


@pytest.fixture(scope="module")
def h200_report(tmp_path_factory) -> str:
    from test_fp8_kv_cache_check import H200_ARCHIVE, gate_cli

    folder = tmp_path_factory.mktemp("h200")
    archives.extract(H200_ARCHIVE, folder)
    matrix = h200_matrix.matrix_folder(folder / "matrix", h200_matrix.local_mla_model)
    assert gate_cli(folder / "run", matrix, folder / "out") == 1
    return (folder / "out" / "report.md").read_text()


def test_the_h200_report_opens_with_its_grid(h200_report):
    first_screen = h200_report.split("### Needs attention")[0]
    print(first_screen)
    lines = first_screen.splitlines()
    # one line of headline: the first failure in its own few words, not five lines of test node IDs
    # the kernel tests failed (FLASHMLA's FP8 decode outside tolerance): a FAIL, with the first test's own figures
    assert lines[0] == ("❌ kvgate: 5 of 45 checks failed — flashmla-fp8-sm90 kernels 4 of 10 tests failed, first 21 of "
                        "57344 elements outside atol=0.02 … (+4 more)")
    assert lines[8] == "| **sm90** | `auto` | `fp8` | `fp8_e5m2` |"
    rows = [line.split(" | ")[0] for line in lines[10:]]
    assert rows[:8] == ["| `flash_attn`", "| `flash_attn_mla`", "| `flashinfer`", "| `flashmla`",
                        "| `flex_attention`", "| `triton_attn`", "| `triton_mla`", ""]
    assert len(lines) <= 18  # headline, context, counts, legend, the grid: one screen
    assert ("| `triton_attn` | ✅ PASS<br>0.854 / 0.854<br>79.06 req/s, 10,120 tok/s | ✅ PASS<br>0.846 / 0.846<br>"
            "Δauto -0.8 [-3.8, +1.9]<br>55.43 req/s, 7,095 tok/s, x0.70 auto | ⚠️ WAIVED |") in first_screen
    assert "| `flashmla` | ✅ PASS<br>0.767 / 0.767<br>40.76 req/s, 5,218 tok/s | ❌ FAIL<br>0.754 / 0.754<br>" \
           "Δauto -1.2 [-5.0, +2.3] |  |" in first_screen
    attention = h200_report.split("### Needs attention (5)\n\n")[1].split("\n\n")[0]
    assert "WAIVED" not in attention  # waived checks are listed apart
    assert "<details><summary>Waived (10): judged, and covered by a waiver</summary>" in h200_report
    assert "| p |" in h200_report and "p (adj.)" not in h200_report  # no family was adjusted
    assert "▶️ RAN | `triton_attn-auto-sm90` | accuracy |" in h200_report


@pytest.mark.parametrize("cells", [2, 52, 256])
def test_the_comment_of_an_ab_run_of_any_size_fits_and_opens_with_its_grid(tmp_path, cells):
    run, ids = planted_ab_run(tmp_path / "run", cells)
    verdict = judge_ab(run)
    assert not verdict.passed
    report = render_all(verdict)["report.md"].decode()
    body = pr_comment.render(report, "failure", RUN_URL, "failed", "acme/vllm")
    folded = body.count("<sub>Folded to fit a comment:")
    print(f"{cells} cells: report.md {len(report):,} characters, comment {len(body):,} ({folded} blocks folded)")
    assert len(body) < GITHUB_COMMENT_LIMIT and len(report.encode()) < STEP_SUMMARY_LIMIT
    shown = body.split("artifact.\n\n", 1)[1]
    assert shown.startswith("❌ kvgate: ")
    assert shown.split("\n\n")[4].startswith("| **sm80** |")  # headline, context, counts, legend, then the grid
    assert table_rows_are_whole(body) == []
    assert all(f"`{b.lower()}`" in shown for b, _, _ in ab_run_axes(cells, BACKENDS))  # every row of the grid
    assert f"❌ FAIL `{ids[-1]}` baseline_accuracy [strict-match]: drop 15.0 pts" in shown
    assert "(report cut to fit a comment" not in body  # folded, never cut


def test_an_empty_subject_or_model_never_renders_empty_brackets():
    checks = (Check(cell="triton_attn-fp8-sm90", kind="kernels", status="fail", subject="", model="",
                    threshold={"failed": 0}, detail="1 failed of 4"),
              Check(cell="triton_attn-auto-sm90", kind="accuracy", status="pass", subject="", model="",
                    figures={"strict-match": 0.5}))
    verdict = Verdict(checks=checks, run="r", baseline=None, today="2026-12-01", multiplicity={})
    rendered = render_all(verdict)
    text = rendered["report.md"].decode()
    print(text)
    assert "[]" not in text and "``" not in text and "[]" not in rendered["report.html"].decode()
    assert "| `triton_attn` | ▶️ RAN<br>0.500 | ❌ FAIL |" in text
    assert "- ❌ FAIL `triton_attn-fp8-sm90` kernels: 1 failed of 4" in text


def test_a_neutral_page_has_a_plain_title_and_opens_with_its_grid(tmp_path):
    run = write_seed_run(tmp_path / "run")
    verdict = gate.evaluate(load_run(run, KnownNames.from_matrix(MATRIX)), policy=POLICY,
                            waiver_for=MATRIX.waiver_for, today=dt.date(2026, 11, 30))
    assert verdict.neutral
    page = render_all(verdict)["report.html"].decode()
    title = re.search(r"<title>(.*)</title>", page).group(1)
    assert title.startswith("kvgate: NEUTRAL — ") and "⚪" not in title
    assert page.index('<section id="grid">') < page.index("<h2>")  # the grid comes before every section
    assert ('<th><code>flashinfer_mla</code></th><td class="grid-entry" data-cell="flashinfer_mla-auto-sm100" '
            'data-word="pass"><span class="badge" style="background:#1a7f37">PASS</span>') in page
