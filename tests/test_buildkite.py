"""`kvgate matrix --format buildkite` and `--format buildkite-vllm`: kvgate in vLLM's own Buildkite CI.

The pipeline is checked against Buildkite's published schema (ci/buildkite/schema/, a copy with its source and
licence); the step file against vLLM's own step loader (tests/fixtures/buildkite/vllm/step_loader.py, a copy of
vllm-project/ci-infra's, which also reads real vLLM step files here); the cells against the GitHub plan's.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest

from ci_scripts import load_ci_script
from kvgate.cli import main as kvgate_main
from kvgate.matrix import buildkite
from kvgate.matrix import cells as kvmatrix
from kvgate.runners.environment.ci import ci_branch

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "ci" / "buildkite" / "schema" / "schema.json"
VLLM_FIXTURES = ROOT / "tests" / "fixtures" / "buildkite" / "vllm"
REPOSITORY = "https://github.com/example/kvgate.git"
KVGATE_REF = "0123456789abcdef0123456789abcdef01234567"
MERGE_BASE = "89abcdef0123456789abcdef0123456789abcdef"
RUN = ("--kvgate-repository", REPOSITORY, "--kvgate-ref", KVGATE_REF)
# The archs matrix/buildkite.toml gives a queue (sm120 has none in vLLM's CI).
QUEUED_ARCHS = ("--arch", "sm80", "--arch", "sm89", "--arch", "sm90", "--arch", "sm100", "--arch", "cpu")
# A compiled path only CUTLASS_MLA's sources claim, and vLLM's shared FP8 quantization kernels (every cell).
CUTLASS_ONLY = "csrc/attention/mla/sm100_cutlass_mla_kernel.cu"

gate_job = load_ci_script("gate_job")
cell_job = load_ci_script("cell_job")
ci_facts = sys.modules["ci_facts"]  # what both scripts import
VLLM_SHA = "f" * 40
# The variables Buildkite sets in every job (buildkite.com/docs/pipelines/configure/environment-variables)
BUILDKITE_PUSH = {"BUILDKITE": "true", "BUILDKITE_BRANCH": "main", "BUILDKITE_PULL_REQUEST": "false",
                  "BUILDKITE_COMMIT": VLLM_SHA, "BUILDKITE_REPO": "https://github.com/vllm-project/vllm.git",
                  "BUILDKITE_BUILD_URL": "https://buildkite.com/vllm/ci/builds/7", "BUILDKITE_SOURCE": "webhook",
                  "BUILDKITE_AGENT_NAME": "gpu-h200-3"}


@pytest.fixture(scope="module")
def loader():
    pytest.importorskip("pydantic", reason="vLLM's step loader is a pydantic model (the engine environment has it)")
    sys.path.insert(0, str(VLLM_FIXTURES))
    try:
        import step_loader
    finally:
        sys.path.remove(str(VLLM_FIXTURES))
    return step_loader


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = kvgate_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def emit(capsys, *argv: str) -> dict:
    code, out, err = run_cli(capsys, "matrix", "--format", "buildkite", *RUN, "--vllm-base", MERGE_BASE, *argv)
    assert code == 0, err
    return json.loads(out)


def schema_errors(validator: jsonschema.Draft7Validator, document: dict) -> list[str]:
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(document)]


def command_steps(document: dict) -> list[dict]:
    return [step for step in document["steps"] if isinstance(step, dict) and "commands" in step]


def test_the_pipeline_of_every_queued_cell_validates_against_buildkites_schema(capsys, validator):
    document = emit(capsys, *QUEUED_ARCHS)
    assert len(command_steps(document)) > 40  # every cell of five archs, and the gate
    assert schema_errors(validator, document) == []


def test_a_pipeline_with_no_cell_is_the_gate_alone_and_validates(validator):
    matrix = kvmatrix.load(ROOT / "matrix")
    queues = buildkite.load_queues(ROOT / "matrix", matrix)
    run = buildkite.BuildkiteRun(kvgate_repository=REPOSITORY, kvgate_ref=KVGATE_REF, merge_base=MERGE_BASE)
    document = buildkite.pipeline({"include": []}, queues, run)
    assert schema_errors(validator, document) == []
    gate = document["steps"][-1]
    assert gate["key"] == "kvgate-gate" and "depends_on" not in gate
    assert json.loads(gate["env"]["PLANNED_MATRIX"]) == {"include": []}  # ci/gate_job.py: "nothing to check", a pass


def test_the_schema_check_fails_a_step_buildkite_would_refuse(capsys, validator):
    """The validation can fail: a vLLM-only key in an uploaded command step, a soft_fail Buildkite does not know."""
    document = emit(capsys, "--cell", "flashmla-fp8-sm90")
    document["steps"][0]["source_file_dependencies"] = ["vllm/"]
    assert schema_errors(validator, document)
    document = emit(capsys, "--cell", "flashmla-fp8-sm90")
    document["steps"][-1]["soft_fail"] = "sometimes"
    assert schema_errors(validator, document)


def test_every_planned_cell_has_one_step_on_its_arch_queue(capsys):
    code, out, err = run_cli(capsys, "matrix", "--format", "gha", *QUEUED_ARCHS)
    assert code == 0, err
    plan = json.loads(out)["include"]
    document = emit(capsys, *QUEUED_ARCHS)
    cells = command_steps(document)[:-1]
    queues = buildkite.load_queues(ROOT / "matrix", kvmatrix.load(ROOT / "matrix")).by_arch
    assert [step["label"] for step in cells] == [entry["cell"] for entry in plan]
    for step, entry in zip(cells, plan, strict=True):
        assert step["key"] == f"kvgate-cell-{entry['cell']}"
        assert step["agents"] == {"queue": queues[entry["arch"]]}
        assert step["env"]["KVGATE_SESSIONS"] == json.dumps(entry["sessions"])
        commands = "\n".join(step["commands"])
        # in a folder of its own, made empty, never the change's checkout; Python isolated
        assert step["commands"][:3] == ['checkout="$$PWD"', 'work="$$(mktemp -d)"', 'cd "$$work"']
        assert 'git -C "$$checkout" worktree add --force --detach "$$work/vllm-base" "$$KVGATE_MERGE_BASE"' in commands
        assert "python3 -I .kvgate/ci/fetch_vllm_wheels.py" in commands
        assert f"mkdir kvgate-cell-{entry['cell']}\n" in commands  # the results folder starts empty
        assert "python3 -I .kvgate/ci/cell_job.py || status=$$?" in commands
        assert ".kvgate-venv/bin/python -I -m pip install" in commands and "python3 -m pip" not in commands
        assert step["commands"][-3:] == [f'buildkite-agent artifact upload "kvgate-cell-{entry["cell"]}/**/*"',
                                         'git -C "$$checkout" worktree remove --force "$$work/vllm-base" || true',
                                         'exit "$$status"']


def test_the_gate_judges_after_every_cell_even_a_failed_one_and_never_soft_fails(capsys):
    code, out, err = run_cli(capsys, "matrix", "--format", "gha", "--arch", "sm100")
    assert code == 0, err
    document = emit(capsys, "--arch", "sm100")
    *cells, wait, gate = document["steps"]
    assert wait == {"wait": None, "continue_on_failure": True}
    assert gate["depends_on"] == [step["key"] for step in cells]
    assert gate["allow_dependency_failure"] is True
    assert not any("soft_fail" in step for step in document["steps"])
    assert json.loads(gate["env"]["PLANNED_MATRIX"]) == json.loads(out)  # what ci/gate_job.py requires, stages too
    assert gate["agents"] == {"queue": "small_cpu_queue_premerge"}
    commands = "\n".join(gate["commands"])
    assert gate["commands"][:3] == ['checkout="$$PWD"', 'work="$$(mktemp -d)"', 'cd "$$work"']
    # the artifact and run folders start empty: mkdir fails on one that is there (Buildkite runs with bash -e)
    assert 'mkdir kvgate-artifacts kvgate-run\nbuildkite-agent artifact download "kvgate-cell-*" kvgate-artifacts/' \
        in commands
    assert 'ARTIFACTS_DIR="$$work/kvgate-artifacts" KVGATE_RUN_DIR="$$work/kvgate-run" python3 -I ' \
           ".kvgate/ci/gate_job.py" in commands
    # the report folded to fit Buildkite's 1 MiB annotation (ci/gate_job.py writes it), the whole one an artifact
    assert 'buildkite-agent annotate --style "$$style" --context kvgate < kvgate-run/gate/annotation.md' in commands
    assert buildkite.ANNOTATION_FILE == gate_job.ANNOTATION_FILE
    assert 'buildkite-agent artifact upload "kvgate-run/gate/**/*"' in commands
    assert gate["commands"][-1] == 'exit "$$status"'
    assert document["env"] == {"KVGATE_REPOSITORY": REPOSITORY, "KVGATE_REF": KVGATE_REF,
                               "KVGATE_MERGE_BASE": MERGE_BASE}


def test_an_arch_without_a_queue_is_one_error_naming_the_fix(capsys):
    code, out, err = run_cli(capsys, "matrix", "--format", "buildkite", *RUN, "--vllm-base", MERGE_BASE,
                             "--cell", "triton_mla-auto-sm120")
    assert (code, out) == (2, "")
    assert err == ("ERROR matrix/buildkite.toml: no Buildkite agent queue for arch 'sm120' (cell triton_mla-auto-sm120) "
                   "in queues. Add `sm120 = \"<queue>\"` under [queues], or leave the arch out with `--arch`\n")


@pytest.mark.parametrize("queue", ["${BUILDKITE_AGENT_ACCESS_TOKEN}$(id)", "gpu\nqueue", "<script>", ""])
def test_a_queue_name_that_buildkite_would_interpolate_or_break_on_is_refused(capsys, tmp_path, queue):
    """buildkite.toml's queue names went into `agents.queue` as written: `${...}` reached upload interpolation."""
    shutil.copytree(ROOT / "matrix", tmp_path / "matrix")
    path = tmp_path / "matrix" / "buildkite.toml"
    text = path.read_text()
    assert 'sm90 = "mithril-h100-pool"' in text
    path.write_text(text.replace('sm90 = "mithril-h100-pool"', f"sm90 = {json.dumps(queue)}", 1))
    code, out, err = run_cli(capsys, "matrix", "--matrix-dir", str(tmp_path / "matrix"), "--format", "buildkite",
                             *RUN, "--vllm-base", MERGE_BASE, "--cell", "flashmla-fp8-sm90")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "in queues.sm90" in err
    assert ("has characters a queue name cannot hold" in err) if queue else ("expected a non-empty string" in err)


@pytest.mark.parametrize(("argv", "message"), [
    (("--kvgate-ref", KVGATE_REF, "--vllm-base", MERGE_BASE),
     "ERROR --kvgate-repository: missing: --format buildkite needs it. Name the kvgate repository the steps clone, "
     "e.g. https://github.com/OWNER/kvgate.git"),
    (("--kvgate-repository", "https://x/k.git; rm -rf /", "--kvgate-ref", KVGATE_REF, "--vllm-base", MERGE_BASE),
     "ERROR --kvgate-repository: 'https://x/k.git; rm -rf /' is not a git URL. Name the kvgate repository the steps "
     "clone, e.g. https://github.com/OWNER/kvgate.git"),
    (("--kvgate-repository", REPOSITORY, "--kvgate-ref", "main", "--vllm-base", MERGE_BASE),
     "ERROR --kvgate-ref: 'main' is not a full 40-character commit SHA. Pin kvgate to a commit (a branch or tag "
     "could move under the gate)"),
    (("--kvgate-repository", REPOSITORY, "--kvgate-ref", KVGATE_REF),
     "ERROR --vllm-base: missing: --format buildkite needs it. Pass the vLLM merge base as a SHA: "
     "`git merge-base origin/main HEAD`"),
])
def test_what_the_steps_run_is_pinned_or_refused(capsys, argv, message):
    code, out, err = run_cli(capsys, "matrix", "--format", "buildkite", "--arch", "sm90", *argv)
    assert (code, out, err) == (2, "", message + "\n")


def test_every_missing_flag_is_named_at_once_and_help_marks_them_required(capsys):
    code, out, err = run_cli(capsys, "matrix", "--format", "buildkite", "--arch", "sm90")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "ERROR --kvgate-repository: missing: --format buildkite needs it. Name the kvgate repository the steps clone, "
        "e.g. https://github.com/OWNER/kvgate.git",
        "ERROR --kvgate-ref: missing: --format buildkite needs it. Pin kvgate to a commit (a branch or tag could move "
        "under the gate)",
        "ERROR --vllm-base: missing: --format buildkite needs it. Pass the vLLM merge base as a SHA: `git merge-base "
        "origin/main HEAD`"]
    code, _, err = run_cli(capsys, "matrix", "--format", "buildkite-vllm")
    assert code == 2 and [line.split(":")[0] for line in err.splitlines()] == ["ERROR --kvgate-repository",
                                                                             "ERROR --kvgate-ref"]
    with pytest.raises(SystemExit):
        kvgate_main(["matrix", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for flag in ("--kvgate-repository URL required with --format buildkite and buildkite-vllm",
                 "--kvgate-ref SHA required with --format buildkite and buildkite-vllm",
                 "required with --format buildkite: the merge base"):
        assert flag in shown


def test_a_changed_file_selects_the_same_cells_as_the_github_plan(capsys, tmp_path):
    changed = tmp_path / "changed.txt"
    for paths, expected in (([CUTLASS_ONLY], {"cutlass_mla-auto-sm100", "cutlass_mla-fp8-sm100"}),
                            (["docs/features/quantization/quantized_kvcache.md"], set()),
                            (["csrc/cpu/attention.cpp", CUTLASS_ONLY], None)):
        changed.write_text("\n".join(paths) + "\n", encoding="utf-8")
        code, out, err = run_cli(capsys, "matrix", "--format", "gha", "--changed-files", str(changed), *QUEUED_ARCHS)
        assert code == 0, err
        planned = [entry["cell"] for entry in json.loads(out)["include"]]
        document = emit(capsys, "--changed-files", str(changed), *QUEUED_ARCHS)
        assert [step["label"] for step in command_steps(document)[:-1]] == planned
        if expected is not None:
            assert set(planned) == expected
        else:
            assert {"cutlass_mla-fp8-sm100", "cpu_attn-fp8-cpu"} <= set(planned)


def test_the_cli_prints_json_that_yaml_reads_the_same(capsys):
    """kvgate's core environment has no YAML library; JSON is YAML, and Buildkite and vLLM's loader read YAML."""
    yaml = pytest.importorskip("yaml")
    for format_ in ("buildkite", "buildkite-vllm"):
        code, out, err = run_cli(capsys, "matrix", "--format", format_, *RUN, "--vllm-base", MERGE_BASE, "--arch", "cpu")
        assert code == 0, err
        assert yaml.safe_load(out) == json.loads(out)


def vllm_step_file(capsys) -> dict:
    code, out, err = run_cli(capsys, "matrix", "--format", "buildkite-vllm", *RUN)
    assert code == 0, err
    return json.loads(out)


def test_the_loader_copy_reads_real_vllm_step_files(loader):
    """The copy is vLLM's loader: it reads vLLM's own files, the current test_areas/ layout and the older
    test-pipeline.yaml, as vLLM's generator does (a file's depends_on given to each step, its path appended)."""
    job_dir = VLLM_FIXTURES
    steps = {step.label: step for step in loader.read_steps_from_job_dir(str(job_dir))}
    attention = steps["V1 attention (H100)"]
    assert attention.group == "Attention" and attention.depends_on == ["image-build"]
    assert attention.working_dir == "/vllm-workspace/tests"
    assert attention.source_file_dependencies[:2] == ["vllm/v1/attention", "tests/v1/attention"]
    assert steps["LM Eval Large Models (4 GPUs)(A100)"].device == "a100"
    assert steps["LM Eval Large Models (4 GPUs)(A100)"].num_devices == 4
    kernels = steps["Kernels Attention Test %N"]
    assert kernels.parallelism == 2 and kernels.depends_on is None  # test-pipeline.yaml: no file-level depends_on
    assert loader._source_file_dependencies_match(kernels.source_file_dependencies, ["csrc/attention/x.cu"])
    assert not loader._source_file_dependencies_match(kernels.source_file_dependencies, ["csrc/attention.cu"])


def test_the_vllm_step_file_round_trips_through_vllms_step_loader(capsys, loader, tmp_path):
    document = vllm_step_file(capsys)
    (step,) = document["steps"]
    unknown = set(step) - set(loader.Step.model_fields)
    assert unknown == set()  # vLLM's model ignores unknown keys: one would be dropped without a word
    assert loader.Step(**step).model_dump(exclude_unset=True) == step
    job_dir = tmp_path / ".buildkite" / "test_areas"
    job_dir.mkdir(parents=True)
    (job_dir / "kvgate.yaml").write_text(json.dumps(document, indent=2), encoding="utf-8")
    shutil.copy(VLLM_FIXTURES / "attention.yaml", job_dir)
    loaded = {s.label: s for s in loader.read_steps_from_job_dir(str(job_dir))}
    ours = loaded["kvgate: FP8 KV cache gate"]
    assert (ours.group, ours.key, ours.depends_on, ours.device) == ("kvgate", "kvgate-plan", ["image-build"],
                                                                    "cpu-small")
    assert ours.no_plugin and ours.working_dir == "$$BUILDKITE_BUILD_CHECKOUT_PATH"  # not the image's tests/
    assert ours.source_file_dependencies[:-1] == step["source_file_dependencies"]
    assert ours.commands == step["commands"] and ours.commands[-1] == \
        "buildkite-agent pipeline upload kvgate-pipeline.json"
    assert "V1 attention (H100)" in loaded


def test_every_path_that_selects_a_cell_makes_vllms_generator_run_the_step(capsys, loader):
    """kvgate's selection rules, in vLLM's prefix form: a Python module of vllm (the import graph decides which
    cells), each backend's compiled sources and the shared ones; what selects no cell (docs) does not run it."""
    from kvgate.change.selection import select

    matrix = kvmatrix.load(ROOT / "matrix")
    dependencies = vllm_step_file(capsys)["steps"][0]["source_file_dependencies"]
    globs = [*matrix.shared_sources, *(glob for backend in matrix.backends.values() for glob in backend.sources)]
    paths = [re.sub(r"\*\*?", "x", glob).replace("?", "x") for glob in globs]
    paths += ["vllm/v1/attention/backends/mla/flashmla.py", "vllm/_custom_ops.py"]
    for path in paths:
        assert loader._source_file_dependencies_match(dependencies, [path]), path
    compiled = [path for path in paths if not path.startswith("vllm/") or path.startswith("vllm/vllm_flash_attn/")]
    for path in compiled:
        assert select(matrix, [path], list(matrix.cells)).cells, f"{path} selects no cell"
    for inert in ("docs/features/quantization/quantized_kvcache.md", "tests/kernels/attention/test_cache.py"):
        assert not loader._source_file_dependencies_match(dependencies, [inert])
        assert not select(matrix, [inert], list(matrix.cells)).cells


def test_the_step_file_asks_only_for_archs_with_a_queue(capsys):
    command = next(c for c in vllm_step_file(capsys)["steps"][0]["commands"] if c.startswith("nox "))
    assert re.findall(r"--arch (\S+)", command) == ["sm80", "sm89", "sm90", "sm100", "cpu"]
    assert f"--kvgate-repository {REPOSITORY} --kvgate-ref {KVGATE_REF}" in command


def test_the_readme_shows_the_step_file_kvgate_writes_and_the_three_lines_it_runs(capsys):
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "ci" / "buildkite" / "README.md").read_text(encoding="utf-8")
    shown = yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    code, out, err = run_cli(capsys, "matrix", "--format", "buildkite-vllm", "--kvgate-repository",
                             "https://github.com/OWNER/kvgate.git", "--kvgate-ref", "0123456789abcdef0123456789abcdef01234567")
    assert code == 0, err
    assert shown == json.loads(out)
    three = text.split("**The three lines**", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    commands = [c.replace("$$", "$") for c in shown["steps"][0]["commands"]]
    assert three[0] == "MERGE_BASE=$(git merge-base FETCH_HEAD HEAD)" == commands[1]
    assert three[1].startswith("nox -f .kvgate/noxfile.py -s matrix -- --format buildkite --vllm-git")
    assert re.findall(r"--arch (\S+)", three[1]) == re.findall(r"--arch (\S+)", commands[-2])
    assert three[2] == commands[-1] == "buildkite-agent pipeline upload kvgate-pipeline.json"


# ------------------------------------------------------------------------------ run.json and the annotation

@pytest.mark.parametrize(("environ", "branch"), [
    (BUILDKITE_PUSH, "main"),
    ({**BUILDKITE_PUSH, "BUILDKITE_SOURCE": "schedule", "BUILDKITE_BRANCH": "release-0.26"}, "release-0.26"),
    # a pull request's build: its branch (a fork's may be called main) is not main's
    ({**BUILDKITE_PUSH, "BUILDKITE_PULL_REQUEST": "4242"}, None),
    ({"GITHUB_REF": "refs/heads/main", "GITHUB_EVENT_NAME": "push"}, "main"),
    ({"GITHUB_REF": "refs/pull/7/merge", "GITHUB_EVENT_NAME": "pull_request"}, None),
    ({"GITHUB_REF": "refs/heads/main", "GITHUB_EVENT_NAME": "schedule"}, "main"),
    ({"GITHUB_REF": "refs/heads/main", "GITHUB_EVENT_NAME": "workflow_dispatch"}, "main"),
    # a run that serves a pull request or a comment while GITHUB_REF names the default branch is not main's: a caller
    # of kvgate-vllm.yml on pull_request_target would otherwise record a pull request's results as main's history
    ({"GITHUB_REF": "refs/heads/main", "GITHUB_EVENT_NAME": "pull_request_target"}, None),
    ({"GITHUB_REF": "refs/heads/main", "GITHUB_EVENT_NAME": "issue_comment"}, None),
    ({"GITHUB_REF": "refs/heads/main", "GITHUB_EVENT_NAME": "pull_request_review_comment"}, None),
    ({"GITHUB_REF": "refs/heads/main", "GITHUB_EVENT_NAME": "workflow_run"}, None),
    # a Buildkite build that does not say it is no pull request's is not counted as main's
    ({"BUILDKITE": "true", "BUILDKITE_BRANCH": "main"}, None),
    ({**BUILDKITE_PUSH, "BUILDKITE_PULL_REQUEST": ""}, None),
    ({}, None),
])
def test_run_json_names_the_branch_of_a_push_build_on_either_ci_by_one_rule(environ, branch):
    """The CI jobs' run.json (ci/ci_facts.py) and the runners' (kvgate.runners.run_record) name the same branch: the
    gate records a run whose branch is main into the history of main."""
    assert ci_facts.branch(environ) == ci_branch(environ) == branch


def test_on_buildkite_run_json_says_buildkite_with_the_builds_commit_and_branch():
    assert cell_job.run_info({**BUILDKITE_PUSH, "KVGATE_CELL": "flashmla-fp8-sm90"}) == {
        "contract_version": 1, "source": "buildkite", "commit": VLLM_SHA,
        "repository": "https://github.com/vllm-project/vllm.git", "build_url": "https://buildkite.com/vllm/ci/builds/7",
        "event": "webhook", "runner": "gpu-h200-3", "branch": "main", "cell": "flashmla-fp8-sm90"}
    merged = gate_job.merged_run_info(gate_job.Assembly(), {**BUILDKITE_PUSH, "BUILDKITE_COMMIT": "HEAD"}, ["base", "head"])
    assert merged["source"] == "buildkite" and merged["branch"] == "main" and merged["sides"] == ["base", "head"]
    assert "commit" not in merged  # Buildkite's HEAD before a checkout names no commit
    github = gate_job.merged_run_info(gate_job.Assembly(), {"GITHUB_SHA": "b" * 40, "GITHUB_REF": "refs/heads/main",
                                                            "GITHUB_EVENT_NAME": "schedule"}, [])
    assert github == {"contract_version": 1, "source": "github-actions", "commit": "b" * 40, "event": "schedule",
                      "branch": "main"}


def test_on_buildkite_the_gate_job_writes_the_annotation(tmp_path):
    """A gate job that ends early (here its plan failed) annotates the build with its report too."""
    environ = {**BUILDKITE_PUSH, "KVGATE_RUN_DIR": str(tmp_path / "run"), "PLAN_RESULT": "failure"}
    assert gate_job.run(environ) == 1
    gate = tmp_path / "run" / "gate"
    assert (gate / "annotation.md").read_text() == (gate / "report.md").read_text()
    assert "## kvgate: plan failed" in (gate / "annotation.md").read_text()
    assert gate_job.run({**environ, "KVGATE_RUN_DIR": str(tmp_path / "github"), "BUILDKITE": ""}) == 1
    assert not (tmp_path / "github" / "gate" / "annotation.md").exists()


def test_the_annotation_of_a_report_too_long_folds_it_to_fit_and_keeps_every_table_whole(tmp_path):
    """A judged A/B run of 52 cells with regressions planted; its report.md folded to an annotation of a tenth of its
    size (the gate's, under Buildkite's 1 MiB: the same folding at any limit): UTF-8 bytes, never inside a table."""
    from kvgate.report import render_all
    from test_report_grid import judge_ab, planted_ab_run, table_rows_are_whole

    report = render_all(judge_ab(planted_ab_run(tmp_path / "run", 52)[0]))["report.md"].decode()
    assert gate_job.annotation(report) == report  # it fits Buildkite's limit as it is
    limit = len(report.encode()) // 10
    folded = gate_job.annotation(report, limit)
    print(len(report.encode()), limit, len(folded.encode()))
    assert len(folded.encode()) <= limit
    assert folded.splitlines()[0] == report.splitlines()[0]  # the headline, then the grid
    assert "| **sm80** |" in folded and not table_rows_are_whole(folded)
    assert "folded to fit the annotation; see kvgate-run/gate/report.md in this build's artifacts" in folded


# ------------------------------------------------------------------------------ strings from a change

def buildkite_interpolated(text: str, environ: dict[str, str]) -> str:
    """What `buildkite-agent pipeline upload` makes of a string (Buildkite's "environment variable substitution":
    `$$` and `\\$` are a `$`; `$VAR`, `${VAR}` and `${VAR:-default}` take the variable's value, else empty or the
    default)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i) or text.startswith("\\$", i):
            out.append("$")
            i += 2
        elif text[i] == "$" and text[i + 1:i + 2] == "{":
            end = text.index("}", i)
            name, _, default = text[i + 2:end].partition(":-")
            out.append(environ.get(name, default))
            i = end + 1
        elif text[i] == "$" and re.match(r"[A-Za-z_]", text[i + 1:i + 2] or " "):
            name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[i + 1:]).group(0)
            out.append(environ.get(name, ""))
            i += 1 + len(name)
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def test_attack_a_changed_path_with_an_interpolation_reaches_the_gate_unchanged(capsys, tmp_path, validator):
    """A path of the change is data: Buildkite interpolates `${...}` at upload, so every `$` from a change is `$$` in
    the pipeline, and the gate job reads the path the change named, never an agent's secret."""
    hostile = "csrc/${BUILDKITE_AGENT_ACCESS_TOKEN}/$HOME/x.cu"
    changed = tmp_path / "changed.txt"
    changed.write_text(hostile + "\n", encoding="utf-8")
    document = emit(capsys, "--changed-files", str(changed), "--arch", "sm100")
    assert schema_errors(validator, document) == []
    gate = command_steps(document)[-1]
    assert "$${BUILDKITE_AGENT_ACCESS_TOKEN}/$$HOME" in gate["env"]["PLANNED_MATRIX"]
    agent = {"BUILDKITE_AGENT_ACCESS_TOKEN": "secret-token", "HOME": "/root"}
    planned = json.loads(buildkite_interpolated(gate["env"]["PLANNED_MATRIX"], agent))
    assert {entry["selected_by"] for entry in planned["include"]} == {hostile}
    for step in command_steps(document):  # nothing else of the pipeline turns into an agent's variable either
        for value in [*step.get("env", {}).values(), *step["commands"], step["label"]]:
            assert "secret-token" not in buildkite_interpolated(value, agent)


def test_the_emitted_pipeline_is_validated_against_the_shipped_schema_before_it_is_printed(monkeypatch, capsys):
    """kvgate matrix --format buildkite checks its own output against ci/buildkite/schema (shipped in the package as
    kvgate/matrix/buildkite_schema.json): a pipeline Buildkite would refuse is one ERROR line and no output."""
    from kvgate.cli import matrix_command

    assert matrix_command.BUILDKITE_SCHEMA.read_bytes() == SCHEMA.read_bytes()
    real = buildkite.pipeline
    monkeypatch.setattr(buildkite, "pipeline", lambda *a, **k: {**real(*a, **k), "steps": "not a list"})
    code, out, err = run_cli(capsys, "matrix", "--format", "buildkite", *RUN, "--vllm-base", MERGE_BASE,
                             "--arch", "sm100")
    assert (code, out) == (2, "")
    assert err.startswith("ERROR kvgate matrix --format buildkite: the pipeline breaks Buildkite's schema: ") \
        and err.count("\n") == 1
