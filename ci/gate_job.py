"""The gate job: assemble the cells' artifacts into one run folder, run the gate, report, pass its verdict on.

    ARTIFACTS_DIR=... KVGATE_RUN_DIR=... PLAN_RESULT=success PLANNED_MATRIX='{"include": [...]}' \
    [CELLS_RESULT=success] [BASELINE_DIR=...] [KVGATE_SIDES=base,head] [KVGATE_BOOTSTRAP_BASELINE=true] \
    python ci/gate_job.py

This script, the noxfile, the matrix, the policy and the waivers it uses are those of its own checkout: the
workflow runs it from the trusted copy (the base commit, or a pinned kvgate), never from the pull request.

actions/download-artifact lays out one folder per artifact (`kvgate-cell-<id>/`), each holding that job's run
folder: `run.json` and `<cell folder>/cell.json ...`. The artifact of cell <id> may bring only that cell's
folders (`<id>/`, and `<id>--base/` in an A/B run: $KVGATE_SIDES base,head) whose cell.json names that cell and
side; anything else in
it is left out with a warning, so one job cannot stand in for another whose results were lost.

Planned means required: the plan's matrix goes to the gate as `--expect-cells`, so a planned cell with no
folder (its job crashed, timed out, was cancelled or skipped, or its artifact was lost) fails the gate, named.
A planned cell whose folder lacks a stage that nothing reported (the job was killed mid-cell) gets that stage
marked `error`. No planned cell: nothing to check, a pass with that note.

The baseline fails closed: the gate runs with `--require-baseline`, so a run compared with nothing (no base side
in an A/B run, no usable $BASELINE_DIR) fails. Only a push or manual run with KVGATE_BOOTSTRAP_BASELINE=true
(the first reference run on main) may go without one; its report then says NEUTRAL. Never a pull request.

Then `nox -s gate -- $KVGATE_RUN_DIR --expect-cells PLAN --require-baseline [--baseline $BASELINE_DIR]`;
`gate/report.md` goes to $GITHUB_STEP_SUMMARY; `gate/pull_request.json` tells kvgate-comment.yml which pull
request it is for. A broken stage's first error links its log in the cell's artifact (`--log-url`: a file of it on
Buildkite, the artifact on GitHub Actions, listed with GH_TOKEN). On Buildkite (BUILDKITE=true) `gate/annotation.md`
is the report folded to fit an annotation (1 MiB), which the gate step annotates the build with. run.json names the CI, its commit and the branch of a push or
scheduled build (ci/ci_facts.py). The exit status is the gate's (0 pass, 1 regression or missing cell, 2 bad input);
where $GITHUB_STEP_SUMMARY cannot be written (ci/step_files.py), one ERROR line says so and a pass becomes 2.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run isolated (python -I), Python puts no folder there
import ci_facts
import pr_comment
import step_files
from ci_facts import workflow_command

# the bounded reader of a file kvgate did not write (stdlib only; ci_facts put src/ on the path)
from kvgate.matrix.regular_files import FileTooLarge, NotRegularFile, read_bytes

ROOT = Path(__file__).resolve().parents[1]

IDENTITY_KEYS = ("backend", "kv_cache_dtype", "arch", "model")
# The stages a `cell(<id>)` session runs; a planned cell's stage that never reported fails.
CELL_STAGES = ("kernels", "accuracy", "throughput")
GATE_FOLDER = "gate"
# $GITHUB_STEP_SUMMARY takes at most 1 MiB per step.
SUMMARY_LIMIT = 1024 * 1024 - 4096
# Buildkite refuses an annotation body over 1 MiB; on Buildkite (BUILDKITE=true) the gate step annotates the build
# with gate/ANNOTATION_FILE, the report folded to fit (pr_comment.fit: <details> blocks first, never inside a table).
ANNOTATION_LIMIT = 1024 * 1024 - 4096
ANNOTATION_FILE = "annotation.md"
PULL_REQUEST_FILE = "pull_request.json"
# GitHub caps a webhook's payload at 25 MB; the event file of a run holds that payload.
EVENT_READ_LIMIT = 64 * 1024 * 1024
EXPECTED_CELLS_FILE = "expected-cells.json"
ARTIFACT_PREFIX = "kvgate-cell-"
BASE_SUFFIX = "--base"  # the base side's folder of an A/B run (docs/results-folder.md)
SIDES = ("base", "head")
CELL_ID = re.compile(r"[a-z0-9_]+-[a-z0-9_]+-[a-z0-9]+(-[a-z][a-z0-9_]*)?")  # a feature's cell ends in it (-spec_decode)
# Events whose runs may go without a baseline when a maintainer asks (the first reference run); never a PR.
BOOTSTRAP_EVENTS = ("push", "workflow_dispatch")


class GateJobError(Exception):
    """Bad job input; printed as one `ERROR` line, exit status 2."""


@dataclass
class Assembly:
    """What the artifacts held: cell folder name -> identity; each artifact's run.json; what was left out."""

    cells: dict[str, tuple[str, ...]] = field(default_factory=dict)
    run_infos: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def planned_cells(matrix_json: str) -> list[dict[str, Any]]:
    """The plan job's `{"include": [...]}` ($PLANNED_MATRIX). It must be there: an empty plan says so itself."""
    if not matrix_json.strip():
        raise GateJobError("$PLANNED_MATRIX: empty, though the plan job succeeded. Pass the plan job's `matrix` "
                           "output (`{\"include\": []}` when it planned nothing)")
    try:
        matrix = json.loads(matrix_json)
    except json.JSONDecodeError as error:
        raise GateJobError(f"$PLANNED_MATRIX: not JSON ({error.msg})") from None
    except RecursionError:
        raise GateJobError("$PLANNED_MATRIX: not JSON (nested too deep)") from None
    include = matrix.get("include") if isinstance(matrix, dict) else None
    if not isinstance(include, list) or not all(
            isinstance(e, dict) and isinstance(e.get("cell"), str) and CELL_ID.fullmatch(e["cell"]) for e in include):
        raise GateJobError("$PLANNED_MATRIX: expected {\"include\": [{\"cell\": \"<id>\", ...}, ...]} from ci/plan.py")
    for index, entry in enumerate(include):  # what this job reads of an entry besides its cell: the stages planned
        stages, reasons = entry.get("stages", []), entry.get("not_planned", {})
        if not isinstance(stages, list) or not all(isinstance(s, str) and s in CELL_STAGES for s in stages):
            raise GateJobError(f"$PLANNED_MATRIX: expected a list of stages ({', '.join(CELL_STAGES)}) in "
                               f"include[{index}].stages, as ci/plan.py writes it")
        if not isinstance(reasons, dict) or not all(k in CELL_STAGES and isinstance(v, str) for k, v in reasons.items()):
            raise GateJobError(f"$PLANNED_MATRIX: expected {{stage: reason}} in include[{index}].not_planned, as "
                               "ci/plan.py writes it")
    return include


def identity(record: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(record.get(key, "")) for key in IDENTITY_KEYS)


def _cell_record(cell_json: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(cell_json.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None  # the gate reads it again and says what is wrong with it (exit 2)
    return data if isinstance(data, dict) else None


def _no_json_number(literal: str) -> Any:
    raise ValueError(f"{literal} is not a number JSON allows")


def _finite_float(literal: str) -> float:
    """A job's run.json goes into the run's run.json as it is: a number that reads as infinity would be written out
    as `Infinity`, which is no JSON, and the gate would refuse the run.json this job wrote."""
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{literal[:24]} is out of a float's range")
    return value


def foreign_folder(name: str, record: Mapping[str, Any] | None, entry: Mapping[str, Any],
                   sides: Sequence[str] = ()) -> str | None:
    """Why a folder in cell <id>'s artifact is not one of that cell's own; None when it is. A base side's folder is
    one only where the workflow runs a base side ($KVGATE_SIDES base,head): elsewhere the baseline is main's run, and
    a base side the cell job brought would be a baseline the pull request chose."""
    cell_id = str(entry["cell"])
    if name not in (cell_id, cell_id + BASE_SUFFIX):
        return f"is not a folder of cell {cell_id} ({cell_id}/ or {cell_id}{BASE_SUFFIX}/)"
    if name.endswith(BASE_SUFFIX) and "base" not in sides:
        return "is a base side's folder, but this workflow runs no base side ($KVGATE_SIDES)"
    if record is None:
        return None
    if identity(record) != identity(entry):
        return f"holds the cell.json of another cell ({', '.join(identity(record))})"
    side = record.get("side", "head")
    if side != ("base" if name.endswith(BASE_SUFFIX) else "head"):
        return f"holds a cell.json of the {str(side)[:20]!r} side"
    return None


def assemble(artifacts_dir: Path, run_dir: Path, planned: Sequence[Mapping[str, Any]],
             sides: Sequence[str] = ()) -> Assembly:
    """Copy each planned cell's own folders from its own artifact into run_dir (its base side's only where `sides`
    holds base); leave anything else out, said."""
    found = Assembly()
    if not artifacts_dir.is_dir():
        return found
    by_id = {str(entry["cell"]): entry for entry in planned}
    for artifact in sorted(p for p in artifacts_dir.iterdir() if p.is_dir()):
        cell_id = artifact.name[len(ARTIFACT_PREFIX):] if artifact.name.startswith(ARTIFACT_PREFIX) else ""
        entry = by_id.get(cell_id)
        if entry is None:
            found.problems.append(f"artifact {artifact.name}: not the artifact of a planned cell; left out")
            continue
        if (artifact / "run.json").is_file():
            try:
                found.run_infos[artifact.name] = json.loads((artifact / "run.json").read_text(encoding="utf-8"),
                                                            parse_constant=_no_json_number, parse_float=_finite_float)
            except (OSError, ValueError, UnicodeDecodeError, RecursionError):
                found.problems.append(f"{artifact.name}/run.json is unreadable (not JSON, or a number JSON does not "
                                      "allow: NaN, Infinity, out of a float's range); left out of run.json")
        for cell_json in sorted(artifact.glob("*/cell.json")):
            source = cell_json.parent
            problem = foreign_folder(source.name, _cell_record(cell_json), entry, sides)
            if problem:
                found.problems.append(f"artifact {artifact.name}: {source.name}/ {problem}; left out")
                continue
            shutil.copytree(source, run_dir / source.name, symlinks=True)
            found.cells[source.name] = identity(entry)
    return found


def mark_unreported_stages(cell_dir: Path, stages: Sequence[str], reason: str) -> list[str]:
    """In a planned cell's folder, mark `error` each stage that left no folder and no status.json entry.

    A job killed mid-cell leaves its later stages unreported; the gate would call them "not run" and pass
    them. Stages the runner reported (ok, error, skipped with a reason) are left as they are.
    """
    status_path = cell_dir / "status.json"
    status: dict[str, Any] = {}
    if status_path.exists() or status_path.is_symlink():
        try:
            status = json.loads(status_path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError, RecursionError):
            return []  # the gate reports the unreadable file (exit 2); a dangling link is one too
        if not isinstance(status, dict):
            return []
    unreported = [stage for stage in stages if not (cell_dir / stage).is_dir() and stage not in status]
    if unreported:
        status.update({stage: {"status": "error", "reason": reason} for stage in unreported})
        if status_path.is_symlink():  # an artifact's link: its copy becomes a file; nothing is written where it led
            status_path.unlink()
        status_path.write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
    return unreported


def unreported_reason(cells_result: str) -> str:
    return (f"the cell's job ended before this stage reported anything (cells job result: {cells_result or 'unknown'}); "
            "see the job's log")


def read_sides(value: str) -> list[str]:
    """$KVGATE_SIDES: the sides the workflow ran (`base,head` for an A/B run); empty: the gate infers them."""
    sides = [side.strip() for side in value.split(",") if side.strip()]
    unknown = [side for side in sides if side not in SIDES]
    if unknown:
        raise GateJobError(f"$KVGATE_SIDES: unknown side {unknown[0][:40]!r}. Write base,head or head")
    return sides


def require_baseline(environ: Mapping[str, str]) -> bool:
    """--require-baseline, except on the first reference run a maintainer asks for (push or manual). Never off on a PR."""
    bootstrap = environ.get("KVGATE_BOOTSTRAP_BASELINE", "").strip().lower()
    if bootstrap not in ("", "false", "true"):
        raise GateJobError(f"$KVGATE_BOOTSTRAP_BASELINE: {bootstrap[:40]!r}, expected true or false")
    return not (bootstrap == "true" and environ.get("GITHUB_EVENT_NAME") in BOOTSTRAP_EVENTS)


def merged_run_info(assembly: Assembly, environ: Mapping[str, str], sides: Sequence[str]) -> dict[str, Any]:
    """run.json of the assembled run: this workflow's or build's facts (ci/ci_facts.py: GitHub Actions or Buildkite;
    the branch of a push or scheduled build, which the gate's history of main reads); each job's own run.json under
    `jobs`, as data."""
    info: dict[str, Any] = {"contract_version": 1, **ci_facts.run_facts(environ)}
    if sides:
        info["sides"] = list(sides)
    if assembly.run_infos:
        info["jobs"] = assembly.run_infos
        shown = [job.get("vllm_under_test") for job in assembly.run_infos.values() if isinstance(job, dict)]
        shown = [value for value in shown if isinstance(value, dict)]
        if shown:
            info["vllm_under_test"] = shown[0]  # the report's context line shows it; no check reads it
    return info


def gate_command(nox: Sequence[str], run_dir: Path, baseline: Path | None, *, expect_cells: Path,
                 require_baseline: bool = True, root: Path = ROOT, log_url: str | None = None) -> list[str]:
    # --matrix-dir / --policy: the gate session installs kvgate into its own venv, away from the checkout's matrix/.
    argv = [*nox, "-s", "gate", "--", str(run_dir), "--matrix-dir", str(root / "matrix"),
            "--policy", str(root / "matrix" / "policy.toml"), "--expect-cells", str(expect_cells)]
    if require_baseline:
        argv.append("--require-baseline")
    if baseline is not None:
        argv += ["--baseline", str(baseline)]
    if log_url is not None:
        argv += ["--log-url", log_url]
    return argv


def log_links(environ: Mapping[str, str], cells: Sequence[str], folder: Path,
              gh: Sequence[str] = ("gh",)) -> str | None:
    """Where the reports link a cell's log in CI (`kvgate gate --log-url`): the artifact its cell job uploaded.

    Buildkite links a file of an artifact itself (`artifact://` in an annotation): each log is linked. GitHub Actions
    serves an artifact as one zip: each cell's log links its job's artifact `kvgate-cell-<id>` (its id asked of the
    API with the job's token, `actions: read`), or where the API cannot answer, the run's page, which lists them.
    None outside CI: the reports link the logs by their paths."""
    if ci_facts.source(environ) == ci_facts.BUILDKITE:
        return f"artifact://{ARTIFACT_PREFIX}{{cell}}/{{path}}"
    repository, run_id = environ.get("GITHUB_REPOSITORY", ""), environ.get("GITHUB_RUN_ID", "")
    if not (re.fullmatch(r"[\w.-]+/[\w.-]+", repository) and run_id.isdigit()):
        return None
    run_page = f"https://github.com/{repository}/actions/runs/{run_id}"
    ids: dict[str, str] = {}
    try:
        listed = subprocess.run([*gh, "api", "--paginate", f"repos/{repository}/actions/runs/{run_id}/artifacts",
                                 "--jq", ".artifacts[] | [.name, (.id | tostring)] | @tsv"], capture_output=True,
                                text=True, timeout=120, check=False)
        if listed.returncode == 0:
            ids = dict(line.split("\t", 1) for line in listed.stdout.splitlines() if line.count("\t") == 1)
        else:
            print(f"::warning::the cells' artifacts could not be listed ({(listed.stderr.strip() or 'gh failed')[:200]}"
                  "): the reports link the logs to the run's page", flush=True)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"::warning::gh could not list the cells' artifacts ({error}): the reports link the logs to the run's "
              "page", flush=True)
    links = {"*": run_page}
    for cell in cells:
        artifact = ids.get(f"{ARTIFACT_PREFIX}{cell}", "")
        if artifact.isdigit():
            links[cell] = f"{run_page}/artifacts/{artifact}"
    path = folder / "log-links.json"
    path.write_text(json.dumps(links, indent=2) + "\n", encoding="utf-8")
    return f"@{path}"


def usable_baseline(baseline_dir: Path | None) -> Path | None:
    """The baseline run folder, if the fetch step left one with cells in it."""
    if baseline_dir is None or not baseline_dir.is_dir():
        return None
    return baseline_dir if any(baseline_dir.glob("*/cell.json")) else None


def pull_request_info(event_path: str | None) -> dict[str, Any] | None:
    """{"number", "head_sha"} of the pull request this run is for, from the event payload; None for another event's.

    The payload is read as a file kvgate did not write (a regular file of at most EVENT_READ_LIMIT bytes: a FIFO
    blocked the job for ever, /dev/zero was read without end); one that cannot be read, or is not JSON, is bad input."""
    if not event_path:
        return None
    shown = event_path if event_path.isprintable() else ascii(event_path)
    try:
        event = json.loads(read_bytes(event_path, EVENT_READ_LIMIT).decode("utf-8"))
    except NotRegularFile as error:
        raise GateJobError(f"$GITHUB_EVENT_PATH {shown[:200]}: not a regular file ({error.kind}). Point it at the "
                           "event's JSON payload (GitHub Actions sets it), or unset it") from None
    except FileTooLarge:
        raise GateJobError(f"$GITHUB_EVENT_PATH {shown[:200]}: more than {EVENT_READ_LIMIT >> 20} MiB, larger than "
                           "any event's payload. Point it at the event's JSON payload, or unset it") from None
    except OSError as error:
        raise GateJobError(f"$GITHUB_EVENT_PATH {shown[:200]}: cannot read it ({error.strerror or error}). Point it "
                           "at the event's JSON payload (GitHub Actions sets it), or unset it") from None
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise GateJobError(f"$GITHUB_EVENT_PATH {shown[:200]}: not JSON. Point it at the event's JSON payload "
                           "(GitHub Actions sets it), or unset it") from None
    pr = event.get("pull_request") if isinstance(event, dict) else None
    if not isinstance(pr, dict) or isinstance(pr.get("number"), bool) or not isinstance(pr.get("number"), int):
        return None
    head = pr.get("head") if isinstance(pr.get("head"), dict) else {}
    return {"number": pr["number"], "head_sha": str(head.get("sha", ""))}


def clip(text: str, limit: int, note: str) -> str:
    """text cut at a line boundary to fit `limit` UTF-8 bytes, with a note saying so."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    cut = data[: limit - len(note.encode("utf-8")) - 2].decode("utf-8", errors="ignore")
    return cut[: cut.rfind("\n") + 1] + "\n" + note + "\n"


def note_report(title: str, lines: Sequence[str]) -> str:
    """report.md written by this job when the gate did not write one."""
    return "\n".join([f"## kvgate: {title}", "", *lines]) + "\n"


def annotation(report: str, limit: int = ANNOTATION_LIMIT) -> str:
    """The report as a Buildkite annotation of at most `limit` UTF-8 bytes: folded where it is longer, with a line
    saying where the whole report is (the gate step uploads the gate folder as this build's artifacts)."""
    folded = "_({what}: folded to fit the annotation; see kvgate-run/gate/report.md in this build's artifacts)_"
    note = "_(the rest of the report did not fit the annotation: kvgate-run/gate/report.md in this build's artifacts)_"
    characters = limit
    while True:  # fit counts characters; an annotation's limit is in bytes
        text = pr_comment.fit(report, characters, folded, note)
        size = len(text.encode("utf-8"))
        if size <= limit:
            return text
        characters -= size - limit


def _annotate(gate_dir: Path, report: str, environ: Mapping[str, str]) -> None:
    if ci_facts.source(environ) == ci_facts.BUILDKITE:
        gate_dir.mkdir(parents=True, exist_ok=True)
        (gate_dir / ANNOTATION_FILE).write_text(annotation(report), encoding="utf-8")


def _summarise(summary: str | None, report: str, status: int) -> int:
    """Append the report to $GITHUB_STEP_SUMMARY; the exit status to end with. Where the summary cannot be written,
    one ERROR line says so and the gate's failure stands as it is, but a pass becomes 2: bad input is never a pass."""
    try:
        step_files.append("GITHUB_STEP_SUMMARY", summary, report)
    except step_files.StepFileError as error:
        print(f"ERROR {error}", file=sys.stderr, flush=True)
        return status or 2
    return status


def _write_pull_request(gate_dir: Path, environ: Mapping[str, str]) -> None:
    pr = pull_request_info(environ.get("GITHUB_EVENT_PATH"))
    if pr is not None:
        gate_dir.mkdir(parents=True, exist_ok=True)
        (gate_dir / PULL_REQUEST_FILE).write_text(json.dumps(pr) + "\n", encoding="utf-8")


def run(environ: Mapping[str, str]) -> int:
    artifacts_dir = Path(environ.get("ARTIFACTS_DIR", "artifacts"))
    run_dir = Path(environ.get("KVGATE_RUN_DIR", "kvgate-run"))
    baseline_dir = Path(environ["BASELINE_DIR"]) if environ.get("BASELINE_DIR") else None
    nox = environ.get("KVGATE_NOX", "nox").split()
    gate_dir = run_dir / GATE_FOLDER
    summary = environ.get("GITHUB_STEP_SUMMARY")
    plan_result = environ.get("PLAN_RESULT", "")
    sides = read_sides(environ.get("KVGATE_SIDES", ""))
    required = require_baseline(environ)

    try:
        if run_dir.is_dir() and any(run_dir.iterdir()):
            raise GateJobError(f"{run_dir}: the run folder must start empty; it holds files already")
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file there, or on its way; a folder that cannot be listed or made
        what = "it is a file" if error.errno == errno.EEXIST else error.strerror or str(error)
        raise GateJobError(f"$KVGATE_RUN_DIR {run_dir}: cannot make the run folder ({what}). Point it at an empty or "
                           "new folder") from None
    _write_pull_request(gate_dir, environ)

    if plan_result != "success":
        report = note_report("plan failed", [f"The plan job ended `{plan_result or 'unknown'}`: no cell was chosen, "
                                             "so nothing can be checked. See the plan job's log."])
        return _finish(gate_dir, summary, report, 1, environ)

    planned = planned_cells(environ.get("PLANNED_MATRIX", ""))
    if not planned:
        report = note_report("nothing to check", [
            "This change touches nothing the matrix's cells run or read, so no cell was planned and no GPU job "
            "ran. Pass."])
        return _finish(gate_dir, summary, report, 0, environ)

    assembly = assemble(artifacts_dir, run_dir, planned, sides)
    cells_result = environ.get("CELLS_RESULT", "")
    stages_of = {str(e["cell"]): e.get("stages") or CELL_STAGES for e in planned}  # the plan's stages per cell
    for name in assembly.cells:
        stages = stages_of.get(name.removesuffix(BASE_SUFFIX), CELL_STAGES)
        for stage in mark_unreported_stages(run_dir / name, stages, unreported_reason(cells_result)):
            print(workflow_command("error", f"its {stage} stage never reported; the gate fails it", title=name),
                  flush=True)
    present = {name.removesuffix(BASE_SUFFIX) for name in assembly.cells}
    for entry in planned:
        if entry["cell"] not in present and isinstance(entry.get("held_back"), str):  # the plan's GPU budget
            print(workflow_command("error", f"{entry['held_back'][:300]}; the gate fails it as missing",
                                   title=entry["cell"]), flush=True)
        elif entry["cell"] not in present:
            print(workflow_command("error", f"no results from its job (cells job result: {cells_result or 'unknown'}); "
                                            "the gate fails it as missing", title=entry["cell"]), flush=True)
    for problem in assembly.problems:  # they quote the artifacts' files: escaped, a value cannot issue a command
        print(workflow_command("warning", problem), flush=True)

    (run_dir / "run.json").write_text(json.dumps(merged_run_info(assembly, environ, sides), indent=2) + "\n",
                                      encoding="utf-8")
    baseline = usable_baseline(baseline_dir)
    with tempfile.TemporaryDirectory(prefix="kvgate-gate-job-") as tmp:
        expected = Path(tmp) / EXPECTED_CELLS_FILE
        expected.write_text(json.dumps({"include": [  # the plan's cells and stages: each planned stage is required
            {"cell": e["cell"], **{key: e[key] for key in ("stages", "not_planned") if key in e}} for e in planned]})
            + "\n", encoding="utf-8")
        cells = sorted({str(e["cell"]) for e in planned})
        argv = gate_command(nox, run_dir, baseline, expect_cells=expected, require_baseline=required,
                            log_url=log_links(environ, cells, Path(tmp)))
        print(f"kvgate gate job: {len(planned)} planned cells, {len(assembly.cells)} cell folders; "
              f"baseline: {baseline or 'none'}{'' if required else ' (bootstrap: none required)'}", flush=True)
        print(f"kvgate gate job: {' '.join(argv)}", flush=True)
        try:
            # The gate appends report.md to $GITHUB_STEP_SUMMARY itself; this job does it once, clipped, with notes.
            # ... and the token that listed the artifacts stays with this job: the gate reads artifacts as data only
            gate_env = {key: value for key, value in environ.items() if key not in ("GITHUB_STEP_SUMMARY", "GH_TOKEN")}
            result = subprocess.run(argv, cwd=ROOT, env=gate_env, check=False, capture_output=True, text=True)
        except OSError as error:
            raise GateJobError(f"{argv[0]}: {error.strerror}. Install nox (`pip install nox`)") from None
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    status = result.returncode
    if (gate_dir / "report.md").is_file():
        report = (gate_dir / "report.md").read_text(encoding="utf-8", errors="replace")
        if baseline is None and not sides:
            report += ("\n_No baseline: no usable kvgate-run artifact of an earlier run on main was found"
                       + (" (a bootstrap run: this one becomes the first reference)._\n" if not required else "._\n"))
        _annotate(gate_dir, report, environ)
        return _summarise(summary, clip(report, SUMMARY_LIMIT, "_(report cut to fit the step summary; the full "
                                                              "report is in the kvgate-gate artifact)_"), status)
    tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-40:])
    report = note_report("the gate wrote no report", [
        f"`{' '.join(argv)}` exited {status} without writing {GATE_FOLDER}/report.md.", "", "```", tail, "```"])
    return _finish(gate_dir, summary, report, status or 1, environ)


def _finish(gate_dir: Path, summary: str | None, report: str, status: int, environ: Mapping[str, str]) -> int:
    gate_dir.mkdir(parents=True, exist_ok=True)
    (gate_dir / "report.md").write_text(report, encoding="utf-8")
    _annotate(gate_dir, report, environ)
    return _summarise(summary, report, status)


def main() -> int:
    try:
        return run(os.environ)
    except GateJobError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
