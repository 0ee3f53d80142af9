"""Read a results folder (docs/results-folder.md) into kvgate.results.records records: the only part of the gate that walks disks.

Each file is checked against its JSON Schema (kvgate.results.schema) before its typed reading. A stage marked
error/timeout/skipped in status.json is not parsed (its outputs may be half there); a stage whose folder holds no
outputs is recorded as missing (the gate fails it). A file inside one cell's folder that cannot be read (truncated by
a killed job, corrupt, against its schema) is that cell's problem, never the run's: an unreadable stage output makes
the stage an error (StageResult.unreadable), an unreadable cell.json or status.json the whole cell
(RunResults.unreadable); the gate judges the other cells as usual. Only what makes the run unusable as a whole (a
missing run folder, run.json, two folders of one cell, no cells at all and none planned) raises InputErrors, every
problem collected, each naming the file (exit 2).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import multiprocessing
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate import InputError, InputErrors, problems_of
from kvgate.results import probe_file, schema
from kvgate.results.parsers import contract, junit, lm_eval, tool_log, vllm_bench
from kvgate.results.parsers.reading import present, read_bytes, read_text
from kvgate.results.records import (
    HEAD,
    LONG_CONTEXT_TASK,
    SIDES,
    STAGES,
    CellIdentity,
    CellResults,
    LogPointer,
    RunResults,
    StageResult,
    StageStatus,
    ThroughputResult,
    UnreadableCell,
)

GATE_FOLDER = "gate"
_CELL_MARKERS = (*STAGES, "status.json")


@dataclass(frozen=True, kw_only=True, slots=True)
class KnownNames:
    """The axes a cell.json may name (from the matrix)."""

    backends: Collection[str]
    kv_cache_dtypes: Collection[str]
    archs: Collection[str]
    features: Collection[str] = ()  # the feature axis (matrix/axes.toml [features]); a plain cell names none

    @classmethod
    def from_matrix(cls, matrix: Any) -> KnownNames:
        return cls(backends=tuple(matrix.backends), kv_cache_dtypes=tuple(matrix.kv_cache_dtypes),
                   archs=tuple(matrix.archs), features=tuple(getattr(matrix, "features", ())))


def planned_cells(run_info: Mapping[str, Any]) -> list[str]:
    """The cell ids that the kvgate commands writing into the run planned (run.json: `cells` of every
    invocation); a hand-made run.json without them plans nothing."""
    invocations = run_info.get("invocations")
    listed = [i.get("cells") for i in invocations if isinstance(i, Mapping)] if isinstance(invocations, list) else []
    listed.append(run_info.get("cells"))
    return list(dict.fromkeys(c for cells in listed if isinstance(cells, list) for c in cells if isinstance(c, str)))


def load_run(run_dir: Path, known: KnownNames, *, metric: str = lm_eval.DEFAULT_METRIC,
             workers: int | None = None, cells_expected: bool = False) -> RunResults:
    """All cells of a run folder; raises InputErrors listing every unusable file.

    A folder without a cell is no run (InputError), unless its run.json plans cells or the caller expects some
    (`cells_expected`: --expect-cells): then it is a run whose every planned cell is missing, for the gate to fail by
    name. Large runs are read by `workers` processes (default: one per CPU when the run has many cells)."""
    run_dir = Path(run_dir)
    shown = str(run_dir)
    if not run_dir.exists():
        raise InputError(shown, "no such folder", hint="Pass the run folder the runners wrote (reports/runs/...)")
    if not run_dir.is_dir():
        raise InputError(shown, "not a folder", hint="Pass the run folder, not a file in it")
    problems: list[InputError] = []
    run_info: dict[str, Any] = {}
    if present(run_dir / "run.json"):  # a dangling link too: it cannot be read
        try:
            run_info = contract.parse_run(read_text(run_dir / "run.json", f"{shown}/run.json"), f"{shown}/run.json")
        except InputError as error:
            problems.append(error)
    cells: list[CellResults] = []
    unreadable: list[UnreadableCell] = []
    seen: dict[tuple[CellIdentity, str], str] = {}
    jobs = []
    for entry in sorted(p for p in run_dir.iterdir() if not p.name.startswith(".") and p.name != GATE_FOLDER):
        if entry.is_symlink() and not entry.exists():  # a cell's folder swapped for a link to nothing, or a loop
            unreadable.append(_unreadable(entry.name, f"{shown}/{entry.name}", [_link_to_nothing(entry)]))
    for folder in sorted(p for p in run_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        cell_shown = f"{shown}/{folder.name}"
        if not present(folder / "cell.json"):
            if folder.name != GATE_FOLDER and any(present(folder / marker) for marker in _CELL_MARKERS):
                unreadable.append(_unreadable(folder.name, cell_shown, [InputError(
                    cell_shown, "cell folder without cell.json",
                    hint="Write cell.json with backend, kv_cache_dtype, arch and model")]))
            continue
        jobs.append((folder, cell_shown, known, metric))
    with _cyclic_gc_paused():
        loaded = list(_map(_load_cell_collecting, jobs, workers))
    for cell in loaded:
        if isinstance(cell, UnreadableCell):
            unreadable.append(cell)
            continue
        cell_shown = cell.folder
        key = (cell.identity, cell.side)
        if key in seen:
            side = f", {cell.side} side" if cell.side != HEAD else ""
            problems.append(InputError(f"{cell_shown}/cell.json", f"duplicate cell {cell.identity.id} "
                                       f"(model {cell.identity.model}, task {cell.identity.task}{side})",
                                       "the top level", f"{seen[key]} is the same cell; keep one of them"))
            continue
        seen[key] = f"{cell_shown}/cell.json"
        cells.append(cell)
    if problems:
        raise InputErrors(problems)
    if not cells and not unreadable and not cells_expected and not planned_cells(run_info):
        raise InputError(shown, "no cell folders (none holds a cell.json)",
                         hint="Is this a run folder? Each cell writes <run dir>/<cell id>/cell.json")
    return RunResults(folder=shown, cells=tuple(cells), run_info=run_info, unreadable=tuple(unreadable))


def cell_problems(run: RunResults) -> list[str]:
    """Every problem that made a cell or one of its stages unreadable, one "<file>: <what is wrong>" line each (the
    gate prints them as ERROR lines and judges each such cell as an error)."""
    lines = [problem for cell in run.unreadable for problem in cell.problems]
    lines += [problem for cell in run.cells for stage in cell.stages.values() for problem in stage.unreadable]
    return sorted(lines)


PARALLEL_FROM_CELLS = 16


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Reading a run builds millions of small containers that hold no cycles (a probe file's logprobs and top-k
    pairs: about 20,000 a file); Python's cyclic collector walks them again each time more accumulate (a third of
    the read of 256 cells with probe files) and frees nothing. Reference counting still frees all of it; the
    collector runs again after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _map(function: Callable[[Any], Any], jobs: list[Any], workers: int | None) -> Iterator[Any]:
    """map(), over processes when it pays: forked workers, results in job order."""
    if workers is None:
        workers = min(os.cpu_count() or 1, 8) if len(jobs) >= PARALLEL_FROM_CELLS else 1
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield from map(function, jobs)
        return
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        yield from pool.map(function, jobs, chunksize=max(1, len(jobs) // (workers * 4)))


def _load_cell_collecting(job: tuple[Path, str, KnownNames, str]) -> CellResults | UnreadableCell:
    """_load_cell, or the cell's problems when its cell.json or status.json cannot be read (plain records: an
    InputError does not survive pickling between processes)."""
    folder, shown = job[0], job[1]
    try:
        return _load_cell(*job)
    except (InputError, InputErrors) as error:
        return _unreadable(folder.name, shown, problems_of(error))
    except OSError as error:
        return _unreadable(folder.name, shown, [_os_problem(error, shown)])


def _unreadable(name: str, shown: str, problems: list[InputError], identity: CellIdentity | None = None,
                side: str | None = None) -> UnreadableCell:
    """The record of a cell folder that could not be read: named by its cell.json where that was read, else by the
    folder (kvgate names a cell's folder `<cell id>`, its base side's `<cell id>--base`)."""
    folder_cell, _, folder_side = name.partition("--")
    return UnreadableCell(folder=shown, cell=identity.id if identity else folder_cell,
                          side=side or (folder_side if folder_side in SIDES else HEAD),
                          problems=tuple(str(problem) for problem in problems))


def _leads_nowhere(link: Path) -> str:
    """'a link that leads nowhere (No such file or directory)', or (Too many levels of symbolic links) for a loop."""
    try:
        os.stat(link)
        why = "it leads nowhere"
    except OSError as error:
        why = error.strerror or str(error)
    return f"a link that leads nowhere ({why})"


def _link_to_nothing(link: Path) -> InputError:
    return InputError(str(link), f"{_leads_nowhere(link)}, not a cell folder", hint="Put the cell's folder itself at this name")


def _not_a_stage_folder(path: Path, shown: str) -> InputError:
    """(1.18) What is at a stage folder's name when it is no folder: a file, or a link that leads nowhere."""
    what = _leads_nowhere(path) if path.is_symlink() and not path.exists() else "a file"
    return InputError(shown, f"{what}, not the {path.name} stage's folder",
                      hint="Put the stage's folder itself at this name, or remove it if the stage never ran")


def _os_problem(error: OSError, shown: str) -> InputError:
    return InputError(str(error.filename or shown), f"cannot read: {error.strerror or error}",
                      hint="Check the permissions of the run folder")


def _load_cell(folder: Path, shown: str, known: KnownNames, metric: str) -> CellResults | UnreadableCell:
    identity, extra = contract.parse_cell(
        read_text(folder / "cell.json", f"{shown}/cell.json"), f"{shown}/cell.json",
        backends=known.backends, kv_cache_dtypes=known.kv_cache_dtypes, archs=known.archs, features=known.features)
    side = extra.get("side", HEAD)
    statuses: dict[str, StageStatus] = {}
    if present(folder / "status.json"):  # a dangling link or a loop: the cell errors
        try:
            statuses = contract.parse_status(read_text(folder / "status.json", f"{shown}/status.json"),
                                             f"{shown}/status.json")
        except InputError as error:
            return _unreadable(folder.name, shown, [error], identity, side)
    stages: dict[str, StageResult] = {}
    logs: dict[str, tool_log.FirstError | None] = {}  # each log read once: three stages share the accuracy engine's
    for stage in STAGES:
        stage_dir = folder / stage
        status = statuses.get(stage)
        in_place = os.path.lexists(stage_dir)  # (1.18) a file or a link to nothing at its name counts too
        requested = in_place or status is not None
        if not requested:
            continue
        if status is not None and status.status != "ok":
            data = _tests_of_broken_kernels(stage_dir, shown) if stage == "kernels" else None
            stages[stage] = StageResult(stage=stage, requested=True, status=status, data=data,
                                        first_error=first_error(folder, stage, status, logs))
            continue
        if in_place and not stage_dir.is_dir():
            stages[stage] = StageResult(stage=stage, requested=True, status=status,
                                        unreadable=(str(_not_a_stage_folder(stage_dir, f"{shown}/{stage}")),))
            continue
        if not stage_dir.is_dir():
            stages[stage] = StageResult(stage=stage, requested=True, status=status,
                                        missing=f"status.json says {stage} ran, but there is no {stage}/ folder")
            continue
        try:
            data, missing = _READERS[stage](stage_dir, f"{shown}/{stage}", identity, metric)
        except (InputError, InputErrors, OSError) as error:
            problems = [_os_problem(error, f"{shown}/{stage}")] if isinstance(error, OSError) else problems_of(error)
            stages[stage] = StageResult(stage=stage, requested=True, status=status,
                                        unreadable=tuple(str(problem) for problem in problems))
            continue
        failing = stage == "kernels" and data is not None and bool(data.problems)
        stages[stage] = StageResult(stage=stage, requested=True, status=status, data=data, missing=missing,
                                    first_error=first_error(folder, stage, status, logs) if failing else None)
    return CellResults(identity=identity, folder=shown, stages=stages, extra=extra, side=side)


LOG_OF_STAGE = {"kernels": "kernels", "accuracy": "accuracy", "throughput": "throughput", "probe": "accuracy",
                "long_context": "accuracy"}


def first_error(folder: Path, stage: str, status: StageStatus | None,
                read: dict[str, tool_log.FirstError | None] | None = None) -> LogPointer | None:
    """The first real error of a broken or failed stage: from its log (logs/<stage>.log; the probe and the passkey
    task run in the accuracy stage's engine), else from status.json's log_tail; None when neither names one. `read`:
    the cell's logs read so far (a runaway log of 64 MiB takes seconds to scan: once a cell, not once a stage)."""
    name = f"logs/{LOG_OF_STAGE[stage]}.log"
    log = folder / name  # a regular file of the cell's own: never a link out of the folder (the report quotes it)
    found = None
    if log.is_file() and not log.is_symlink() and not (folder / "logs").is_symlink():
        found = read[name] if read is not None and name in read else tool_log.read_first_error(log)
        if read is not None:
            read[name] = found
    if found is not None:
        return LogPointer(path=f"{folder.name}/{name}", line=found.line, error=found.text, found_by=found.found_by,
                          frame=found.frame)
    tail = status.log_tail if status is not None else None
    found = tool_log.first_error(tail.splitlines()) if tail else None
    if found is None:
        return None
    return LogPointer(path=f"{folder.name}/status.json", line=None, error=found.text, found_by=found.found_by,
                      frame=found.frame)


def _tests_of_broken_kernels(stage_dir: Path, shown: str) -> Any:
    """A kernels stage a runner marked error may still hold pytest's junit.xml (kvgate's runners before contract 1.9
    marked failed tests so): its test outcomes, so the gate tells failed tests (FAIL) from a broken stage (ERROR).
    None when there is none or it cannot be read (the stage's error stands)."""
    path = stage_dir / "junit.xml"
    if not path.is_file():
        return None
    try:
        return junit.parse_junit(read_text(path, f"{shown}/kernels/junit.xml"), f"{shown}/kernels/junit.xml")
    except (InputError, InputErrors):
        return None


def _read_long_context(stage_dir: Path, shown: str, identity: CellIdentity, metric: str) -> tuple[Any, str | None]:
    """long_context/ (1.10): lm-eval's outputs of kvgate's passkey task, read as the accuracy stage's are."""
    from dataclasses import replace

    return _read_accuracy(stage_dir, shown, replace(identity, task=LONG_CONTEXT_TASK), metric)


def files_under(folder: Path, wanted: Callable[[str], bool]) -> list[Path]:
    """Everything under `folder`, at any depth, whose name is `wanted`, sorted: what Path.rglob finds (links to
    folders not followed), walked with a list instead of recursion, so a stage folder nested thousands of folders deep
    is read like any other, not a RecursionError. A folder that cannot be listed raises its OSError."""
    found, pending = [], [folder]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if wanted(entry.name):
                    found.append(Path(entry.path))
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
    return sorted(found)


def _read_accuracy(stage_dir: Path, shown: str, identity: CellIdentity, metric: str) -> tuple[Any, str | None]:
    results_files = files_under(stage_dir, lambda name: bool(lm_eval.RESULTS_NAME.match(name)))
    if not results_files:
        return None, f"no results_*.json under {shown}/"
    if len(results_files) > 1:
        listed = ", ".join(_rel(p, stage_dir) for p in results_files)
        raise InputError(shown, f"{len(results_files)} lm-eval results files ({listed})", "the folder",
                         "Keep the one of this cell's run; the stage folder should hold one lm-eval run")
    source = f"{shown}/{_rel(results_files[0], stage_dir)}"
    result = lm_eval.parse_results(read_text(results_files[0], source), source, task=identity.task, metric=metric)
    sample_files = files_under(stage_dir, lambda name: lm_eval.samples_task(name) == identity.task)
    if len(sample_files) > 1:
        listed = ", ".join(_rel(p, stage_dir) for p in sample_files)
        raise InputError(shown, f"{len(sample_files)} sample logs for task {identity.task!r} ({listed})", "the folder",
                         "Keep the one of this cell's run")
    if sample_files:
        samples_source = f"{shown}/{_rel(sample_files[0], stage_dir)}"
        samples = lm_eval.parse_samples(read_bytes(sample_files[0], samples_source), samples_source, metric=metric)
        result = lm_eval.with_samples(result, samples, samples_source)
    return result, None


def _read_throughput(stage_dir: Path, shown: str, identity: CellIdentity, metric: str) -> tuple[Any, str | None]:
    files = sorted(p for p in stage_dir.glob("*.json") if not vllm_bench.is_pytorch_format(p.name))
    if not files:
        return None, f"no `vllm bench throughput --output-json` file (*.json) in {shown}/"
    repeats, problems = [], []
    for path in files:
        source = f"{shown}/{path.name}"
        try:
            repeat = vllm_bench.parse_output_json(read_text(path, source), source)
            log = path.with_suffix(".log")
            if present(log):
                log_source = f"{shown}/{log.name}"
                repeat = vllm_bench.with_log(repeat, read_text(log, log_source), log_source)
            repeats.append(repeat)
        except InputError as error:
            problems.append(error)
    if problems:
        raise InputErrors(problems)
    return ThroughputResult(repeats=tuple(repeats)), None


def _read_kernels(stage_dir: Path, shown: str, identity: CellIdentity, metric: str) -> tuple[Any, str | None]:
    path = stage_dir / "junit.xml"
    if not present(path):
        return None, f"no junit.xml in {shown}/"
    timings = stage_dir / "timings.json"
    if present(timings):  # not judged, but a contract file: a corrupt one is the stage's error
        schema.read_file(timings, "timings", f"{shown}/timings.json")
    source = f"{shown}/junit.xml"
    return junit.parse_junit(read_text(path, source), source), None


def _read_probe(stage_dir: Path, shown: str, identity: CellIdentity, metric: str) -> tuple[Any, str | None]:
    path = stage_dir / probe_file.FILE_NAME
    if not present(path):
        return None, f"no {probe_file.FILE_NAME} in {shown}/"
    return probe_file.read(path), None


def _rel(path: Path, base: Path) -> str:
    return path.relative_to(base).as_posix()


_READERS = {"accuracy": _read_accuracy, "throughput": _read_throughput, "kernels": _read_kernels,
            "probe": _read_probe, "long_context": _read_long_context}
