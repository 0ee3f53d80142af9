"""ci/fetch_baseline.py against a stand-in `gh` that answers from a script of runs and records what it was asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci_scripts import load_ci_script

ROOT = Path(__file__).resolve().parents[1]

fetch_baseline = load_ci_script("fetch_baseline")

FAKE_GH = r'''
import json, os, sys
world = json.loads(os.environ["FAKE_GH_WORLD"])
with open(os.environ["FAKE_GH_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args[:2] == ["run", "list"]:
    if world.get("list_fails"):
        sys.exit("HTTP 502: Bad Gateway")
    event = args[args.index("--event") + 1]
    print(json.dumps(world["runs"].get(event, [])))
elif args[:2] == ["run", "download"]:
    run_id = args[2]
    if run_id not in world.get("artifacts", []):
        sys.exit("no artifact matches any of the names or patterns provided")
    folder = os.path.join(args[args.index("--dir") + 1], "cpu_attn-fp8-cpu")
    os.makedirs(folder)
    open(os.path.join(folder, "cell.json"), "w").write("{}")
else:
    sys.exit("unexpected gh call")
'''


def run_of(run_id: int, event: str, created: str, branch: str = "main", conclusion: str = "success") -> dict:
    return {"databaseId": run_id, "event": event, "headBranch": branch, "conclusion": conclusion,
            "createdAt": created, "headSha": f"{run_id:040d}"}


def environment(tmp_path: Path, world: dict, **extra: str) -> dict[str, str]:
    gh = tmp_path / "gh.py"
    gh.write_text(FAKE_GH, encoding="utf-8")
    return {"GITHUB_REPOSITORY": "acme/kvgate", "BASELINE_DIR": str(tmp_path / "baseline"),
            "GITHUB_RUN_ID": "900", "KVGATE_GH": f"{sys.executable} {gh}", "FAKE_GH_WORLD": json.dumps(world),
            "FAKE_GH_LOG": str(tmp_path / "gh.log"), **extra}


def calls(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "gh.log").read_text().splitlines()]


def fetch(tmp_path: Path, world: dict, **extra: str) -> str | None:
    env = environment(tmp_path, world, **extra)
    os.environ.update({k: v for k, v in env.items() if k.startswith("FAKE_GH")})  # the stand-in reads them
    return fetch_baseline.fetch(env)


@pytest.fixture(autouse=True)
def _clean_fake_env():
    yield
    for key in ("FAKE_GH_WORLD", "FAKE_GH_LOG"):
        os.environ.pop(key, None)


def test_the_newest_successful_run_that_main_started_is_the_baseline(tmp_path, capsys):
    world = {"runs": {"push": [run_of(700, "push", "2026-11-29T10:00:00Z")],
                      "workflow_dispatch": [run_of(710, "workflow_dispatch", "2026-11-30T10:00:00Z")]},
             "artifacts": ["700", "710"]}

    assert fetch(tmp_path, world) == "710"
    assert (tmp_path / "baseline" / "cpu_attn-fp8-cpu" / "cell.json").is_file()
    assert calls(tmp_path)[-1] == ["run", "download", "710", "--repo", "acme/kvgate", "--name", "kvgate-run",
                                   "--dir", str(tmp_path / "baseline")]
    assert [c[c.index("--event") + 1] for c in calls(tmp_path)[:2]] == ["push", "workflow_dispatch"]
    assert all(c[c.index("--status") + 1] == "success" and c[c.index("--branch") + 1] == "main"
               for c in calls(tmp_path)[:2])
    assert "kvgate: baseline from run 710" in capsys.readouterr().out


def test_attack_a_pull_request_run_on_a_branch_named_main_is_never_the_baseline(tmp_path):
    """A fork's branch may be called main; its pull_request run is not main's, even if gh were to list it."""
    world = {"runs": {"push": [run_of(800, "pull_request", "2026-11-30T12:00:00Z"),
                               run_of(801, "push", "2026-11-30T12:00:00Z", branch="feature"),
                               run_of(802, "push", "2026-11-30T12:00:00Z", conclusion="failure"),
                               run_of(700, "push", "2026-11-29T10:00:00Z")]},
             "artifacts": ["700", "800", "801", "802"]}

    assert fetch(tmp_path, world) == "700"


def test_a_push_run_compares_with_the_run_before_it_not_itself(tmp_path):
    world = {"runs": {"push": [run_of(900, "push", "2026-11-30T12:00:00Z"),
                               run_of(890, "push", "2026-11-30T11:00:00Z")]},
             "artifacts": ["900", "890"]}

    assert fetch(tmp_path, world, GITHUB_RUN_ID="900") == "890"


@pytest.mark.parametrize(("world", "warning"), [
    ({"runs": {}}, "::warning::kvgate: no baseline: no successful push or manual run of kvgate.yml on main"),
    ({"runs": {}, "list_fails": True}, "::warning::kvgate: no baseline: {gh} run list exited 1: HTTP 502: Bad Gateway"),
    ({"runs": {"push": [run_of(700, "push", "2026-11-29T10:00:00Z")]}, "artifacts": []},
     "::warning::kvgate: no baseline: run 700 (the newest successful run on main) has no usable kvgate-run artifact "
     "(expired?): {gh} run download exited 1: no artifact matches any of the names or patterns provided"),
])
def test_no_baseline_is_a_warning_and_no_folder(tmp_path, capsys, world, warning):
    assert fetch(tmp_path, world) is None
    assert capsys.readouterr().out.strip() == warning.format(gh=sys.executable)
    assert not (tmp_path / "baseline").exists()


def test_the_script_writes_the_run_id_output_and_exits_0_without_a_baseline(tmp_path):
    env = {**os.environ, **environment(tmp_path, {"runs": {}}), "GITHUB_OUTPUT": str(tmp_path / "out")}
    result = subprocess.run([sys.executable, "ci/fetch_baseline.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out").read_text() == "run-id=\n"


@pytest.mark.parametrize(("environ", "message"), [
    ({"GITHUB_REPOSITORY": ""}, "$GITHUB_REPOSITORY: expected owner/repo"),
    ({"BASELINE_DIR": ""}, "$BASELINE_DIR: not set. Point it at the folder the gate reads the baseline from"),
])
def test_bad_input_is_one_error_line(tmp_path, environ, message):
    env = {**os.environ, **environment(tmp_path, {"runs": {}}), **environ}
    result = subprocess.run([sys.executable, "ci/fetch_baseline.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False)
    assert (result.returncode, result.stderr) == (2, f"ERROR {message}\n")


@pytest.mark.parametrize(("baseline_is_a_file", "gh", "message"), [
    (True, None, "not a folder. Point $BASELINE_DIR at the folder the gate reads the baseline from"),
    (False, " ", "$KVGATE_GH: empty. Leave it unset (gh) or name the GitHub CLI"),
])
def test_a_baseline_folder_that_is_a_file_or_an_empty_gh_is_one_error_line(tmp_path, baseline_is_a_file, gh, message):
    """Both were a traceback (NotADirectoryError, IndexError)."""
    env = {**os.environ, **environment(tmp_path, {"runs": {}})}
    if baseline_is_a_file:
        Path(env["BASELINE_DIR"]).write_text("x")
    if gh is not None:
        env["KVGATE_GH"] = gh
    result = subprocess.run([sys.executable, "-I", "ci/fetch_baseline.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 2 and result.stderr.startswith("ERROR ") and result.stderr.count("\n") == 1
    assert message in result.stderr


def test_a_run_id_output_that_cannot_be_written_is_one_error_line_and_the_baseline_stays(tmp_path):
    """$GITHUB_OUTPUT naming a folder was an IsADirectoryError traceback after the baseline was fetched."""
    world = {"runs": {"push": [run_of(700, "push", "2026-01-02T00:00:00Z")]}, "artifacts": ["700"]}
    env = {**os.environ, **environment(tmp_path, world), "GITHUB_OUTPUT": str(tmp_path)}
    result = subprocess.run([sys.executable, "-I", "ci/fetch_baseline.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False)
    assert (result.returncode, result.stderr) == (2, (
        f"ERROR $GITHUB_OUTPUT {tmp_path}: cannot append to it (it is a folder). Point it at a file this job may write "
        "(GitHub Actions sets it for each step), or unset it\n"))
    assert (tmp_path / "baseline" / "cpu_attn-fp8-cpu" / "cell.json").is_file()
