"""The matrix as Buildkite wants it, in vLLM's CI conventions: a pipeline to upload and the step that uploads it.

Two documents, both JSON (a YAML document too, which is what Buildkite and vLLM's step loader read; kvgate's core
environment has no YAML library):

    pipeline(plan, queues, run)      the pipeline `buildkite-agent pipeline upload` takes: one command step per planned
                                     cell (the GitHub plan's `{"include": [...]}`, so the same cells a change selects),
                                     on its arch's agent queue, running head and base from vLLM's per-commit wheels
                                     (ci/fetch_vllm_wheels.py, ci/cell_job.py) and uploading its results with
                                     `buildkite-agent artifact upload`; a `wait`; then the gate step, which downloads
                                     them, runs ci/gate_job.py (a planned cell with no results fails), annotates the
                                     build with the report folded to fit an annotation (`buildkite-agent annotate
                                     --style error|success`), uploads the gate folder as artifacts and exits
                                     with the gate's status. The gate runs when a cell failed (allow_dependency_failure)
                                     and is never soft_fail.
    vllm_step_file(matrix, queues, run)  a step file in vLLM's `.buildkite/test_areas/` conventions (group, depends_on
                                     image-build, source_file_dependencies, device), read by vLLM's pipeline
                                     generator: one step that plans the change with kvgate's own selection and uploads
                                     that pipeline. Its source_file_dependencies are the paths that can select a cell.

The agent queue per arch and the gate's come from matrix/buildkite.toml (`load_queues`). Stdlib only, pure but for
reading that file.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate import InputError, InputErrors
from kvgate.matrix.cells import Matrix
from kvgate.matrix.toml_reading import TomlReader, read_toml, shown_path

QUEUES_FILE = "buildkite.toml"
CELL_KEY_PREFIX = "kvgate-cell-"  # also the artifact folder ci/gate_job.py reads (its ARTIFACT_PREFIX)
GATE_KEY = "kvgate-gate"
PLAN_KEY = "kvgate-plan"
CELL_TIMEOUT_MINUTES = 240  # as kvgate-vllm.yml's cells job
GATE_TIMEOUT_MINUTES = 30
PLAN_TIMEOUT_MINUTES = 20
ANNOTATION_CONTEXT = "kvgate"
ANNOTATION_FILE = "annotation.md"  # ci/gate_job.py's ANNOTATION_FILE: the report, folded to fit an annotation
# vLLM's generator retries a job whose agent was lost (exit status -1) once; so do the cells.
AGENT_LOST_RETRY = {"automatic": [{"exit_status": -1, "limit": 1}]}
_SHA = re.compile(r"[0-9a-f]{40}")
# A git URL the steps' shell reads as one word: no quotes, spaces, `$` or other characters a shell interprets.
_REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9@:/._~+-]*")
_GLOB_CHARACTERS = re.compile(r"[*?\[]")
# Buildkite interpolates $VAR when the pipeline is uploaded; `$$` leaves a `$` for the job's own shell.
# Each step starts in the checkout of the change (vLLM's pull request), which may hold anything: a pip/ or nox/ that
# `python -m` would import first, a kvgate-cell-*/ of made-up results. So kvgate's steps work in a folder of their own,
# made empty (mktemp), with kvgate, its Python environment and its results inside it, and run Python isolated (-I:
# neither the current folder nor PYTHON* variables reach its import path); `checkout` names the change's folder.
_NEUTRAL_FOLDER = ['checkout="$$PWD"', 'work="$$(mktemp -d)"', 'cd "$$work"']
_KVGATE_PYTHON = [  # nox, hash-checked, in a virtual environment of the work folder, first on PATH
    "python3 -I -m venv .kvgate-venv",
    ".kvgate-venv/bin/python -I -m pip install --quiet --require-hashes --only-binary :all: "
    "-r .kvgate/ci/requirements-nox.txt",
    'export PATH="$$work/.kvgate-venv/bin:$$PATH"',
]
_KVGATE_CHECKOUT = [
    *_NEUTRAL_FOLDER,
    'git clone --quiet "$$KVGATE_REPOSITORY" .kvgate',
    'git -C .kvgate checkout --quiet --detach "$$KVGATE_REF"',
    *_KVGATE_PYTHON,
]


def literal(value: Any) -> Any:
    """A value Buildkite uploads as it is: every `$` of its strings doubled, so `${...}` or `$VAR` from a change (a
    changed path, the plan built from it) is never interpolated at upload."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, Mapping):
        return {literal(key): literal(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [literal(item) for item in value]
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildkiteQueues:
    """matrix/buildkite.toml: the agent queue of each arch's cells, and of the gate step."""

    by_arch: Mapping[str, str]
    gate: str
    source: str = f"matrix/{QUEUES_FILE}"

    def queue_for(self, arch: str, cell_id: str) -> str:
        if arch not in self.by_arch:
            raise InputError(self.source, f"no Buildkite agent queue for arch '{arch}' (cell {cell_id})", "queues",
                             hint=f"Add `{arch} = \"<queue>\"` under [queues], or leave the arch out with `--arch`")
        return self.by_arch[arch]


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildkiteRun:
    """What every emitted step needs: the pinned kvgate (repository and commit) and the vLLM merge base."""

    kvgate_repository: str
    kvgate_ref: str
    merge_base: str = ""

    def check(self, *, needs_merge_base: bool) -> None:
        """Every flag the steps need, each missing or malformed one its own line (InputErrors), all at once."""
        problems = []
        for flag, value, valid, bad, hint in (
                ("--kvgate-repository", self.kvgate_repository, _REPOSITORY, "is not a git URL",
                 "Name the kvgate repository the steps clone, e.g. https://github.com/OWNER/kvgate.git"),
                ("--kvgate-ref", self.kvgate_ref, _SHA, "is not a full 40-character commit SHA",
                 "Pin kvgate to a commit (a branch or tag could move under the gate)"),
                *((("--vllm-base", self.merge_base, _SHA, "is not a full 40-character commit SHA",
                    "Pass the vLLM merge base as a SHA: `git merge-base origin/main HEAD`"),) if needs_merge_base
                  else ())):
            if not value:
                problems.append(InputError(flag, f"missing: --format {'buildkite' if needs_merge_base else 'buildkite-vllm'}"
                                           " needs it", hint=hint))
            elif not valid.fullmatch(value):
                problems.append(InputError(flag, f"{value[:80]!r} {bad}", hint=hint))
        if problems:
            raise InputErrors(problems)


def load_queues(matrix_dir: Path, matrix: Matrix) -> BuildkiteQueues:
    """matrix/buildkite.toml, every problem named."""
    path = Path(matrix_dir) / QUEUES_FILE
    source = shown_path(path)
    document = read_toml(path, missing_hint="It maps each arch to the Buildkite agent queue its cells run on")
    reader = TomlReader(source)
    by_arch: dict[str, str] = {}
    gate = ""
    if reader.keys(document, QUEUES_FILE, ["queues", "gate"]):
        gate = reader.label(document, "gate", QUEUES_FILE, "queue name")
        table = document["queues"]
        if reader.keys(table, "queues", [], list(matrix.archs)):
            by_arch = {arch: reader.label(table, arch, "queues", "queue name") for arch in table}
    if reader.problems:
        raise InputErrors(reader.problems)
    return BuildkiteQueues(by_arch=by_arch, gate=gate, source=source)


def cell_key(cell_id: str) -> str:
    return CELL_KEY_PREFIX + cell_id


def cell_step(entry: Mapping[str, Any], queue: str) -> dict[str, Any]:
    """One planned cell (an entry of the plan's include list): both sides on one agent, its results uploaded."""
    cell_id = str(entry["cell"])
    results = cell_key(cell_id)
    return {
        "label": literal(cell_id),
        "key": literal(results),
        "agents": literal({"queue": queue}),
        "env": literal({"KVGATE_CELL": cell_id, "KVGATE_SESSIONS": json.dumps(list(entry["sessions"])),
                        "KVGATE_RUNNER_LABEL": queue}),
        "commands": [
            *_KVGATE_CHECKOUT,
            # The base side's checkout; a shallow clone of the pull request may lack the merge base.
            'git -C "$$checkout" cat-file -e "$$KVGATE_MERGE_BASE^{commit}" || '
            'git -C "$$checkout" fetch --quiet origin "$$KVGATE_MERGE_BASE"',
            'git -C "$$checkout" worktree add --force --detach "$$work/vllm-base" "$$KVGATE_MERGE_BASE"',
            # Each side's per-commit wheel where vLLM published one, named in a file cell_job.py's environment reads.
            'MERGE_BASE="$$KVGATE_MERGE_BASE" HEAD_SHA="$$BUILDKITE_COMMIT" WHEELS_DIR="$$work/wheels" '
            'GITHUB_ENV="$$work/wheels.env" python3 -I .kvgate/ci/fetch_vllm_wheels.py',
            "if [ -f wheels.env ]; then set -a; . ./wheels.env; set +a; fi",
            f"mkdir {literal(results)}",  # the results folder starts empty (cell_job.py refuses one that is not)
            f'status=0; KVGATE_RUN_DIR="$$work/{literal(results)}" KVGATE_VLLM_HEAD="$$checkout" '
            'KVGATE_VLLM_BASE="$$work/vllm-base" KVGATE_VLLM_OVERLAY_BASE="$$KVGATE_MERGE_BASE" '
            "python3 -I .kvgate/ci/cell_job.py || status=$$?",
            f'buildkite-agent artifact upload "{literal(results)}/**/*"',
            'git -C "$$checkout" worktree remove --force "$$work/vllm-base" || true',
            'exit "$$status"',
        ],
        "timeout_in_minutes": CELL_TIMEOUT_MINUTES,
        "retry": copy.deepcopy(AGENT_LOST_RETRY),
    }


def gate_step(plan: Mapping[str, Any], cell_keys: Sequence[str], queue: str) -> dict[str, Any]:
    """The gate: after every cell, failed ones included; a planned cell whose results are missing fails it."""
    step: dict[str, Any] = {
        "label": GATE_KEY,
        "key": GATE_KEY,
        "agents": literal({"queue": queue}),
        # the plan, as data: a changed path it names (selected_by) reaches the gate job unchanged, never interpolated
        "env": {"PLAN_RESULT": "success", "PLANNED_MATRIX": literal(json.dumps(plan, separators=(",", ":"))),
                "KVGATE_SIDES": "base,head"},
        "commands": [
            *_KVGATE_CHECKOUT,
            # Both start empty: nothing but what this build's cells uploaded reaches the gate (mkdir fails on a
            # folder that is there already)
            "mkdir kvgate-artifacts kvgate-run",
            # No artifact at all is not an error here: the gate names every planned cell without results.
            f'buildkite-agent artifact download "{CELL_KEY_PREFIX}*" kvgate-artifacts/ || true',
            'status=0; ARTIFACTS_DIR="$$work/kvgate-artifacts" KVGATE_RUN_DIR="$$work/kvgate-run" '
            "python3 -I .kvgate/ci/gate_job.py || status=$$?",
            'if [ "$$status" -eq 0 ]; then style=success; else style=error; fi',
            # ci/gate_job.py folds the report into annotation.md to fit Buildkite's 1 MiB; the whole is an artifact
            f'if [ -f kvgate-run/gate/{ANNOTATION_FILE} ]; then buildkite-agent annotate --style "$$style" '
            f'--context {ANNOTATION_CONTEXT} < kvgate-run/gate/{ANNOTATION_FILE}; else echo "kvgate: the gate exited '
            f'$$status without a report; see this job\'s log" | buildkite-agent annotate --style error '
            f"--context {ANNOTATION_CONTEXT}; fi",
            'buildkite-agent artifact upload "kvgate-run/gate/**/*" || true',
            'exit "$$status"',
        ],
        "timeout_in_minutes": GATE_TIMEOUT_MINUTES,
    }
    if cell_keys:
        step["depends_on"] = list(cell_keys)  # the cell steps' keys, already literal
        step["allow_dependency_failure"] = True
    return step


def pipeline(plan: Mapping[str, Any], queues: BuildkiteQueues, run: BuildkiteRun) -> dict[str, Any]:
    """The pipeline for `buildkite-agent pipeline upload`: the plan's cells, a wait, the gate."""
    run.check(needs_merge_base=True)
    include = list(plan["include"])
    cells = [cell_step(entry, queues.queue_for(str(entry["arch"]), str(entry["cell"]))) for entry in include]
    return {
        "env": {"KVGATE_REPOSITORY": run.kvgate_repository, "KVGATE_REF": run.kvgate_ref,
                "KVGATE_MERGE_BASE": run.merge_base},
        "steps": [
            *cells,
            # A failed cell does not stop the gate: it judges what there is and fails the missing.
            {"wait": None, "continue_on_failure": True},
            gate_step({"include": include}, [step["key"] for step in cells], queues.gate),
        ],
    }


def literal_prefix(glob: str, source: str, where: str) -> str:
    """The path a glob's matches all start with, as vLLM's source_file_dependencies match it (a file, or a folder
    ending in `/`): `csrc/quantization/fp8/**` -> `csrc/quantization/fp8/`, `csrc/trtllm*/**` -> `csrc/`."""
    parts = glob.split("/")
    literal = []
    for part in parts:
        if _GLOB_CHARACTERS.search(part):
            break
        literal.append(part)
    if len(literal) == len(parts):
        return glob
    if not literal:
        raise InputError(source, f"the glob '{glob}' starts with a wildcard, so no path prefix covers it", where,
                         hint="Start it with a folder (vLLM's source_file_dependencies match path prefixes)")
    return "/".join(literal) + "/"


def selecting_paths(matrix: Matrix) -> list[str]:
    """What can select a cell, as path prefixes: the vllm package (its import graph decides which cells), each
    backend's compiled sources and the shared ones; a prefix inside another is left out."""
    source = "matrix/backends.toml"
    prefixes = {"vllm/"}
    for name, backend in matrix.backends.items():
        prefixes.update(literal_prefix(glob, source, f"backends.{name}.sources") for glob in backend.sources)
    prefixes.update(literal_prefix(glob, source, "shared.sources") for glob in matrix.shared_sources)
    return sorted(p for p in prefixes if not _inside_another(p, prefixes))


def _inside_another(prefix: str, prefixes: Iterable[str]) -> bool:
    return any(other != prefix and other.endswith("/") and prefix.startswith(other) for other in prefixes)


def vllm_step_file(matrix: Matrix, queues: BuildkiteQueues, run: BuildkiteRun) -> dict[str, Any]:
    """A `.buildkite/test_areas/` file for vLLM's pipeline generator: the step that plans and uploads kvgate, for the
    archs that have a queue (each named with `--arch`, so an arch left out is left out in the file, in words)."""
    run.check(needs_merge_base=False)
    archs = " ".join(f"--arch {arch}" for arch in matrix.archs if arch in queues.by_arch)
    return {
        "group": "kvgate",
        "depends_on": ["image-build"],
        "steps": [{
            "label": "kvgate: FP8 KV cache gate",
            "key": PLAN_KEY,
            "device": "cpu-small",
            # On the agent itself, not in vLLM's test image: the step needs the checkout's git history and
            # buildkite-agent. Its working_dir is the checkout (the generator's default is the image's tests/).
            "no_plugin": True,
            "working_dir": "$$BUILDKITE_BUILD_CHECKOUT_PATH",
            "timeout_in_minutes": PLAN_TIMEOUT_MINUTES,
            "source_file_dependencies": selecting_paths(matrix),
            "commands": [
                'git fetch --quiet origin "$${BUILDKITE_PULL_REQUEST_BASE_BRANCH:-main}"',
                "MERGE_BASE=$$(git merge-base FETCH_HEAD HEAD)",
                *_NEUTRAL_FOLDER,
                f"git clone --quiet {run.kvgate_repository} .kvgate",
                f"git -C .kvgate checkout --quiet --detach {run.kvgate_ref}",
                *_KVGATE_PYTHON,
                'nox -f .kvgate/noxfile.py -s matrix -- --format buildkite --matrix-dir "$$work/.kvgate/matrix" '
                '--vllm-git "$$checkout" --vllm-base "$$MERGE_BASE" --vllm-head "$$BUILDKITE_COMMIT" '
                f"{archs} --kvgate-repository {run.kvgate_repository} --kvgate-ref {run.kvgate_ref} "
                "> kvgate-pipeline.json",
                "buildkite-agent pipeline upload kvgate-pipeline.json",
            ],
        }],
    }
