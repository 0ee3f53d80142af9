"""Write .github/CODEOWNERS from its one setting, the owners in ci/codeowners.toml.

    python ci/codeowners.py            rewrite .github/CODEOWNERS
    python ci/codeowners.py --check    exit 1, one line, when the committed file is not what the setting makes

With the branch ruleset's "Require review from Code Owners" (ci/README.md, "The required status check"), a pull
request that touches any path of the repository needs the owners' approval: a catch-all comes first, then the paths
that decide how a change is planned, run and judged, each named again so that a later narrower catch-all cannot
leave them without an owner. Stdlib only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SETTING = ROOT / "ci" / "codeowners.toml"
CODEOWNERS = ROOT / ".github" / "CODEOWNERS"
OWNER = re.compile(r"@[A-Za-z0-9][A-Za-z0-9-]*(?:/[A-Za-z0-9._-]+)?|[^@\s]+@[^@\s]+\.[A-Za-z]+")

# (pattern, why) after the catch-all; ci/plan.py's HARNESS_PATHS are all here (tests/test_ci_plan.py checks)
OWNED = (
    ("/.github/", "The workflows (a new one could report a check named kvgate-gate), CODEOWNERS itself"),
    ("/ci/", "The CI scripts, their locks and the owners setting (ci/codeowners.toml)"),
    ("/matrix/", "The matrix, the gate's thresholds (policy.toml) and the waivers"),
    ("/noxfile.py", "How every cell is set up and run, and what it installs"),
    ("/pyproject.toml", None),
    ("/setup.py", None),
    ("/src/", None),
    ("/tests/kernels/", "The decode-kernel tests every cell runs, and the pytest configuration they load"),
    ("**/conftest.py", "pytest's configuration and plugins, and Python's start-up hooks, wherever they sit (ci/plan.py "
                       "counts them as the harness: a change to one plans every cell)"),
    ("**/pytest.ini", None),
    ("**/pyproject.toml", None),
    ("**/setup.py", None),
    ("**/tox.ini", None),
    ("**/setup.cfg", None),
    ("*.pth", None),
    ("**/sitecustomize.py", None),
    ("**/usercustomize.py", None),
)


class SettingError(Exception):
    """ci/codeowners.toml is unusable: one line, exit status 2."""


def read_owners(path: Path = SETTING) -> list[str]:
    try:
        owners = tomllib.loads(path.read_text(encoding="utf-8")).get("owners")
    except (OSError, ValueError) as error:
        raise SettingError(f"{path.name}: cannot read ({error})") from None
    if not isinstance(owners, list) or not owners or not all(isinstance(o, str) and OWNER.fullmatch(o) for o in owners):
        raise SettingError(f"{path.name}: expected owners = [\"@org/team\", ...] (GitHub's owner forms) in owners")
    return owners


def render(owners: list[str]) -> str:
    team = " ".join(owners)
    width = max(len(pattern) for pattern, _ in OWNED) + 2
    lines = ["# Written by `python ci/codeowners.py` from ci/codeowners.toml (the one setting: the owners); edit that,",
             "# not this file. With the branch ruleset's \"Require review from Code Owners\" (and \"Dismiss stale",
             "# approvals\", \"Require approval of the most recent push\"), a pull request that touches any path needs",
             "# the owners' approval. The last matching line wins: the catch-all comes first.", "",
             "# Every path of the repository.", f"{'*'.ljust(width)}{team}", ""]
    for pattern, why in OWNED:
        if why:
            lines += ["", f"# {why}."] if lines[-1] != "" else [f"# {why}."]
        lines.append(f"{pattern.ljust(width)}{team}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    try:
        wanted = render(read_owners())
    except SettingError as error:
        print(f"ERROR ci/{error}", file=sys.stderr)
        return 2
    if "--check" in argv:
        if CODEOWNERS.read_text(encoding="utf-8") != wanted:
            print("ERROR .github/CODEOWNERS: not what ci/codeowners.toml makes. Run `python ci/codeowners.py`",
                  file=sys.stderr)
            return 1
        return 0
    CODEOWNERS.write_text(wanted, encoding="utf-8")
    print(f"wrote {CODEOWNERS.relative_to(ROOT)} for {' '.join(read_owners())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
