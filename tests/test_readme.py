"""The README's two commands are the ones a fresh machine runs, and `.ci/run` runs exactly the test one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = "python3 -m venv .venv && .venv/bin/python -m pip install nox && .venv/bin/nox -s accuracy"
TESTS = "python3 -m venv .venv && .venv/bin/python -m pip install nox && .venv/bin/nox -s tests"


def quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", quick_start)


TRY_THE_GATE = ".venv/bin/nox -s try_gate"
FIRST_SCREEN_LINES = 30  # what GitHub shows of a README before one scrolls, on a laptop


def test_the_quick_start_holds_the_main_job_and_the_tests_each_in_a_venv_then_the_try_step():
    # a bare `pip install` is refused by an externally managed Python (PEP 668: Debian 12, Ubuntu 24.04)
    assert quick_start_commands() == [MAIN_JOB, TESTS, TRY_THE_GATE]


def test_the_readmes_first_screen_shows_the_two_commands():
    first_screen = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN_LINES]
    assert MAIN_JOB in first_screen and TESTS in first_screen


def test_try_the_gate_judges_the_sample_runs_the_tests_judge_under_the_default_policy():
    """The try step's session gates the runs tests/test_canaries.py judges with the default policy (a harmless patch
    passes, exit 0; an FP8 scale mismatch fails, exit 1), and the README shows their first lines as the gate says
    them."""
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    session = noxfile.split("def try_gate(", 1)[1].split("\n@nox.session", 1)[0]
    assert 'SAMPLE_RUNS = ROOT / "tests" / "fixtures" / "canaries" / "ci-canaries.tar.xz"' in noxfile
    assert '(("harmless-refactor", 0), ("fp8-scale-mismatch", 1))' in session and "--policy" not in session
    # the matrix the runs were made with: today's without the CPU FP8 cell's checkpoint scales (as the tests judge them)
    assert 'replace(\'\\nfp8_kv_scales = "checkpoint"\\n\', "\\n")' in session
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert ("✅ kvgate: all 7 checks passed; 3 stages ran with nothing to judge them\n❌ kvgate: 4 of 7 checks failed — "
            "cpu_attn-fp8-cpu fp8_accuracy [strict-match] drop 82.9 pts, lower bound 70.8 > margin 3.0 … (+3 more)"
            ) in readme


PRINTS_THE_PYTHON = "python3 -c 'import sys; print(f\".ci/run: python3 is {sys.executable}, Python {sys.version}\", flush=True)'"


def test_ci_runs_exactly_the_readme_test_command_after_printing_its_python():
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line for line in script.splitlines()
                if line.strip() and not line.startswith(("#", "set ", "cd ", "trap 'echo "))]
    assert commands == [PRINTS_THE_PYTHON, TESTS]
