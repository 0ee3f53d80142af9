"""`kvgate gate RUN_DIR [--baseline DIR]`: judge a results folder; write verdict.json, report.md/.html, junit.xml.

Exit status: 0 every required check passed (waived ones included); 1 a regression, or a required cell or
stage missing, failed or errored, or a file inside a cell's folder unreadable (that cell errors, one `ERROR <file>:
...` line each, the other cells judged as usual); 2 input unusable as a whole (a missing run folder, run.json, the
matrix, the policy: one `ERROR <file>: ...` line per problem).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kvgate import InputError, InputErrors, one_line, problems_of
from kvgate.gate import evaluation as gate
from kvgate.gate import policy as policy_module
from kvgate.gate import probe_agreement
from kvgate.gate import trusted as trusted_fields
from kvgate.history import record as history_record
from kvgate.history import store as history_store
from kvgate.history import trends as history_trends
from kvgate.kernels import timings
from kvgate.matrix import cells as matrix_module
from kvgate.matrix import regular_files
from kvgate.matrix.toml_reading import shown_path
from kvgate.report import HistoryPlots, headline, write_all
from kvgate.report.workflow_commands import workflow_commands
from kvgate.results.parsers.contract import parse_planned_out, parse_stage_plan
from kvgate.results.records import BASE, HEAD, STAGES, CellResults, LogPointer
from kvgate.results.run_loader import GATE_FOLDER, KnownNames, cell_problems, load_run, planned_cells

HELP = "judge a results folder: verdict, report (md/html), junit.xml; exit 0 pass, 1 regression, 2 bad input"
HISTORY_PLOTTED_CELLS = 16  # report.html's "History of main" draws this many of a run's cells at most
HISTORY_PLOTTED_RUNS = 30  # and the newest this many runs of each series
MAX_GIVEN_FILE_BYTES = 64 * 1024 * 1024  # --expect-cells, --log-url @FILE: a plan of every cell is a few hundred kB


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the results folder (docs/results-folder.md)")
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="a results folder to compare every cell with")
    parser.add_argument("--out", type=Path, metavar="DIR", help=f"where the outputs go (default RUN_DIR/{GATE_FOLDER}/)")
    parser.add_argument("--require", action="append", default=[], metavar="STAGES",
                        help=f"comma-separated stages every cell must have run ({', '.join(REQUIRABLE_STAGES)}, or all); "
                             "repeatable, each adds its stages")
    parser.add_argument("--policy", type=Path, metavar="FILE",
                        help="thresholds (default: policy.toml of the matrix folder, --matrix-dir or matrix/)")
    parser.add_argument("--matrix-dir", type=Path, metavar="DIR", help="default: the repository's matrix/")
    parser.add_argument("--today", metavar="YYYY-MM-DD", help="the date waivers expire against (default: today, UTC)")
    parser.add_argument("--require-baseline", action="store_true",
                        help="fail when the change was compared with nothing (no base side in the run, no "
                             "--baseline); without it such a run is NEUTRAL. CI passes it")
    parser.add_argument("--expect-cells", type=Path, metavar="FILE",
                        help="cells the run must hold: GitHub Actions' matrix JSON ({\"include\": [{\"cell\": "
                             "...}]}) or one cell id per line; absent ones fail (run.json's planned cells always do)")
    parser.add_argument("--log-url", metavar="TEMPLATE|@FILE",
                        help="where the reports link a cell's log: a template with {path} (the log's path in the run "
                             "folder), {folder} (its cell folder) and {cell} (its cell id), e.g. "
                             "'artifact://kvgate-cell-{cell}/{path}' on Buildkite; or @FILE, a JSON object of cell id -> "
                             "template (\"*\": any other cell). Default: the log's path relative to the report")
    parser.add_argument("--history", metavar="PATH|URL",
                        help=f"where a run of {history_record.HISTORY_BRANCH} (run.json `branch`) is recorded: a SQLite "
                             f"file or a postgresql:// URL (default ${history_store.URL_ENV}, else "
                             f"{history_store.DEFAULT_SQLITE})")


# long_context is not one: whether a cell asks the passkey task is the matrix's call (kvgate.gate.trusted holds a
# folder of contract 1.10 to it), not a flag's
REQUIRABLE_STAGES = tuple(stage for stage in STAGES if stage != "long_context")


def parse_require(value: str) -> tuple[str, ...]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if "all" in names:
        return REQUIRABLE_STAGES
    unknown = [n for n in names if n not in REQUIRABLE_STAGES]
    if unknown:
        raise InputError("--require", f"unknown stage '{unknown[0]}'",
                         hint=f"Stages: {', '.join(REQUIRABLE_STAGES)} (comma-separated), or all")
    return tuple(names)


def parse_today(value: str | None) -> dt.date:
    if value is None:
        return dt.datetime.now(dt.UTC).date()
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise InputError("--today", f"bad date '{value}'", hint="Write YYYY-MM-DD, e.g. 2026-11-30") from None


def planned_sides(run_info: Mapping[str, Any], ab: bool) -> list[str]:
    sides = run_info.get("sides")
    named = [s for s in sides if s in (BASE, HEAD)] if isinstance(sides, list) else []
    if ab or BASE in named:
        return [BASE, HEAD]
    return [HEAD]


@dataclass(frozen=True, slots=True)
class ExpectedCell:
    """A cell the trusted plan asked for, with the stages planned for it and why the plan left others out."""

    cell: str
    stages: tuple[str, ...] = ()
    not_planned: Mapping[str, str] = field(default_factory=dict)


def read_expected_cells(path: Path) -> list[ExpectedCell]:
    """--expect-cells: GitHub Actions' {"include": [{"cell": ..., "stages": [...], "not_planned": {...}}]} (the plan
    job's entries; stages and not_planned optional) or one cell id per line."""
    shown = str(path)
    try:
        text = read_given_file(path, "--expect-cells", "Pass the plan's matrix JSON or a list of cell ids, saved to a file")
    except FileNotFoundError:
        raise InputError(shown, "no such file", hint="Pass the plan's matrix JSON or a list of cell ids") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(shown, f"cannot read: {getattr(error, 'strerror', None) or error}") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(shown, f"not valid JSON ({error.msg})", f"line {error.lineno} column {error.colno}") from None
        include = data.get("include") if isinstance(data, dict) else None
        if not isinstance(include, list) or not all(isinstance(e, dict) and isinstance(e.get("cell"), str)
                                                    for e in include):
            raise InputError(shown, "expected {\"include\": [{\"cell\": \"<id>\", ...}, ...]}", "include",
                             hint="Pass the plan job's matrix output as it is")
        found = []
        for index, entry in enumerate(include):
            stages, reasons = entry.get("stages", []), entry.get("not_planned", {})
            if not isinstance(stages, list) or not all(s in STAGES for s in stages):
                raise InputError(shown, f"expected a list of stages ({', '.join(STAGES)})", f"include[{index}].stages")
            if not isinstance(reasons, dict) or not all(k in STAGES and isinstance(v, str) for k, v in reasons.items()):
                raise InputError(shown, "expected {stage: reason}", f"include[{index}].not_planned")
            found.append(ExpectedCell(cell=entry["cell"], stages=tuple(stages), not_planned=dict(reasons)))
        return found
    cells = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    from kvgate.results.parsers.contract import CELL_ID

    bad = [c for c in cells if not CELL_ID.fullmatch(c)]  # the one cell-id pattern of the results contract
    if bad:
        raise InputError(shown, f"'{bad[0][:60]}' is not a cell id", hint="Write one id per line, e.g. flashmla-fp8-sm90")
    return [ExpectedCell(cell=cell) for cell in cells]


def read_given_file(path: Path, flag: str, hint: str) -> str:
    """The text of a file named by a flag: a regular file of at most MAX_GIVEN_FILE_BYTES (a FIFO would block the
    gate, /dev/zero never ends: InputError); OSError or UnicodeDecodeError for the caller to word."""
    try:
        data = regular_files.read_bytes(path, MAX_GIVEN_FILE_BYTES)
    except regular_files.NotRegularFile as error:
        raise InputError(str(path), f"not a regular file ({error.kind}), given as {flag}", hint=hint) from None
    except regular_files.FileTooLarge:
        raise InputError(str(path), f"larger than {MAX_GIVEN_FILE_BYTES // (1024 * 1024)} MiB, given as {flag}",
                         hint=hint) from None
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text read it


def read_log_url(value: str | None) -> dict[str, str]:
    """--log-url: cell id -> template ("*" for every cell); {} for none (links relative to the report)."""
    if value is None:
        return {}
    if not value.startswith("@"):
        return {"*": value}
    path = Path(value[1:])
    try:
        data = json.loads(read_given_file(path, "--log-url @FILE", "Pass --log-url @FILE of a JSON object of cell id "
                                          "-> template"))
    except OSError as error:
        raise InputError(str(path), f"cannot read: {error.strerror or error}", hint="Pass --log-url @FILE of a JSON "
                         "object of cell id -> template") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(str(path), f"not valid JSON ({getattr(error, 'msg', error)})", "the file",
                         'Write {"<cell id>": "<template>", "*": "<template>"}') from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise InputError(str(path), "expected a JSON object of cell id -> template (strings)", "the top level",
                         'Write {"<cell id>": "<template>", "*": "<template>"}')
    return data


def log_url(pointer: LogPointer, templates: Mapping[str, str], run_dir: Path, out_dir: Path) -> str:
    """Where the reports link a log: the cell's template filled in, else its path relative to the gate's folder. The
    path is the cell folder's name, which is free: percent-encoded, and a relative address starts with `./` or `../`,
    so no name reads as a scheme (a folder `javascript:alert(1)` beside the gate's outputs, `--out RUN_DIR`)."""
    folder = pointer.path.split("/", 1)[0]
    cell = folder.removesuffix("--base")
    template = templates.get(cell, templates.get("*"))
    if template is None:
        relative = quote(Path(os.path.relpath(Path(run_dir) / pointer.path, out_dir)).as_posix())
        return relative if relative.startswith("../") else f"./{relative}"
    return (template.replace("{path}", quote(pointer.path)).replace("{folder}", quote(folder))
            .replace("{cell}", quote(cell)))


def with_log_urls(verdict: gate.Verdict, templates: Mapping[str, str], run_dir: Path, out_dir: Path) -> gate.Verdict:
    checks = tuple(replace(c, log=replace(c.log, url=log_url(c.log, templates, run_dir, out_dir)))
                   if c.log is not None else c for c in verdict.checks)
    return replace(verdict, checks=checks)


def kernel_timings(cells: Iterable[CellResults]) -> dict[str, list[timings.TimingEntry]]:
    """Each cell's kernels/timings.json, for the history (the verdict does not carry them). One that cannot be read
    is left out with a line saying why: the gate has judged it already (a corrupt one is its kernel stage's ERROR)."""
    found = {}
    for cell in cells:
        path = Path(cell.folder) / "kernels" / "timings.json"
        if not path.is_file():
            continue
        try:
            found[cell.identity.id] = timings.read(path)
        except ValueError as error:
            print(f"kvgate gate: kernel timings of {cell.identity.id} not recorded in the history: {one_line(error)}",
                  file=sys.stderr)
    return found


def record_history(verdict: gate.Verdict, where: str | None, cells: Iterable[CellResults]) -> HistoryPlots:
    """A run of main leaves its figures in the history (kvgate history); one that cannot is bad input (exit 2).
    Returns the trends of the run's cells for report.html, those that need attention first."""
    recorded_at = history_record.run_time(verdict.run_info)  # the run's own time orders the history, not the gate's
    if recorded_at is None:
        recorded_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        print(f"kvgate gate: run.json says neither when the run finished nor when it started: recorded at the gate's "
              f"time, {recorded_at}", file=sys.stderr)
    run = history_record.history_run(verdict, recorded_at=recorded_at, kernel_timings=kernel_timings(cells))
    with history_store.open_store(history_store.location(where)) as history:
        history.record(run)
        print(f"kvgate gate: recorded {len(run.figures)} figures of this {run.branch} run in {history.shown}",
              file=sys.stderr)
        recorded: dict[str, list[str]] = {}
        for figure in run.figures:
            recorded.setdefault(figure.cell, []).append(figure.measure)
        drawn = {cell: history_trends.report_measures(measures) for cell, measures in recorded.items()}
        drawn = {cell: measures for cell, measures in drawn.items() if measures}
        attention = {check.cell for check in verdict.failed}
        plots = [history_trends.stacked([history_trends.svg(cell, measure, history.series(
                     run.branch, cell, measure)[-HISTORY_PLOTTED_RUNS:]) for measure in drawn[cell]])
                 for cell in sorted(drawn, key=lambda cell: (cell not in attention, cell))[:HISTORY_PLOTTED_CELLS]]
    return HistoryPlots(plots=tuple(plots), cells=len(drawn), runs=HISTORY_PLOTTED_RUNS)


def _same_folder(first: Path, second: Path) -> bool:
    """Whether two paths name one folder (through links, `.` and `..`); False where either cannot be read (the loader
    then names the fault)."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    require = parse_require(",".join(args.require))  # every --require given, never only the last one
    today = parse_today(args.today)
    matrix = matrix_module.load(args.matrix_dir)
    policy = policy_module.load(args.policy or (args.matrix_dir / policy_module.POLICY_FILE if args.matrix_dir
                                                else None), matrix=matrix)  # as `kvgate run` reads it
    known = KnownNames.from_matrix(matrix)
    problems: list[InputError] = []
    results = baseline = None
    expected_entries = read_expected_cells(args.expect_cells) if args.expect_cells is not None else []
    expected = [entry.cell for entry in expected_entries]
    if args.baseline is not None and _same_folder(args.run_dir, args.baseline):
        raise InputError(str(args.baseline), "the baseline is the run folder itself, given as --baseline: every cell "
                                             "would be compared with itself, a comparison that cannot fail",
                         hint="Pass the results folder of the vLLM the change is compared with")
    for which, folder in (("run", args.run_dir), ("baseline", args.baseline)):
        if folder is None:
            continue
        try:  # a run folder that planned cells (run.json, --expect-cells) and holds none: each of them is missing
            loaded = load_run(folder, known, cells_expected=which == "run" and bool(expected))
        except (InputError, InputErrors) as error:
            problems.extend(problems_of(error))
            continue
        except OSError as error:  # an unreadable folder met while walking the run (files are read safely)
            problems.append(InputError(str(error.filename or folder), f"cannot read: {error.strerror}",
                                       hint=f"Check the permissions of the {which} folder"))
            continue
        if which == "run":
            results = loaded
        else:
            baseline = loaded
    if problems:
        raise InputErrors(problems)
    assert results is not None
    for loaded in (results, baseline):  # a cell's unreadable file fails that cell (exit 1); the others are judged
        for line in cell_problems(loaded) if loaded is not None else ():
            print(f"ERROR {one_line(line)}", file=sys.stderr)
    ab = results.has_base_side
    if ab:
        if baseline is not None:
            raise InputError("--baseline", f"{args.run_dir} is an A/B run: it holds its own base side",
                             hint="Judge it alone, or judge a run of one side against --baseline")
        results, baseline = results.side(HEAD), results.side(BASE)
    sides = planned_sides(results.run_info, ab)
    planned = [(cell, side) for cell in [*planned_cells(results.run_info), *expected] for side in sides]
    planned_out = parse_planned_out(results.run_info, f"{args.run_dir}/run.json")
    stages, not_planned = parse_stage_plan(results.run_info, f"{args.run_dir}/run.json")
    for entry in expected_entries:  # the trusted plan's stages: a run.json cannot plan fewer
        stages.setdefault(entry.cell, set()).update(entry.stages)
        if entry.stages and "accuracy" in entry.stages:
            stages[entry.cell].add("probe")
        not_planned.setdefault(entry.cell, {}).update(entry.not_planned)
    verdict = gate.evaluate(results, policy=policy, baseline=baseline, waiver_for=matrix.waiver_for, today=today,
                            require=require, probe_compare=probe_agreement.compare, ab=ab,
                            require_baseline=args.require_baseline, planned=planned, planned_out=planned_out,
                            planned_stages=stages, not_planned=not_planned,
                            trusted=trusted_fields.trusted_cells(matrix, shown_path(
                                (args.matrix_dir or matrix_module.default_matrix_dir()) / "workloads.toml")))
    out_dir = args.out if args.out is not None else args.run_dir / GATE_FOLDER
    verdict = with_log_urls(verdict, read_log_url(args.log_url), args.run_dir, out_dir)
    history, unrecorded = None, None
    if history_record.is_main(verdict.run_info):
        try:
            history = record_history(verdict, args.history, results.cells)
        except InputError as error:  # the verdict and its report are written all the same; then exit 2
            unrecorded = error
    paths = write_all(verdict, out_dir, history)
    print(one_line(headline(verdict)))
    if unrecorded is not None:
        raise unrecorded
    if os.environ.get("GITHUB_ACTIONS") == "true":  # annotations on the run and the pull request
        for line in workflow_commands(verdict):
            print(line)
    print(f"kvgate gate: wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    print(f"kvgate gate: next, read {paths['report.md']} (what failed and why, first; report.html beside it "
          "adds the plots)", file=sys.stderr)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as handle:
                handle.write(paths["report.md"].read_text(encoding="utf-8"))
        except OSError as error:
            print(f"kvgate gate: could not append to $GITHUB_STEP_SUMMARY: {error}", file=sys.stderr)
    return verdict.exit_status
