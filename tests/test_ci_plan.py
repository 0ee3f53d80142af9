"""ci/plan.py's pure parts (the real `nox -s matrix` run is in tests/test_workflows.py) and ci/cell_job.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci_scripts import load_ci_script

ROOT = Path(__file__).resolve().parents[1]




plan = load_ci_script("plan")
cell_job = load_ci_script("cell_job")

ENTRY = {"cell": "flashinfer_mla-fp8-sm100", "backend": "FLASHINFER_MLA", "kv_cache_dtype": "fp8", "arch": "sm100",
         "model": "deepseek-ai/DeepSeek-V2-Lite-Chat", "runner": "gpu-sm100",
         "sessions": ["cell(flashinfer_mla-fp8-sm100)"]}


def nox_stdout(matrix: object) -> str:
    return "\n".join(["kvgate: some chatter", json.dumps(matrix, separators=(",", ":")), ""])


def test_the_matrix_line_is_found_among_other_output():
    assert plan.parse_matrix(nox_stdout({"include": [ENTRY]})) == {"include": [ENTRY]}


@pytest.mark.parametrize(("stdout", "message"), [
    ("nothing here\n", "nox -s matrix: expected one {\"include\": [...]} line on stdout, found 0. "
                       "Run it by hand to see what it printed"),
    ('{"include": [\n', "nox -s matrix: the matrix line is not JSON (Expecting value at column 14)"),
    ('{"include": [], "exclude": []}\n', "nox -s matrix: the matrix must be an object with only an 'include' list"),
    (nox_stdout({"include": [{k: v for k, v in ENTRY.items() if k != "runner"}]}),
     "nox -s matrix: include[0] lacks runner"),
    (nox_stdout({"include": [{**ENTRY, "sessions": []}]}),
     "nox -s matrix: include[0].sessions must be a non-empty list of session names"),
    (nox_stdout({"include": [ENTRY, ENTRY]}), "nox -s matrix: a cell id appears twice in the matrix"),
])
def test_a_bad_matrix_is_refused_with_one_message(stdout, message):
    with pytest.raises(plan.PlanError) as error:
        plan.parse_matrix(stdout)
    assert str(error.value) == message


def test_more_cells_than_github_allows_is_refused():
    include = [{**ENTRY, "cell": f"c{i}"} for i in range(257)]
    with pytest.raises(plan.PlanError, match="257 cells, but a GitHub Actions matrix takes at most 256 jobs"):
        plan.parse_matrix(nox_stdout({"include": include}))


def test_outputs_flag_an_empty_plan():
    assert plan.outputs({"include": []}) == {"matrix": '{"include":[]}', "has-cells": "false", "cell-count": "0"}
    assert plan.outputs({"include": [ENTRY]})["has-cells"] == "true"


def test_an_output_value_with_a_newline_is_refused():
    with pytest.raises(plan.PlanError, match="must be one line"):
        plan.output_lines({"matrix": "a\nhas-cells=true"})


@pytest.mark.parametrize(("event", "changed", "change_of", "expected"), [
    ("push", None, "kvgate", None),
    ("workflow_dispatch", None, "kvgate", None),
    ("pull_request", ["vllm/v1/attention/backends/mla/flashinfer_mla.py"], "vllm",
     ["vllm/v1/attention/backends/mla/flashinfer_mla.py"]),
    ("pull_request", ["README.md", "src/kvgate/gate/checks.py"], "kvgate", None),
    ("pull_request", ["matrix/backends.toml"], "kvgate", None),
    ("pull_request", ["tests/test_gate.py", "ci/README.md"], "kvgate", None),  # ci/ is harness, README or not
    ("pull_request", ["tests/test_gate.py", "docs/results-folder.md", "README.md"], "kvgate", []),
    ("pull_request", ["tests/kernels/test_flashmla.py"], "kvgate", None),  # loosening a kernel test
    ("pull_request", ["tests/conftest.py"], "kvgate", None),  # pytest loads it for tests/kernels
    ("pull_request", ["pytest.ini"], "kvgate", None),  # would override pyproject's pytest settings
    ("pull_request", ["conftest.py"], "kvgate", None),
    ("pull_request", ["ci/locks/gpu-py312-x86_64.txt"], "kvgate", None),
    ("pull_request", [".github/workflows/kvgate.yml"], "kvgate", None),
    ("pull_request", ["something/new.py"], "kvgate", None),  # unknown: counts as harness
    # attack: pytest's configuration and plugins at any depth, and start-up hooks, are the harness
    ("pull_request", ["tests/kernels/sub/conftest.py"], "kvgate", None),
    ("pull_request", ["tests/fixtures/conftest.py"], "kvgate", None),
    ("pull_request", ["tests/pytest.ini"], "kvgate", None),
    ("pull_request", ["tests/tox.ini"], "kvgate", None),
    ("pull_request", ["tests/setup.cfg"], "kvgate", None),
    ("pull_request", ["tests/pyproject.toml"], "kvgate", None),
    ("pull_request", ["tests/fixtures/evil.pth"], "kvgate", None),
    ("pull_request", ["tests/sitecustomize.py"], "kvgate", None),
    ("pull_request", ["docs/usercustomize.py"], "kvgate", None),
])
def test_which_changes_plan_every_cell(event, changed, change_of, expected):
    assert plan.decide(event, changed, change_of)[0] == expected


def test_a_pull_request_without_a_diff_is_an_error():
    with pytest.raises(plan.PlanError) as error:
        plan.decide("pull_request", None)
    assert str(error.value) == ("event 'pull_request': no changed-files list. Pass --changed-files FILE or --repo DIR, "
                                "or run on one of push, schedule, workflow_dispatch to plan every cell")


@pytest.mark.parametrize("path", [
    "vllm/v1/attention/backends/mla/x\nvllm/docs/a.md",
    "vllm/v1/attention/backends/mla/x\u2028.py",  # str.splitlines() ends a line there
    "vllm/v1/attention/backends/mla/x\x85.py",
    "vllm/v1/attention/backends/mla/x\udcff.py",  # a byte that is not UTF-8, as git -z gives it
    "docs/../vllm/v1/attention/backends/flash_attn.py",  # docs/** is inert: matched as listed, it would plan no cell
    "/vllm/v1/attention/backends/flash_attn.py",
])
def test_a_path_that_cannot_travel_one_a_line_plans_every_cell(path):
    selection, reason = plan.decide("pull_request", ["docs/a.md", path], "vllm")
    assert selection is None
    assert reason == (f"A changed path cannot be matched safely ({path!a}: a control character, not UTF-8, "
                      "absolute or `..`): every cell.")


# ------------------------------------------------------------------------------------------------ real git

def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
                             *args], cwd=repo, check=True, capture_output=True)
    return result.stdout.decode().strip()


def write(repo: Path, path: str | bytes, text: str = "x = 1\n") -> None:
    target = os.path.join(os.fsencode(repo), path if isinstance(path, bytes) else os.fsencode(path))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(text)


FLASHMLA = "vllm/v1/attention/backends/mla/flashmla.py"
FLASHMLA_BODY = "".join(f"line {i} of the FlashMLA backend\n" for i in range(40))


@pytest.fixture
def vllm_repo(tmp_path: Path) -> Path:
    """A vLLM-like repository: one commit holding the FlashMLA backend and a README."""
    repo = tmp_path / "vllm"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, FLASHMLA, FLASHMLA_BODY)
    write(repo, "README.md", "vLLM\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def flashmla_selected(repo: Path, paths: list[str]) -> bool:
    """Whether the selection of these paths, on both commits' trees (HEAD^1, HEAD), plans a FLASHMLA cell."""
    from kvgate.change import code_sides
    from kvgate.change.selection import select
    from kvgate.matrix import cells as kvmatrix

    matrix = kvmatrix.load(ROOT / "matrix")
    changed, base, head = code_sides.from_git(repo, "HEAD^1", "HEAD", paths, matrix)
    return any(cell.backend == "FLASHMLA" for cell in select(matrix, changed, matrix.cells, base=base, head=head).cells)


def test_attack_moving_the_backend_away_still_plans_it(vllm_repo):
    """`git diff --name-only` lists only the new path of a rename, which matches no backend's sources."""
    git(vllm_repo, "mv", FLASHMLA, "vllm/v1/attention/backends/mla/renamed.py")
    commit_all(vllm_repo, "move FlashMLA")
    name_only = git(vllm_repo, "diff", "--name-only", "HEAD^1", "HEAD").splitlines()
    assert name_only == ["vllm/v1/attention/backends/mla/renamed.py"]

    paths = plan.git_changed_paths(vllm_repo, "HEAD^1", "HEAD")

    assert paths == [FLASHMLA, "vllm/v1/attention/backends/mla/renamed.py"]
    assert flashmla_selected(vllm_repo, paths)


def test_both_sides_of_a_copy_are_listed(vllm_repo):
    write(vllm_repo, "vllm/v1/attention/backends/mla/copied.py", FLASHMLA_BODY)
    write(vllm_repo, FLASHMLA, FLASHMLA_BODY + "one more line\n")  # -C finds copies of files the change touches
    commit_all(vllm_repo, "copy FlashMLA")
    raw = git(vllm_repo, "diff", "--name-status", "-M", "-C", "HEAD^1", "HEAD")
    assert raw.splitlines()[0].startswith("C")

    assert plan.git_changed_paths(vllm_repo, "HEAD^1", "HEAD") == [
        FLASHMLA, "vllm/v1/attention/backends/mla/copied.py"]


def test_attack_a_non_ascii_name_is_not_quoted_out_of_the_match(vllm_repo):
    """Without -z git writes "vllm/.../flashmla_\\303\\251.py" in quotes, which no glob matches."""
    new = "vllm/v1/attention/backends/mla/flashmla_é.py"
    write(vllm_repo, new)
    commit_all(vllm_repo, "non-ASCII")
    quoted = git(vllm_repo, "-c", "core.quotePath=true", "diff", "--name-only", "HEAD^1", "HEAD").splitlines()
    assert quoted == ['"vllm/v1/attention/backends/mla/flashmla_\\303\\251.py"']

    paths = plan.git_changed_paths(vllm_repo, "HEAD^1", "HEAD")

    assert paths == [new]
    assert flashmla_selected(vllm_repo, paths)


def test_attack_a_name_that_is_not_utf8_plans_every_cell(vllm_repo):
    write(vllm_repo, b"vllm/v1/attention/backends/mla/flashmla\xff.py")
    commit_all(vllm_repo, "not UTF-8")

    paths = plan.git_changed_paths(vllm_repo, "HEAD^1", "HEAD")

    assert paths == ["vllm/v1/attention/backends/mla/flashmla\udcff.py"]
    assert plan.decide("pull_request", paths, "vllm")[0] is None


def test_attack_a_newline_in_a_name_plans_every_cell(vllm_repo):
    write(vllm_repo, "docs/a\nvllm/v1/attention/backends/mla/flashmla.py")
    commit_all(vllm_repo, "newline")

    paths = plan.git_changed_paths(vllm_repo, "HEAD^1", "HEAD")

    assert paths == ["docs/a\nvllm/v1/attention/backends/mla/flashmla.py"]
    assert plan.decide("pull_request", paths, "vllm")[0] is None


def test_attack_loosening_a_kernel_test_plans_every_cell(tmp_path):
    repo = tmp_path / "kvgate"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, "tests/kernels/test_decode.py", "TOLERANCE = 1e-2\n")
    commit_all(repo, "base")
    write(repo, "tests/kernels/test_decode.py", "TOLERANCE = 1.0\n")
    commit_all(repo, "loosen")

    paths = plan.git_changed_paths(repo, "HEAD^1", "HEAD")

    assert paths == ["tests/kernels/test_decode.py"]
    assert plan.decide("pull_request", paths, "kvgate") == (
        None, "kvgate's harness changed (`tests/kernels/test_decode.py`): every cell.")


def test_a_pull_requests_changes_are_counted_from_where_it_branched(vllm_repo):
    """--base B --head H diffs merge-base(B, H)..H: what main did since the branch is not the PR's change."""
    git(vllm_repo, "checkout", "-qb", "pr")
    write(vllm_repo, "docs/usage.md", "docs\n")
    head = commit_all(vllm_repo, "the PR")
    git(vllm_repo, "checkout", "-q", "main")
    write(vllm_repo, FLASHMLA, FLASHMLA_BODY + "main moved on\n")
    base = commit_all(vllm_repo, "main")

    assert plan.git_changed_paths(vllm_repo, plan.merge_base(vllm_repo, base, head), head) == ["docs/usage.md"]


def test_the_merge_commits_diff_names_both_parents_difference(vllm_repo):
    git(vllm_repo, "checkout", "-qb", "pr")
    git(vllm_repo, "mv", FLASHMLA, "vllm/elsewhere.py")
    commit_all(vllm_repo, "move")
    git(vllm_repo, "checkout", "-q", "main")
    git(vllm_repo, "merge", "-q", "--no-ff", "-m", "merge", "pr")

    assert plan.pull_request_changed_files(vllm_repo) == [FLASHMLA, "vllm/elsewhere.py"]


@pytest.mark.parametrize(("args", "message"), [
    (["--repo", "{repo}", "--base=--output=/tmp/x", "--head", "HEAD"],
     "--base '--output=/tmp/x': not a git revision (a commit SHA, a branch or a tag)"),
    (["--repo", "{repo}", "--base", "HEAD"], "--base and --head: pass both, or neither (the merge commit's own diff)"),
    (["--repo", "{tmp}"], "--repo {tmp}: not a git checkout"),
    ([], "event 'pull_request': pass --repo DIR (the change's git checkout) or --changed-files FILE"),
    (["--repo", "{repo}", "--changed-files", "x"], "--changed-files and --repo: pass one of them"),
    (["--repo", "{repo}", "--base", "nope", "--head", "HEAD"],
     "git merge-base nope HEAD in {repo}: fatal: Not a valid object name nope. Check out the full history "
     "(fetch-depth: 0)"),
])
def test_bad_planning_input_is_one_error_line(vllm_repo, tmp_path, capsys, args, message):
    fill = {"repo": str(vllm_repo), "tmp": str(tmp_path)}
    status = plan.main(["--event", "pull_request", *(a.format(**fill) for a in args)])
    assert (status, capsys.readouterr().err) == (2, f"ERROR {message.format(**fill)}\n")


@pytest.mark.parametrize(("args", "message"), [
    (["--head"], "argument --head: expected one argument"),  # `--head --output=x` as a revision: an option, refused
    (["--change-of", "torch"], "argument --change-of: invalid choice: 'torch' (choose from 'kvgate', 'vllm')"),
])
def test_bad_arguments_are_one_error_line(capsys, args, message):
    with pytest.raises(SystemExit) as caught:
        plan.main(args)
    assert caught.value.code == 2
    assert capsys.readouterr().err == f"ERROR ci/plan.py: {message}. See `python ci/plan.py --help`\n"


def test_a_nul_separated_list_is_read_as_such(tmp_path):
    listing = tmp_path / "changed"
    listing.write_bytes(b"vllm/a b.py\0vllm/\xc3\xa9.py\0")
    assert plan.read_changed_list(listing) == ["vllm/a b.py", "vllm/é.py"]


@pytest.mark.parametrize("change_of", ["vllm", "kvgate"])
@pytest.mark.parametrize("text", [b"", b"\n  \n", b"\0\0"])
def test_a_list_that_names_no_path_is_one_error_not_an_empty_plan(capsys, tmp_path, text, change_of):
    """A failed `git diff > FILE` leaves an empty list: it planned no cell and exited 0, so the change ran unseen."""
    listing = tmp_path / "changed"
    listing.write_bytes(text)
    assert plan.main(["--event", "pull_request", "--changed-files", str(listing), "--change-of", change_of,
                      "--nox", "false"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"ERROR {listing}: the changed-files list names no path. Pass the output of `git diff "
                            "--name-only BASE...HEAD`, or --cells all for every cell\n")


def test_a_list_without_end_is_one_error(monkeypatch):
    """--changed-files /dev/zero was read to the end of memory."""
    monkeypatch.setattr(plan, "MAX_CHANGED_FILES_BYTES", 1024 * 1024)
    with pytest.raises(plan.PlanError) as caught:
        plan.read_changed_list(Path("/dev/zero"))
    assert str(caught.value) == "/dev/zero: the changed-files list is more than 1048576 bytes"


def test_self_hosted_cells_get_the_pool_label_and_hosted_ones_do_not():
    cpu = {**ENTRY, "cell": "cpu_attn-fp8-cpu", "runner": "ubuntu-latest"}
    matrix = plan.with_runner_pool({"include": [ENTRY, cpu]}, "kvgate-pr")
    assert [e["runs-on"] for e in matrix["include"]] == [["gpu-sm100", "kvgate-pr"], ["ubuntu-latest"]]
    assert plan.with_runner_pool({"include": [ENTRY]}, "")["include"][0]["runs-on"] == ["gpu-sm100"]


def test_summary_lists_the_cells_or_says_none():
    assert "No cell selected" in plan.summary({"include": []}, "reason")
    assert "| `flashinfer_mla-fp8-sm100` | `gpu-sm100` |" in plan.summary({"include": [ENTRY]}, "reason")


# ------------------------------------------------------------------------------------------------ cell job

def test_cell_job_reads_the_matrix_entry_from_the_environment(tmp_path):
    cell, sessions, run_dir = cell_job.read_environment({
        "KVGATE_CELL": ENTRY["cell"], "KVGATE_SESSIONS": json.dumps(ENTRY["sessions"]), "KVGATE_RUN_DIR": str(tmp_path)})
    assert (cell, sessions, run_dir) == (ENTRY["cell"], ENTRY["sessions"], tmp_path)
    assert cell_job.session_commands(["nox"], sessions) == [["nox", "-s", "cell(flashinfer_mla-fp8-sm100)"]]


@pytest.mark.parametrize(("environ", "message"), [
    ({}, "$KVGATE_CELL: not set. The workflow passes the matrix entry's `cell`"),
    ({"KVGATE_CELL": "x", "KVGATE_SESSIONS": "[]"}, "$KVGATE_SESSIONS: expected a non-empty JSON list of nox session names"),
    ({"KVGATE_CELL": "x", "KVGATE_SESSIONS": "cell(x)"}, "$KVGATE_SESSIONS: not a JSON list of nox session names"),
    ({"KVGATE_CELL": "x", "KVGATE_SESSIONS": '["cell(x)"]'},
     "$KVGATE_RUN_DIR: not set. Point it at the folder the artifact uploads"),
])
def test_cell_job_refuses_a_bad_environment(environ, message):
    with pytest.raises(cell_job.CellJobError) as error:
        cell_job.read_environment(environ)
    assert str(error.value) == message


def test_attack_the_cell_job_refuses_a_results_folder_that_is_not_empty(tmp_path):
    """Its files are uploaded as the cell's results: a folder the change's checkout brought (made-up results) is not
    one of them."""
    planted = tmp_path / "kvgate-cell-x"
    (planted / "x").mkdir(parents=True)
    (planted / "x" / "cell.json").write_text("{}")
    with pytest.raises(cell_job.CellJobError) as error:
        cell_job.read_environment({"KVGATE_CELL": "x", "KVGATE_SESSIONS": '["cell(x)"]', "KVGATE_RUN_DIR": str(planted)})
    assert str(error.value) == (f"$KVGATE_RUN_DIR: {str(planted)!r} holds files already; the results folder must start "
                                "empty (its files are uploaded as this cell's results)")


@pytest.mark.parametrize(("environ", "gpus", "expected"), [
    ({}, 0, None),
    ({}, 1, None),
    ({}, 8, "8"),
    ({"KVGATE_KERNEL_WORKERS": "4"}, 8, "4"),  # the runner's .env
    ({"KVGATE_KERNEL_WORKERS": "4", "KVGATE_KERNEL_WORKERS_OVERRIDE": "2"}, 8, "2"),  # the repository variable
    ({"KVGATE_KERNEL_WORKERS_OVERRIDE": ""}, 2, "2"),  # an unset repository variable arrives empty
])
def test_kernel_workers_one_per_gpu_unless_told(environ, gpus, expected):
    assert cell_job.kernel_workers(environ, gpus) == expected


def test_kernel_workers_must_be_a_number():
    with pytest.raises(cell_job.CellJobError, match="KVGATE_KERNEL_WORKERS='all': expected a whole number"):
        cell_job.kernel_workers({"KVGATE_KERNEL_WORKERS_OVERRIDE": "all"}, 2)
    with pytest.raises(cell_job.CellJobError, match="expected a whole number"):  # isdigit() took it; int() does not
        cell_job.kernel_workers({"KVGATE_KERNEL_WORKERS_OVERRIDE": "\u00b2"}, 2)


def test_the_workers_variable_is_the_one_kvgate_kernels_reads():
    from kvgate.kernels.gpus import WORKERS_ENV

    assert cell_job.WORKERS_ENV == WORKERS_ENV


def test_a_session_that_writes_no_cell_folder_fails_the_job(tmp_path):
    """As when `cell(<id>)` skips on a runner whose GPU is not the cell's arch (nox exits 0)."""
    env = {"KVGATE_CELL": ENTRY["cell"], "KVGATE_SESSIONS": json.dumps(ENTRY["sessions"]),
           "KVGATE_RUN_DIR": str(tmp_path / "run"), "KVGATE_NOX": "true", "PATH": "/usr/bin:/bin",
           "GITHUB_SHA": "c" * 40}
    result = subprocess.run([sys.executable, "ci/cell_job.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 1
    assert f"::error::cell {ENTRY['cell']}: no cell folder (cell.json)" in result.stdout
    assert json.loads((tmp_path / "run" / "run.json").read_text())["commit"] == "c" * 40


def test_an_ab_cell_job_runs_head_against_base_from_one_revision():
    env = {"KVGATE_VLLM_HEAD": "/w/vllm-head", "KVGATE_VLLM_BASE": "/w/vllm-base", "KVGATE_VLLM_OVERLAY_BASE": "a" * 40}
    posargs = cell_job.vllm_arguments(env)
    assert posargs == ["--vllm", f"source:/w/vllm-head@{'a' * 40}", "--base-vllm", f"source:/w/vllm-base@{'a' * 40}"]
    assert cell_job.session_commands(["nox"], ENTRY["sessions"], posargs) == [
        ["nox", "-s", "cell(flashinfer_mla-fp8-sm100)", "--", *posargs]]
    assert cell_job.vllm_arguments({}) == []


def test_a_sides_per_commit_wheel_is_preferred_to_an_overlay():
    env = {"KVGATE_VLLM_HEAD": "/w/vllm-head", "KVGATE_VLLM_BASE": "/w/vllm-base", "KVGATE_VLLM_OVERLAY_BASE": "a" * 40,
           "KVGATE_VLLM_BASE_WHEEL": "/t/base/vllm-0.27.0.dev12+gaaaa-cp38-abi3-manylinux1_x86_64.whl"}
    assert cell_job.vllm_arguments(env) == [
        "--vllm", f"source:/w/vllm-head@{'a' * 40}",
        "--base-vllm", "wheel:/t/base/vllm-0.27.0.dev12+gaaaa-cp38-abi3-manylinux1_x86_64.whl"]
    env["KVGATE_VLLM_HEAD_WHEEL"] = "/t/head/vllm-0.27.0.dev13+gbbbb-cp38-abi3-manylinux1_x86_64.whl"
    assert cell_job.vllm_arguments(env)[:2] == ["--vllm", f"wheel:{env['KVGATE_VLLM_HEAD_WHEEL']}"]
    env["KVGATE_VLLM_HEAD_WHEEL"] = "relative.whl"
    with pytest.raises(cell_job.CellJobError, match=r"KVGATE_VLLM_HEAD_WHEEL: 'relative.whl' must be the absolute"):
        cell_job.vllm_arguments(env)


@pytest.mark.parametrize(("environ", "message"), [
    ({"KVGATE_VLLM_HEAD": "/w/h"}, "$KVGATE_VLLM_HEAD and $KVGATE_VLLM_BASE: set both (the vLLM checkouts of head "
                                   "and base), or neither"),
    ({"KVGATE_VLLM_HEAD": "/w/h", "KVGATE_VLLM_BASE": "/w/b", "KVGATE_VLLM_OVERLAY_BASE": "--output=x"},
     "$KVGATE_VLLM_OVERLAY_BASE: '--output=x' is not a git revision (a commit SHA or a tag)"),
    ({"KVGATE_VLLM_HEAD": "w/h", "KVGATE_VLLM_BASE": "/w/b", "KVGATE_VLLM_OVERLAY_BASE": "v0.26.0"},
     "$KVGATE_VLLM_HEAD: 'w/h' must be an absolute path without '@'"),
    ({"KVGATE_VLLM_HEAD": "/w/h", "KVGATE_VLLM_BASE": "/w/b@x", "KVGATE_VLLM_OVERLAY_BASE": "v0.26.0"},
     "$KVGATE_VLLM_BASE: '/w/b@x' must be an absolute path without '@'"),
])
def test_a_bad_ab_setting_is_one_error(environ, message):
    with pytest.raises(cell_job.CellJobError) as error:
        cell_job.vllm_arguments(environ)
    assert str(error.value) == message


@pytest.mark.parametrize(("environ", "label"), [
    ({"GITHUB_EVENT_NAME": "push", "GITHUB_REF": "refs/heads/main"}, "kvgate-main"),
    ({"GITHUB_EVENT_NAME": "workflow_dispatch", "GITHUB_REF": "refs/heads/main"}, "kvgate-main"),
    ({"GITHUB_EVENT_NAME": "workflow_dispatch", "GITHUB_REF": "refs/heads/try-this"}, "kvgate-pr"),
    ({"GITHUB_EVENT_NAME": "pull_request", "GITHUB_REF": "refs/heads/main"}, "kvgate-pr"),  # never main's pool
    ({"GITHUB_EVENT_NAME": "schedule", "GITHUB_REF": "refs/heads/main"}, "kvgate-main"),
    # a caller of kvgate-vllm.yml with an empty runner-pool-label on an event that serves a pull request or a comment:
    # GITHUB_REF names main, but the pull request's code would run on main's pool
    ({"GITHUB_EVENT_NAME": "pull_request_target", "GITHUB_REF": "refs/heads/main"}, "kvgate-pr"),
    ({"GITHUB_EVENT_NAME": "issue_comment", "GITHUB_REF": "refs/heads/main"}, "kvgate-pr"),
    ({"GITHUB_EVENT_NAME": "workflow_run", "GITHUB_REF": "refs/heads/main"}, "kvgate-pr"),
    ({"GITHUB_REF": "refs/heads/main"}, "kvgate-pr"),
    ({}, "kvgate-pr"),
])
def test_only_mains_own_runs_use_the_main_runner_pool(environ, label):
    assert plan.default_pool_label(environ) == label


def test_the_plan_writes_the_merge_base_it_counted_from(vllm_repo, tmp_path, monkeypatch):
    base = git(vllm_repo, "rev-parse", "HEAD")
    git(vllm_repo, "checkout", "-qb", "pr")
    write(vllm_repo, "docs/usage.md", "docs\n")
    head = commit_all(vllm_repo, "the PR")
    output = tmp_path / "out"
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    args = ["--repo", str(vllm_repo), "--base", base, "--head", head]

    assert plan.main([*args, "--change-of", "vllm", "--nox", "false"]) == 2  # no matrix printed: nothing written
    assert not output.exists()
    assert plan.main([*args, "--change-of", "kvgate"]) == 0  # docs only: no cell, no nox needed
    assert output.read_text() == (f'matrix={{"include":[]}}\nhas-cells=false\ncell-count=0\nplanned={{"include":[]}}\n'
                                  f'gpu-minutes=0\nmerge-base={base}\n')


def test_every_harness_pattern_has_a_code_owner():
    codeowners = (ROOT / ".github" / "CODEOWNERS").read_text(encoding="utf-8")
    for pattern in ("**/conftest.py", "**/pytest.ini", "**/pyproject.toml", "**/tox.ini", "**/setup.cfg", "*.pth",
                    "**/sitecustomize.py", "**/usercustomize.py"):
        assert f"\n{pattern} " in codeowners, pattern
    owned = [line.split()[0] for line in codeowners.splitlines() if line.strip() and not line.startswith("#")][1:]
    for harness in plan.HARNESS_PATHS:  # what plans every cell has its owner named, not only the catch-all's
        named = ("/" + harness[:-1] if harness.endswith("/*") else harness if harness == "*.pth"
                 else "**/" + harness[1:] if harness.startswith("*") else "/" + harness)
        assert any(named.startswith(pattern) for pattern in owned), harness  # /.github/workflows/ under /.github/


# ------------------------------------------------------------------------------------------------ GPU budget

CPU_ENTRY = {**ENTRY, "cell": "cpu_attn-fp8-cpu", "arch": "cpu", "runner": "ubuntu-latest"}
SM90 = {**ENTRY, "cell": "flashmla-fp8-sm90", "arch": "sm90", "runner": "gpu-sm90"}
# matrix/workloads.toml's deepseek-v2-lite and defaults (seconds per stage); kernels takes the default 3600
TIMEOUTS = {"flashinfer_mla-fp8-sm100": {"accuracy": 4800, "throughput": 9000},
            "flashmla-fp8-sm90": {"accuracy": 3600, "throughput": 7800}}


def test_each_gpu_cells_minutes_are_an_upper_bound_that_says_what_bounds_it():
    one_side = plan.GpuBudget(triggered=True, cap_minutes=None, sides=1, job_minutes=600)
    assert plan.gpu_minutes(SM90, TIMEOUTS["flashmla-fp8-sm90"], one_side) == (
        250.0, "upper bound: its stage timeouts")  # (3600 + 3600 + 7800) s
    assert plan.gpu_minutes({**SM90, "stages": ["kernels", "accuracy"]}, TIMEOUTS["flashmla-fp8-sm90"],
                            one_side) == (120.0, "upper bound: its stage timeouts")
    ab = plan.GpuBudget(triggered=True, cap_minutes=None, sides=2, job_minutes=240)
    assert plan.gpu_minutes(SM90, TIMEOUTS["flashmla-fp8-sm90"], ab) == (
        240.0, "upper bound: the cells job's timeout-minutes (240)")
    assert plan.gpu_minutes({**SM90, "stages": ["kernels"]}, {}, ab) == (
        120.0, "upper bound: its stage timeouts x 2 sides")


def test_the_cap_holds_back_the_cells_over_it_by_name_and_the_cpu_cells_always_run():
    matrix = {"include": [CPU_ENTRY, ENTRY, SM90]}
    budget = plan.GpuBudget(triggered=True, cap_minutes=300, sides=1, job_minutes=600)

    budgeted = plan.apply_gpu_budget(matrix, TIMEOUTS, budget)

    print(plan.summary(matrix, "reason", budgeted))
    assert [e["cell"] for e in budgeted.run] == ["cpu_attn-fp8-cpu", "flashinfer_mla-fp8-sm100"]  # 290 minutes
    assert budgeted.held == [{**SM90, "held_back": "not run: over the GPU-minutes cap (KVGATE_GPU_MINUTES_CAP = 300): "
                                                   "290 planned before it, 250 for it"}]
    assert budgeted.run_minutes == 290
    outputs = plan.outputs(matrix, budgeted)
    assert json.loads(outputs["matrix"]) == {"include": budgeted.run}
    assert json.loads(outputs["planned"])["include"][-1]["held_back"].startswith("not run: over the GPU-minutes cap")
    assert (outputs["has-cells"], outputs["cell-count"], outputs["gpu-minutes"]) == ("true", "2", "290")
    text = plan.summary(matrix, "reason", budgeted)
    assert "| `flashinfer_mla-fp8-sm100` | `gpu-sm100` | `deepseek-ai/DeepSeek-V2-Lite-Chat` | ≤ 290 (upper bound: " \
           "its stage timeouts) |" in text
    assert "| `cpu_attn-fp8-cpu` | `ubuntu-latest` | `deepseek-ai/DeepSeek-V2-Lite-Chat` | CPU |" in text
    assert ("GPU-minutes: at most 290 for 1 GPU cells (upper bounds, not measurements); held back: "
            "flashmla-fp8-sm90.") in text
    assert "| `flashmla-fp8-sm90` | ≤ 250 (upper bound: its stage timeouts) | not run: over the GPU-minutes cap" in text


def test_without_the_trigger_every_gpu_cell_is_held_back_with_how_to_run_it():
    budget = plan.GpuBudget(triggered=False, cap_minutes=None)
    budgeted = plan.apply_gpu_budget({"include": [CPU_ENTRY, ENTRY]}, TIMEOUTS, budget)
    assert [e["cell"] for e in budgeted.run] == ["cpu_attn-fp8-cpu"]
    assert [e["held_back"] for e in budgeted.held] == [
        "not run: the GPU cells run on a pull request only when a maintainer adds the label `kvgate-gpu` (add it, or add "
        "it again after a push took it away, to run them for the pull request's commit)"]
    assert plan.outputs({"include": [CPU_ENTRY, ENTRY]}, budgeted)["gpu-minutes"] == "0"


@pytest.mark.parametrize(("environ", "event", "expected"), [
    ({}, "pull_request", plan.GpuBudget(triggered=True, cap_minutes=None, sides=1, job_minutes=180)),
    ({"KVGATE_GPU": "false"}, "pull_request", plan.GpuBudget(triggered=False, cap_minutes=None)),
    ({"KVGATE_GPU": "false"}, "push", plan.GpuBudget(triggered=True, cap_minutes=None)),  # main's runs: every cell
    ({"KVGATE_GPU": "true", "KVGATE_GPU_MINUTES_CAP": "600", "KVGATE_SIDES": "2", "KVGATE_CELL_JOB_MINUTES": "240"},
     "pull_request", plan.GpuBudget(triggered=True, cap_minutes=600, sides=2, job_minutes=240)),
])
def test_the_budget_is_read_from_the_environment(environ, event, expected):
    assert plan.read_budget(environ, event) == expected


@pytest.mark.parametrize(("environ", "message"), [
    ({"KVGATE_GPU": "yes"}, "$KVGATE_GPU 'yes': expected true or false"),
    ({"KVGATE_GPU_MINUTES_CAP": "ten"}, "$KVGATE_GPU_MINUTES_CAP 'ten': expected a number of minutes >= 0 (the "
                                        "repository variable; leave it unset for no cap)"),
    ({"KVGATE_GPU_MINUTES_CAP": "-5"}, "$KVGATE_GPU_MINUTES_CAP '-5': expected a number of minutes >= 0 (the "
                                       "repository variable; leave it unset for no cap)"),
    ({"KVGATE_SIDES": "0"}, "$KVGATE_SIDES '0': expected a whole number >= 1"),
    # a ValueError traceback each: str.isdigit() takes '²', and int() refuses more than 4300 digits
    ({"KVGATE_SIDES": "²"}, "$KVGATE_SIDES '²': expected a whole number >= 1"),
    ({"KVGATE_CELL_JOB_MINUTES": "9" * 5000}, f"$KVGATE_CELL_JOB_MINUTES {'9' * 40!r}: expected a whole number >= 1"),
])
def test_a_bad_budget_setting_is_one_error(environ, message):
    with pytest.raises(plan.PlanError) as error:
        plan.read_budget(environ, "pull_request")
    assert str(error.value) == message


def test_the_planned_cells_timeouts_come_from_the_trusted_matrix():
    from kvgate.matrix import cells as kvmatrix
    from kvgate.runners.matrix_run import DEFAULT_TIMEOUT_SECONDS

    assert plan.DEFAULT_STAGE_TIMEOUT_S == DEFAULT_TIMEOUT_SECONDS  # the kernels stage's timeout
    cell = kvmatrix.load(ROOT / "matrix").cell("flashmla-fp8-sm90")
    assert plan.workload_timeouts({"include": [SM90]}) == {"flashmla-fp8-sm90": dict(cell.workload.timeouts)}


@pytest.mark.parametrize(("sessions", "run_dir_is_a_file", "message"), [
    ("[" * 100_000, False, "$KVGATE_SESSIONS: not a JSON list of nox session names"),  # RecursionError before
    ("[" + "9" * 5000 + "]", False, "$KVGATE_SESSIONS: not a JSON list of nox session names"),  # ValueError before
    ('["cell(x)"]', True, "is not a folder. Point it at the folder the artifact uploads"),  # FileExistsError before
])
def test_the_cell_job_says_a_bad_environment_in_one_line_not_a_traceback(tmp_path, sessions, run_dir_is_a_file,
                                                                         message):
    run_dir = tmp_path / "run"
    if run_dir_is_a_file:
        run_dir.write_text("x")
    env = {**os.environ, "KVGATE_CELL": "x", "KVGATE_SESSIONS": sessions, "KVGATE_RUN_DIR": str(run_dir),
           "KVGATE_NOX": "true", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-I", str(ROOT / "ci" / "cell_job.py")], env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("ERROR ") and result.stderr.count("\n") == 1 and message in result.stderr


def test_a_cell_job_results_folder_under_a_file_is_one_error_line(tmp_path):
    """$KVGATE_RUN_DIR naming a folder under a file was a NotADirectoryError traceback."""
    (tmp_path / "file").write_text("x")
    run_dir = tmp_path / "file" / "run"
    env = {**os.environ, "KVGATE_CELL": "x", "KVGATE_SESSIONS": '["cell(x)"]', "KVGATE_RUN_DIR": str(run_dir),
           "KVGATE_NOX": "true", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-I", str(ROOT / "ci" / "cell_job.py")], env=env, capture_output=True,
                            text=True, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", (
        f"ERROR $KVGATE_RUN_DIR: {str(run_dir)!r} cannot be made (Not a directory). Point it at the folder the "
        "artifact uploads\n"))


@pytest.mark.parametrize("variable", ["GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY"])
def test_a_step_file_that_cannot_be_written_is_one_error_line(tmp_path, variable):
    """A $GITHUB_OUTPUT or $GITHUB_STEP_SUMMARY naming a folder was an IsADirectoryError traceback, and one naming a
    FIFO that nothing reads blocked the plan for ever; now each is one line naming the variable and the fix, exit 2,
    and what the other step file held already is kept."""
    listing = tmp_path / "changed.txt"
    listing.write_text("docs/index.md\n")
    other = tmp_path / "other.txt"
    other.write_text("earlier=1\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, why in ((tmp_path, "it is a folder"), (fifo, "it is a FIFO or socket that nothing reads")):
        env = {**os.environ, "GITHUB_OUTPUT": str(other), "GITHUB_STEP_SUMMARY": str(other), variable: str(target)}
        result = subprocess.run([sys.executable, "-I", "ci/plan.py", "--event", "pull_request", "--changed-files",
                                 str(listing)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                                check=False)
        assert (result.returncode, result.stdout, result.stderr) == (2, "", (
            f"ERROR ${variable} {target}: cannot append to it ({why}). Point it at a file this job may write (GitHub "
            "Actions sets it for each step), or unset it\n"))
        assert other.read_text().startswith("earlier=1\n")
