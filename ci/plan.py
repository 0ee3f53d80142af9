"""The plan job: which cells a change needs, as a GitHub Actions matrix.

    python ci/plan.py --repo pr                         # kvgate.yml on a pull request: the merge commit's diff
    python ci/plan.py --repo vllm --base B --head H --change-of vllm   # kvgate-vllm.yml: a vLLM pull request
    python ci/plan.py --changed-files diff.txt          # locally: one changed path a line

This script, the matrix and the nox session it calls are taken from the checkout this file lives in (the
trusted copy: the base commit or a pinned kvgate), never from the change being planned; --repo only names the
git checkout whose diff is read.

The changed paths are read with `git diff -z --name-status -M -C`: both sides of a rename or a copy count
(moving mla/flashmla.py away must still plan FLASHMLA), and -z keeps non-ASCII names unquoted. A path git
cannot give as UTF-8 or that holds a control character plans every cell: it could not be matched safely.

What a path selects depends on whose change it is (--change-of):
  kvgate  kvgate's own repository (kvgate.yml). kvgate holds no vLLM source, so a change either plans every
          cell (its harness changed: HARNESS_PATHS, or any path not known to be inert) or none (INERT_PATHS
          only: docs, kvgate's own unit tests, ...). Unknown paths count as harness: fail safe.
  vllm    a vLLM checkout (kvgate-vllm.yml): `nox -s matrix -- --format gha --changed-files FILE --vllm-git REPO
          --vllm-base MERGE_BASE --vllm-head HEAD` keeps the cells whose engine loads a changed module, read from
          vLLM's own import graph on both commits (kvgate.change.selection), the compiled paths by the backends'
          declared globs, and every cell for any path it cannot place; the step summary says which path selected
          each cell and through which import chain.
On a push, a schedule or a manual run every cell is planned.

Each matrix entry gains `runs-on`: its runner label plus the pool label (kvgate-main for main's own runs, kvgate-pr
otherwise) on self-hosted runners, so main's baseline never runs where a pull request's code ran.

GPU-minutes: every GPU cell's minutes are estimated before anything runs, as an upper bound (its planned stages'
timeouts from matrix/workloads.toml, times the sides of an A/B run, or the cells job's timeout-minutes where that is
less); a stage whose minutes were measured for the cell's workload on its arch (workloads.toml measured_minutes)
counts those instead, and the figure says which it is. The GPU cells run only when asked for (KVGATE_GPU=true: the
workflows set it on main's own runs and for a pull request when a maintainer adds the label `kvgate-gpu`, never on
a push), and only as many as the cap allows
(KVGATE_GPU_MINUTES_CAP, the repository variable; empty: no cap). A planned cell held back either way is never
dropped: it stays in `planned` with its reason (`held_back`), the plan and the step summary name it, and the gate,
which requires every planned cell, fails it as not run. CPU cells always run and count no GPU-minutes.

Writes to $GITHUB_OUTPUT: matrix (the cells that run, `{"include": [...]}`, one line), planned (every cell the
change selects, those held back with `held_back`; the gate's list), has-cells (true/false), cell-count, gpu-minutes
(the upper bound of the cells that run), merge-base (with --base/--head: the commit the change is counted from);
a short plan to $GITHUB_STEP_SUMMARY; the matrix JSON to stdout. Exit 2 with one `ERROR` line on bad input,
a $GITHUB_OUTPUT or $GITHUB_STEP_SUMMARY that cannot be appended to included (ci/step_files.py).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run isolated (python -I), Python puts no folder there
import step_files

ROOT = Path(__file__).resolve().parents[1]

# A changed-files list past this is not one (vLLM's whole tree is a few hundred kB of paths).
MAX_CHANGED_FILES_BYTES = 256 * 1024 * 1024
# GitHub Actions refuses a generated matrix of more than 256 jobs.
MAX_JOBS = 256
# Keys every matrix entry carries (kvgate.matrix.views.gha_matrix); the workflow reads them.
ENTRY_KEYS = ("cell", "backend", "kv_cache_dtype", "arch", "model", "runner", "sessions")
# kvgate's own files whose change re-runs every cell (fnmatch patterns, `*` crosses folders): everything a
# `cell(<id>)` job runs or reads, and every file that configures pytest or Python wherever it sits, even where
# kvgate has none today (.github/CODEOWNERS gives each of them a code owner too).
HARNESS_PATHS = (
    "src/*",
    "matrix/*",
    "noxfile.py",
    "setup.py",
    "tests/kernels/*",
    "ci/*",
    ".github/workflows/*",
    # pytest's configuration and plugins at any depth: it reads the first pytest.ini, pyproject.toml, tox.ini or
    # setup.cfg above the tests it runs, and every conftest.py on the way; a .pth or sitecustomize runs at start-up.
    "*conftest.py",
    "*pytest.ini",
    "*pyproject.toml",
    "*tox.ini",
    "*setup.cfg",
    "*.pth",
    "*sitecustomize.py",
    "*usercustomize.py",
)
# kvgate's files no cell reads: a change made of these alone plans no cell. Anything else counts as harness.
INERT_PATHS = (
    "*.md",
    "docs/*",
    "benchmarks/*",
    "canaries/*",
    "reports/README.md",
    ".github/CODEOWNERS",
    ".gitignore",
    "LICENSE",
    ".ci/*",
    "tests/*",  # kvgate's own unit tests; tests/kernels and tests/conftest.py are harness (checked first)
)
CHANGE_OWNERS = ("kvgate", "vllm")
# Events whose runs plan every cell (push to main refreshes the baseline).
ALL_CELLS_EVENTS = ("push", "schedule", "workflow_dispatch")
# A rename (R) or copy (C) entry of `git diff -z --name-status` carries two paths, the others one.
_TWO_PATHS = ("R", "C")
# Characters that end a line somewhere (str.splitlines splits on C1 controls and U+2028/2029 too) or hide in one.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class PlanError(Exception):
    """Bad input or a failed planning command; printed as one `ERROR` line."""


# The label of a pull request that asks for the GPU cells (ci/README.md, "The GPU matrix").
GPU_LABEL = "kvgate-gpu"
# The kernels stage's timeout: kvgate.runners.matrix_run.DEFAULT_TIMEOUT_SECONDS (a test checks), also that of a
# stage whose workload declares none.
DEFAULT_STAGE_TIMEOUT_S = 3600
PLANNED_STAGES = ("kernels", "accuracy", "throughput")


@dataclass(frozen=True)
class GpuBudget:
    """What the GPU cells may spend: whether they were asked for, the cap in minutes (None: none), the sides each
    cell runs (2 in an A/B run) and the cells job's timeout-minutes."""

    triggered: bool
    cap_minutes: float | None
    sides: int = 1
    job_minutes: int = 180


def is_gpu_cell(entry: Mapping[str, object]) -> bool:
    return entry.get("arch") != "cpu"


def gpu_minutes(entry: Mapping[str, object], timeouts: Mapping[str, int], budget: GpuBudget,
                measured: Mapping[str, float] | None = None) -> tuple[float, str]:
    """(the cell's GPU-minutes; what they rest on, in words): each planned stage's measured minutes a side where the
    matrix records them for the cell's workload and arch (workloads.toml measured_minutes), else its timeout (an upper
    bound), times the sides; or the cells job's timeout-minutes where that is less."""
    stages = [str(s) for s in (entry.get("stages") or PLANNED_STAGES) if s in PLANNED_STAGES]
    measured = measured or {}
    seconds = sum(60 * measured[s] if s in measured else timeouts.get(s, DEFAULT_STAGE_TIMEOUT_S) for s in stages)
    by_stages = budget.sides * seconds / 60
    if by_stages <= budget.job_minutes:
        sides = f" x {budget.sides} sides" if budget.sides > 1 else ""
        timed = [s for s in stages if s in measured]
        if not timed:
            return by_stages, f"upper bound: its stage timeouts{sides}"
        bounded = [s for s in stages if s not in measured]
        text = f"measured: {', '.join(f'{s} {measured[s]:g} min' for s in timed)}"
        return by_stages, text + (f"; upper bound: the {', '.join(bounded)} timeout{'s' if len(bounded) > 1 else ''}"
                                  if bounded else "") + sides
    return float(budget.job_minutes), f"upper bound: the cells job's timeout-minutes ({budget.job_minutes})"


@dataclass
class Budgeted:
    """The plan split by the GPU budget: the cells that run, those held back with why, each GPU cell's minutes."""

    run: list[dict[str, object]]
    held: list[dict[str, object]]
    minutes: dict[str, tuple[float, str]]

    @property
    def run_minutes(self) -> float:
        return sum(self.minutes[str(e["cell"])][0] for e in self.run if str(e["cell"]) in self.minutes)


def apply_gpu_budget(matrix: dict[str, list[dict[str, object]]], timeouts_of: Mapping[str, Mapping[str, int]],
                     budget: GpuBudget, measured_of: Mapping[str, Mapping[str, float]] | None = None) -> Budgeted:
    """Hold back the GPU cells when they were not asked for, and, in plan order, each GPU cell that would take the
    running total past the cap; every held cell keeps its entry with `held_back` (its reason)."""
    out = Budgeted(run=[], held=[], minutes={})
    total = 0.0
    for entry in matrix["include"]:
        if not is_gpu_cell(entry):
            out.run.append(entry)
            continue
        cell = str(entry["cell"])
        minutes, _ = out.minutes[cell] = gpu_minutes(entry, timeouts_of.get(cell, {}), budget,
                                                     (measured_of or {}).get(cell))
        if not budget.triggered:
            reason = (f"not run: the GPU cells run on a pull request only when a maintainer adds the label "
                      f"`{GPU_LABEL}` (add it, or add it again after a push took it away, to run them for the pull "
                      "request's commit)")
        elif budget.cap_minutes is not None and total + minutes > budget.cap_minutes:
            reason = (f"not run: over the GPU-minutes cap (KVGATE_GPU_MINUTES_CAP = {budget.cap_minutes:g}): "
                      f"{total:g} planned before it, {minutes:g} for it")
        else:
            total += minutes
            out.run.append(entry)
            continue
        out.held.append({**entry, "held_back": reason})
    return out


def read_budget(environ: Mapping[str, str], event: str) -> GpuBudget:
    """KVGATE_GPU (true/false; unset: true), KVGATE_GPU_MINUTES_CAP (minutes; empty: no cap), KVGATE_SIDES (1 or 2),
    KVGATE_CELL_JOB_MINUTES (the cells job's timeout-minutes)."""
    gpu = environ.get("KVGATE_GPU", "").strip().lower() or "true"
    if gpu not in ("true", "false"):
        raise PlanError(f"$KVGATE_GPU {gpu[:40]!r}: expected true or false")
    cap_text = environ.get("KVGATE_GPU_MINUTES_CAP", "").strip()
    try:
        cap = float(cap_text) if cap_text else None
    except ValueError:
        cap = -1.0
    if cap is not None and not (cap >= 0 and cap < float("inf")):
        raise PlanError(f"$KVGATE_GPU_MINUTES_CAP {cap_text[:40]!r}: expected a number of minutes >= 0 (the "
                        "repository variable; leave it unset for no cap)")
    numbers = {}
    for name, default in (("KVGATE_SIDES", "1"), ("KVGATE_CELL_JOB_MINUTES", "180")):
        text = environ.get(name, "").strip() or default
        if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) < 1:  # str.isdigit() takes '²', which int() refuses
            raise PlanError(f"${name} {text[:40]!r}: expected a whole number >= 1")
        numbers[name] = int(text)
    return GpuBudget(triggered=gpu == "true" or event in ALL_CELLS_EVENTS, cap_minutes=cap,
                     sides=numbers["KVGATE_SIDES"], job_minutes=numbers["KVGATE_CELL_JOB_MINUTES"])


def workload_timeouts(matrix: dict[str, list[dict[str, object]]]) -> dict[str, dict[str, int]]:
    """Each planned cell's stage timeouts, from the trusted matrix (kvgate.matrix is stdlib only, as in noxfile.py)."""
    return {cell: dict(declared.workload.timeouts) for cell, declared in _declared(matrix).items()}


def workload_measured_minutes(matrix: dict[str, list[dict[str, object]]]) -> dict[str, dict[str, float]]:
    """Each planned cell's measured stage minutes a side on its arch (workloads.toml measured_minutes), where any."""
    return {cell: dict(declared.workload.measured_minutes.get(declared.arch, {}))
            for cell, declared in _declared(matrix).items() if declared.workload.measured_minutes.get(declared.arch)}


def _declared(matrix: dict[str, list[dict[str, object]]]) -> dict[str, object]:
    if not matrix["include"]:
        return {}
    sys.path.insert(0, str(ROOT / "src"))
    from kvgate.matrix import cells as kvmatrix

    declared = {cell.id: cell for cell in kvmatrix.load(ROOT / "matrix").cells}
    return {str(e["cell"]): declared[str(e["cell"])] for e in matrix["include"] if str(e["cell"]) in declared}


def _matches(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def harness_changed(changed: Sequence[str]) -> list[str]:
    """The changed paths that are kvgate's own harness: listed in HARNESS_PATHS, or not known to be inert."""
    return [path for path in changed if _matches(path, HARNESS_PATHS) or not _matches(path, INERT_PATHS)]


def unsafe_paths(changed: Sequence[str]) -> list[str]:
    """Paths that cannot travel one a line as UTF-8 (a control character, bytes that are not UTF-8) or that leave
    the repository's relative tree (absolute, `..`, a backslash)."""
    unsafe = []
    for path in changed:
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            unsafe.append(path)
            continue
        parts = path.split("/")
        if _UNSAFE.search(path) or path.startswith("/") or ".." in parts or "\\" in path:
            unsafe.append(path)  # `docs/../vllm/x.py` would match an inert glob and plan no cell
    return unsafe


def matrix_command(nox: Sequence[str], changed_files: Path | None, vllm_git: VllmGit | None = None,
                   explain_file: Path | None = None) -> list[str]:
    # --matrix-dir: the session installs kvgate into its own venv, away from the checkout's matrix/.
    argv = [*nox, "-s", "matrix", "--", "--format", "gha", "--matrix-dir", str(ROOT / "matrix")]
    if changed_files is not None:
        argv += ["--changed-files", str(changed_files)]
    if vllm_git is not None:  # both sides' import graphs from the vLLM checkout (kvgate.change.selection)
        argv += ["--vllm-git", str(vllm_git.repo), "--vllm-base", vllm_git.base, "--vllm-head", vllm_git.head]
    if explain_file is not None:
        argv += ["--explain-file", str(explain_file)]
    return argv


@dataclass(frozen=True)
class VllmGit:
    """The vLLM checkout and the two commits whose import graphs decide which cells a change selects."""

    repo: Path
    base: str
    head: str


def parse_matrix(stdout: str, source: str = "nox -s matrix") -> dict[str, list[dict[str, object]]]:
    """The `{"include": [...]}` line of the matrix session's output, checked."""
    lines = [line for line in stdout.splitlines() if line.startswith('{"include"')]
    if len(lines) != 1:
        raise PlanError(f"{source}: expected one {{\"include\": [...]}} line on stdout, found {len(lines)}. "
                        "Run it by hand to see what it printed")
    try:
        matrix = json.loads(lines[0])
    except json.JSONDecodeError as error:
        raise PlanError(f"{source}: the matrix line is not JSON ({error.msg} at column {error.colno})") from None
    include = matrix.get("include") if isinstance(matrix, dict) else None
    if not isinstance(include, list) or set(matrix) != {"include"}:
        raise PlanError(f"{source}: the matrix must be an object with only an 'include' list")
    for index, entry in enumerate(include):
        missing = [key for key in ENTRY_KEYS if not isinstance(entry, dict) or key not in entry]
        if missing:
            raise PlanError(f"{source}: include[{index}] lacks {', '.join(missing)}")
        sessions = entry["sessions"]
        if not isinstance(sessions, list) or not sessions or not all(isinstance(s, str) for s in sessions):
            raise PlanError(f"{source}: include[{index}].sessions must be a non-empty list of session names")
    ids = [entry["cell"] for entry in include]
    if len(set(ids)) != len(ids):
        raise PlanError(f"{source}: a cell id appears twice in the matrix")
    if len(include) > MAX_JOBS:
        raise PlanError(f"{source}: {len(include)} cells, but a GitHub Actions matrix takes at most {MAX_JOBS} "
                        "jobs. Split the workflow by arch (`--arch`)")
    return matrix


def with_runner_pool(matrix: dict[str, list[dict[str, object]]], pool_label: str) -> dict[str, list[dict[str, object]]]:
    """Each entry gains `runs-on`: its runner label, plus the pool label on self-hosted (GPU) runners.

    GitHub-hosted runners (`ubuntu-latest`, the CPU cells) are fresh VMs and take no pool label.
    """
    include = []
    for entry in matrix["include"]:
        runner = str(entry["runner"])
        hosted = runner.startswith(("ubuntu-", "windows-", "macos-"))
        labels = [runner] if hosted or not pool_label else [runner, pool_label]
        include.append({**entry, "runs-on": labels})
    return {"include": include}


def outputs(matrix: dict[str, list[dict[str, object]]], budgeted: Budgeted | None = None) -> dict[str, str]:
    """The plan job's outputs. An empty matrix cannot fan out: has-cells=false skips the cells job. With a budget,
    `matrix` is the cells that run and `planned` every planned cell (those held back with `held_back`)."""
    run = matrix if budgeted is None else {"include": budgeted.run}
    planned = matrix if budgeted is None else {"include": [*budgeted.run, *budgeted.held]}
    count = len(run["include"])
    values = {
        "matrix": json.dumps(run, separators=(",", ":")),
        "has-cells": "true" if count else "false",
        "cell-count": str(count),
    }
    if budgeted is not None:
        values["planned"] = json.dumps(planned, separators=(",", ":"))
        values["gpu-minutes"] = f"{budgeted.run_minutes:g}"
    return values


def output_lines(values: dict[str, str]) -> str:
    """`name=value` lines for $GITHUB_OUTPUT; a value with a newline would start a new output."""
    for name, value in values.items():
        if "\n" in value or "\r" in value:
            raise PlanError(f"output {name}: a value for $GITHUB_OUTPUT must be one line")
    return "".join(f"{name}={value}\n" for name, value in values.items())


def summary(matrix: dict[str, list[dict[str, object]]], reason: str, budgeted: Budgeted | None = None) -> str:
    include = matrix["include"] if budgeted is None else budgeted.run
    lines = ["## kvgate plan", "", reason, ""]
    if not include and not (budgeted and budgeted.held):
        lines.append("No cell selected: nothing runs on a GPU runner, and the gate reports nothing to check.")
    elif include:
        minutes = budgeted.minutes if budgeted is not None else {}
        lines += [f"{len(include)} cells:", "", "| cell | runner | model | GPU-minutes |", "|---|---|---|---|"]
        lines += [f"| `{e['cell']}` | `{e['runner']}` | `{e['model']}` | {_minutes_cell(minutes, e)} |"
                  for e in include]
    if budgeted is not None:
        lines += ["", budget_line(budgeted)]
        if budgeted.held:
            lines += ["", f"{len(budgeted.held)} planned cells held back (not run; the gate fails them as not run):",
                      "", "| cell | GPU-minutes | why |", "|---|---|---|"]
            lines += [f"| `{e['cell']}` | {_minutes_cell(budgeted.minutes, e)} | {e['held_back']} |"
                      for e in budgeted.held]
    return "\n".join(lines) + "\n"


def _minutes_cell(minutes: Mapping[str, tuple[float, str]], entry: Mapping[str, object]) -> str:
    figure = minutes.get(str(entry["cell"]))
    return "CPU" if figure is None else f"≤ {figure[0]:g} ({figure[1]})"


def budget_line(budgeted: Budgeted) -> str:
    """The plan's GPU-minutes in one line: the upper bound of the cells that run, and what was held back."""
    gpu = sum(1 for e in budgeted.run if str(e["cell"]) in budgeted.minutes)
    timed = sum(1 for e in budgeted.run if budgeted.minutes.get(str(e["cell"]), (0, ""))[1].startswith("measured"))
    kind = "upper bounds, not measurements" if not timed else f"{timed} of them with measured stage minutes, the rest " \
                                                              "upper bounds"
    line = f"GPU-minutes: at most {budgeted.run_minutes:g} for {gpu} GPU cells ({kind})"
    if budgeted.held:
        line += f"; held back: {', '.join(str(e['cell']) for e in budgeted.held)}"
    return line + "."


def parse_name_status(raw: bytes) -> list[str]:
    """`git diff -z --name-status` output -> every path it names, both sides of renames and copies, in order."""
    fields = raw.split(b"\0")
    if fields and fields[-1] == b"":
        fields.pop()
    paths: list[str] = []
    index = 0
    while index < len(fields):
        status = fields[index].decode("ascii", "replace")
        count = 2 if status[:1] in _TWO_PATHS else 1
        names = fields[index + 1:index + 1 + count]
        if not status or len(names) != count:
            raise PlanError(f"git diff -z --name-status: a truncated entry at field {index} ({status!r})")
        paths += [name.decode("utf-8", "surrogateescape") for name in names]
        index += 1 + count
    return list(dict.fromkeys(paths))


def check_rev(flag: str, rev: str) -> str:
    """A revision git reads as a revision: never an option (`--output=...`), never empty."""
    if not rev or rev.startswith("-") or _UNSAFE.search(rev):
        raise PlanError(f"{flag} {ascii(rev)[:80]}: not a git revision (a commit SHA, a branch or a tag)")
    return rev


def git_changed_paths(repo: Path, base: str, head: str) -> list[str]:
    """Every path that differs between base and head (both sides of renames and copies), as git stores it."""
    argv = ["git", "-c", "core.quotePath=false", "diff", "-z", "--name-status", "-M", "-C", "--no-ext-diff",
            "--no-textconv", base, head, "--"]
    try:
        result = subprocess.run(argv, cwd=repo, capture_output=True, check=False)
    except OSError as error:
        raise PlanError(f"git: {error.strerror}. Install git") from None
    if result.returncode != 0:
        stderr = result.stderr.decode("utf-8", "replace").strip().splitlines()
        raise PlanError(f"git diff {base} {head} in {repo}: {stderr[-1] if stderr else 'failed'}. "
                        "Check out both commits (fetch-depth: 0, or 2 for a merge commit)")
    return parse_name_status(result.stdout)


def merge_base(repo: Path, base: str, head: str) -> str:
    """The commit a pull request branched from: its changes are those since then, not base's newer commits."""
    result = subprocess.run(["git", "merge-base", base, head], cwd=repo, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0 or not result.stdout.strip():
        raise PlanError(f"git merge-base {base} {head} in {repo}: {result.stderr.strip() or 'no common ancestor'}. "
                        "Check out the full history (fetch-depth: 0)")
    return result.stdout.strip()


def pull_request_changed_files(cwd: Path) -> list[str]:
    """Paths the pull request changes: the merge commit against its first parent (the base tip)."""
    return git_changed_paths(cwd, "HEAD^1", "HEAD")


def decide(event: str, changed: list[str] | None, change_of: str = "kvgate",
           all_cells: bool = False) -> tuple[list[str] | None, str]:
    """(changed paths to filter by, None for every cell, [] for none; the reason, in words)."""
    if change_of not in CHANGE_OWNERS:
        raise PlanError(f"--change-of {change_of!r}: expected one of {', '.join(CHANGE_OWNERS)}")
    if all_cells:
        return None, "Every cell was asked for (--cells all)."
    if changed is None:
        if event in ALL_CELLS_EVENTS:
            return None, f"Event `{event}`: every cell."
        raise PlanError(f"event {event!r}: no changed-files list. Pass --changed-files FILE or --repo DIR, "
                        f"or run on one of {', '.join(ALL_CELLS_EVENTS)} to plan every cell")
    unsafe = unsafe_paths(changed)
    if unsafe:
        shown = ascii(unsafe[0])[:120]
        return None, f"A changed path cannot be matched safely ({shown}: a control character, not UTF-8, absolute or `..`): every cell."
    if change_of == "kvgate":
        harness = harness_changed(changed)
        if harness:
            more = " and more" if len(harness) > 1 else ""
            return None, f"kvgate's harness changed (`{harness[0]}`{more}): every cell."
        return [], f"{len(changed)} changed paths, none of which a cell runs or reads: no cell."
    return changed, f"{len(changed)} changed vLLM paths: the cells whose backend sources they touch."


def plan(event: str, changed: list[str] | None, nox: Sequence[str], cwd: Path,
         change_of: str = "kvgate", all_cells: bool = False,
         vllm_git: VllmGit | None = None) -> tuple[dict, str, str]:
    """(the matrix, the reason in words, the selection's explanation as Markdown: which path selected each cell
    and through which import chain; empty when no vLLM change was planned)."""
    selection, reason = decide(event, changed, change_of, all_cells)
    if selection == []:
        return {"include": []}, reason, ""
    with tempfile.TemporaryDirectory() as tmp:
        listing = explain = None
        if selection is not None:
            listing = Path(tmp) / "changed-files.txt"
            listing.write_text("".join(f"{path}\n" for path in selection), encoding="utf-8")
            if change_of == "vllm":
                explain = Path(tmp) / "explain.md"
        argv = matrix_command(nox, listing, vllm_git if change_of == "vllm" and selection is not None else None,
                              explain)
        try:
            result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
        except OSError as error:
            raise PlanError(f"{argv[0]}: {error.strerror}. Install nox (`pip install nox`)") from None
        explanation = explain.read_text(encoding="utf-8") if explain is not None and explain.is_file() else ""
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise PlanError(f"{' '.join(argv)} exited {result.returncode}: {tail}")
    return parse_matrix(result.stdout), reason, explanation


def read_changed_list(path: Path) -> list[str]:
    """--changed-files: one path a line, or NUL-separated (`git diff -z --name-only`) when it holds a NUL."""
    try:
        with open(path, "rb") as handle:  # a pipe too
            data = handle.read(MAX_CHANGED_FILES_BYTES + 1)
    except OSError as error:
        raise PlanError(f"{path}: cannot read the changed-files list ({error.strerror})") from None
    if len(data) > MAX_CHANGED_FILES_BYTES:  # /dev/zero was read to the end of memory
        raise PlanError(f"{path}: the changed-files list is more than {MAX_CHANGED_FILES_BYTES} bytes")
    parts = data.split(b"\0") if b"\0" in data else data.splitlines()
    paths = [p.decode("utf-8", "surrogateescape").strip() for p in parts if p.strip()]
    if not paths:  # what a failed `git diff > FILE` leaves: it planned no cell (exit 0), the change unseen
        raise PlanError(f"{path}: the changed-files list names no path. Pass the output of `git diff --name-only "
                        "BASE...HEAD`, or --cells all for every cell")
    return paths


MAIN_POOL_EVENTS = ("push", "schedule", "workflow_dispatch")  # kvgate.runners.environment.ci.BRANCH_EVENTS


def default_pool_label(environ: Mapping[str, str]) -> str:
    """The runner pool of self-hosted cells: kvgate-main for main's own runs (a push, scheduled or manual run on
    main), else kvgate-pr. GitHub enforces it where the main pool's runner group admits only workflows on
    refs/heads/main, which a run serving a pull request or a comment (pull_request_target, issue_comment,
    workflow_run: GITHUB_REF names the default branch) passes too: such a run is never main's own."""
    if environ.get("GITHUB_EVENT_NAME") in MAIN_POOL_EVENTS and environ.get("GITHUB_REF") == "refs/heads/main":
        return "kvgate-main"
    return "kvgate-pr"


def changed_paths(args: argparse.Namespace) -> list[str] | None:
    """The change to plan for; None (every cell) on a push, schedule or manual run unless a list is given."""
    if args.changed_files is not None:
        if args.repo is not None:
            raise PlanError("--changed-files and --repo: pass one of them")
        return read_changed_list(args.changed_files)
    if (args.base is None) != (args.head is None):
        raise PlanError("--base and --head: pass both, or neither (the merge commit's own diff)")
    if args.event in ALL_CELLS_EVENTS:
        return None
    if args.repo is None:
        raise PlanError(f"event {args.event!r}: pass --repo DIR (the change's git checkout) or --changed-files FILE")
    if not (args.repo / ".git").exists():
        raise PlanError(f"--repo {args.repo}: not a git checkout")
    if args.base is None:
        args.vllm_git = VllmGit(repo=args.repo, base="HEAD^1", head="HEAD")
        return pull_request_changed_files(args.repo)
    base, head = check_rev("--base", args.base), check_rev("--head", args.head)
    args.merge_base = merge_base(args.repo, base, head)
    args.vllm_git = VllmGit(repo=args.repo.resolve(), base=args.merge_base, head=head)
    return git_changed_paths(args.repo, args.merge_base, head)


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one `ERROR` line and exit 2, as every other refusal here (argparse printed its usage too)."""

    def error(self, message: str):  # type: ignore[override]
        print(f"ERROR ci/plan.py: {message}. See `python ci/plan.py --help`", file=sys.stderr)
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="ci/plan.py", description=__doc__.splitlines()[0])
    parser.add_argument("--event", default=os.environ.get("GITHUB_EVENT_NAME", "pull_request"),
                        help="GitHub event name (default: $GITHUB_EVENT_NAME, else pull_request)")
    parser.add_argument("--changed-files", type=Path, metavar="FILE",
                        help="changed paths, one a line or NUL-separated")
    parser.add_argument("--repo", type=Path, metavar="DIR",
                        help="the git checkout whose change is planned: its HEAD^1..HEAD (a merge commit), or "
                             "--base..--head")
    parser.add_argument("--base", metavar="REV", help="with --repo: the base commit (its merge base with HEAD is used)")
    parser.add_argument("--head", metavar="REV", help="with --repo: the head commit")
    parser.add_argument("--change-of", choices=CHANGE_OWNERS, default="kvgate",
                        help="whose paths these are: kvgate's own (harness or not) or vLLM's (backend sources)")
    parser.add_argument("--cells", choices=("changed", "all"), default=os.environ.get("KVGATE_PLAN_CELLS") or "changed",
                        help="changed: the cells the change can affect (default); all: every cell whatever changed")
    parser.add_argument("--pool-label", default=os.environ.get("KVGATE_POOL_LABEL") or default_pool_label(os.environ),
                        help="extra runner label of self-hosted cells (default: kvgate-main on main's own runs, "
                             "else kvgate-pr); empty for none")
    parser.add_argument("--nox", default=os.environ.get("KVGATE_NOX", "nox"),
                        help="the nox command (default: $KVGATE_NOX or nox)")
    args = parser.parse_args(argv)
    args.merge_base = ""
    args.vllm_git = None
    try:
        if args.cells not in ("changed", "all"):
            raise PlanError(f"--cells {args.cells!r}: expected changed or all")
        all_cells = args.cells == "all"
        changed = None if all_cells else changed_paths(args)
        matrix, reason, explanation = plan(args.event, changed, args.nox.split(), ROOT, args.change_of, all_cells,
                                           args.vllm_git)
        matrix = with_runner_pool(matrix, args.pool_label)
        budgeted = apply_gpu_budget(matrix, workload_timeouts(matrix), read_budget(os.environ, args.event),
                                    workload_measured_minutes(matrix))
        step_files.append("GITHUB_OUTPUT", os.environ.get("GITHUB_OUTPUT"),
                          output_lines({**outputs(matrix, budgeted), "merge-base": args.merge_base}))
        step_files.append("GITHUB_STEP_SUMMARY", os.environ.get("GITHUB_STEP_SUMMARY"),
                          summary(matrix, reason, budgeted) + (f"\n{explanation}" if explanation else ""))
    except (PlanError, step_files.StepFileError) as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    print(json.dumps({"include": budgeted.run}, separators=(",", ":")))
    print(f"kvgate plan: {reason} {len(budgeted.run)} cells. {budget_line(budgeted)}", file=sys.stderr)
    for entry in budgeted.held:
        print(f"kvgate plan: {entry['cell']} held back, {entry['held_back']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
