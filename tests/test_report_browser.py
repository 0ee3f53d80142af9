"""report.html in a real headless Chromium, at a laptop's width (1280 x 800) and a phone's (390 x 844).

Each page must fit its width (no horizontal overflow), show every plot at a nonzero size, show its first failing
check on the first screen, show each of the grid's failing cells without a sideways scroll (at 390 px the grid's
cards, the failing cells first), and keep its text at 11 px or more. The pages are the gate's own outputs: a real H200
run (tests/fixtures/h200_run), alone and recorded in the history of main (its trends drawn), the seed run passing
and failing, and a generated A/B run of 48 cells with one regression. Chromium is driven by puppeteer-core (ci/browser/measure.mjs); `bash ci/install_browser.sh` installs
both, as `nox -s tests` does, and without them this test skips with the reason. The screenshots' paths are printed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kvgate.cli import main
from synthetic_run import ab_run_axes, write_ab_run, write_kernels, write_seed_run
from test_fp8_kv_cache_check import TODAY, gate_cli, h200_matrix, h200_unpacked  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
MEASURE = ROOT / "ci" / "browser" / "measure.mjs"
PUPPETEER = ROOT / "ci" / "browser" / "node_modules" / "puppeteer-core" / "package.json"
VIEWPORTS = {"laptop": (1280, 800), "phone": (390, 844)}
PLOTS = ["accuracy per cell", "accuracy drops", "throughput ratios"]
SMALLEST_TEXT_PX = 11


def browser() -> tuple[str, str]:
    """(node, chromium), or a skip that says what is missing and how to install it."""
    chromium = os.environ.get("KVGATE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    node = shutil.which("node")
    missing = [what for what, found in (("node", node), ("chromium", chromium),
                                        (f"puppeteer-core ({PUPPETEER.parent})", PUPPETEER.is_file())) if not found]
    if missing:
        pytest.skip(f"no headless browser here ({', '.join(missing)} missing): run `bash ci/install_browser.sh` "
                    "(Debian's chromium needs root for apt-get; set KVGATE_CHROMIUM to use another Chromium)")
    return node, chromium


def gate(run: Path, out: Path, *args: str) -> Path:
    assert main(["gate", str(run), "--out", str(out), "--today", TODAY, *args]) in (0, 1)
    return out / "report.html"


@pytest.fixture(scope="module")
def pages(tmp_path_factory, h200_unpacked, h200_matrix) -> dict[str, Path]:  # noqa: F811 (fixtures)
    """name -> a report.html the gate wrote, and whether a check in it failed."""
    root = tmp_path_factory.mktemp("pages")
    passing = write_seed_run(root / "passing-run")
    failing = write_seed_run(root / "failing-run", fp8_drop_points=7.1)
    write_kernels(failing / "flashinfer_mla-auto-sm100", passed=0, skipped=3)
    axes = ab_run_axes(48, ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"))
    regressed = "triton_attn-fp8-sm120"
    assert regressed in {f"{b.lower()}-{d}-{a}" for b, d, a in axes}
    ab = write_ab_run(root / "ab-run", axes, head_drop={regressed: 30})
    written = {"seed-passing": gate(passing, root / "seed-passing"), "seed-failing": gate(failing, root / "seed-failing"),
               "ab-48-cells": gate(ab, root / "ab-48-cells")}
    assert gate_cli(h200_unpacked, h200_matrix, root / "h200") in (0, 1)
    written["h200"] = root / "h200" / "report.html"
    # the same run recorded twice in the history of main: its page gains "History of main", a trend per cell
    on_main = Path(shutil.copytree(h200_unpacked, root / "h200-main-run"))
    info = json.loads((on_main / "run.json").read_text(encoding="utf-8"))
    (on_main / "run.json").write_text(json.dumps({**info, "branch": "main"}), encoding="utf-8")
    for _ in range(2):
        assert gate_cli(on_main, h200_matrix, root / "h200-main", "--history", str(root / "history.sqlite3")) == 1
    written["h200-main-history"] = root / "h200-main" / "report.html"
    assert '<section id="history">' in written["h200-main-history"].read_text(encoding="utf-8")
    pages = {}
    for name, page in written.items():  # named by what they hold, so that the screenshots are
        pages[name] = page.rename(page.with_name(f"{name}.html"))
    return pages


def test_report_html_fits_a_laptop_and_a_phone_with_every_plot_and_the_failure_on_the_first_screen(pages, tmp_path):
    node, chromium = browser()
    sizes = ",".join(f"{w}x{h}" for w, h in VIEWPORTS.values())
    measured = json.loads(subprocess.run([node, str(MEASURE), chromium, str(tmp_path), sizes, *map(str, pages.values())],
                                         check=True, capture_output=True, text=True, timeout=120).stdout)
    assert len(measured) == len(pages) * len(VIEWPORTS)
    problems = []
    for view in measured:
        name = Path(view["page"]).stem
        print(f"{name} at {view['width']}: failing grid cells {view['failingCells']}")
        print(f"{name} at {view['width']}: {view['screenshot']} (first screen {view['firstScreen']}); width "
              f"{view['scrollWidth']} of {view['innerWidth']}, plots {[(p['label'], p['height']) for p in view['plots']]}, "
              f"first failing check's bottom {view['firstFailing'] and view['firstFailing']['bottom']} of "
              f"{view['innerHeight']}, smallest text {view['smallestText']}")
        where = f"{name} at {view['width']} px"
        if view["scrollWidth"] > view["innerWidth"]:
            problems.append(f"{where}: {view['scrollWidth']} px wide, wider than the window")
        if [p["label"] for p in view["plots"]] != PLOTS:
            problems.append(f"{where}: plots {[p['label'] for p in view['plots']]}, not {PLOTS}")
        problems += [f"{where}: plot {p['label']} is {p['width']} x {p['height']} px" for p in view["plots"]
                     if not (p["width"] > 0 and p["height"] > 0)]
        if "passing" in name:
            if view["firstFailing"]:
                problems.append(f"{where}: a passing page lists {view['firstFailing']['text']!r} as needing attention")
        elif not view["firstFailing"]:
            problems.append(f"{where}: no Needs attention block")
        elif view["firstFailing"]["bottom"] > view["innerHeight"]:
            problems.append(f"{where}: the first failing check ends at y={view['firstFailing']['bottom']:.0f}, below "
                            f"the first screen ({view['innerHeight']} px)")
        cells = view["failingCells"]  # the grid's failing cells: each in view once scrolled down to, never sideways
        if "passing" in name:
            problems += [f"{where}: a passing page's grid shows {c['cell']} as {c['word']}" for c in cells]
        elif not cells:
            problems.append(f"{where}: no failing cell shown in the grid")
        problems += [f"{where}: the failing cell {c['cell']} is not on the screen without a sideways scroll (x "
                     f"{c['left']:.0f}..{c['right']:.0f} of {view['innerWidth']}, drawn there: {c['drawn']})"
                     for c in cells if not (c["left"] >= 0 and c["right"] <= view["innerWidth"] and c["drawn"]
                                            and c["scrollX"] == 0)]
        if view["smallestText"]["size"] < SMALLEST_TEXT_PX:
            problems.append(f"{where}: text of {view['smallestText']['size']:.1f} px ({view['smallestText']['text']!r})")
    assert not problems, "\n".join(problems)
