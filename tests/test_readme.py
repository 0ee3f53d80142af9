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


def test_the_quick_start_holds_the_main_job_and_the_tests_each_in_a_venv():
    # a bare `pip install` is refused by an externally managed Python (PEP 668: Debian 12, Ubuntu 24.04)
    assert quick_start_commands() == [MAIN_JOB, TESTS]


PRINTS_THE_PYTHON = "python3 -c 'import sys; print(f\".ci/run: python3 is {sys.executable}, Python {sys.version}\", flush=True)'"


def test_ci_runs_exactly_the_readme_test_command_after_printing_its_python():
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line for line in script.splitlines()
                if line.strip() and not line.startswith(("#", "set ", "cd ", "trap 'echo "))]
    assert commands == [PRINTS_THE_PYTHON, TESTS]
