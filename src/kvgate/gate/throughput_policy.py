"""The throughput part of policy.toml: the ratio rule's tolerance and alphas, the run-to-run SD it adds for runs not
interleaved, declared FP8/auto expectations, and the throughput noise measured per arch that its stated power
rests on (`[[throughput.measured_noise]]`). Pure; read by kvgate.gate.policy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvgate import unknown_name_hint
from kvgate.gate.value_readers import CellLike
from kvgate.gate.value_readers import read_choice as _choice
from kvgate.gate.value_readers import read_count as _count
from kvgate.gate.value_readers import read_number as _number
from kvgate.matrix.cells import Match, Matrix, parse_match
from kvgate.matrix.declarations import PLAIN, split_cell_id
from kvgate.matrix.toml_reading import TomlReader
from kvgate.statistics.margins import MULTIPLICITY_METHODS

NO_MODEL = "\0no workload of this matrix"  # an expectation for another matrix's workload matches no cell
THROUGHPUT_METRICS = ("requests_per_second", "tokens_per_second", "output_tokens_per_second")


@dataclass(frozen=True, kw_only=True, slots=True)
class Fp8OverAutoExpectation:
    """A declared expectation on throughput(fp8 cell) / throughput(auto cell) of the same run."""

    min_ratio: float
    reason: str
    where: str  # e.g. "throughput.fp8_over_auto[0]"
    cell: str | None = None  # an FP8 cell id, or
    match: Match | None = None  # a selector over FP8 cells
    model: str | None = None  # only for cells running this model (the expectation's `workload`'s); None: any

    def covers(self, cell: CellLike) -> bool:
        if self.model is not None and getattr(cell, "model", None) != self.model:
            return False
        if self.cell is not None:
            return cell.id == self.cell
        return self.match is not None and self.match.matches(cell)


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredNoise:
    """Throughput noise measured for one cell running one workload: the SD of log throughput between the repeats of
    one engine (repeat_sd) and between engine starts beyond that (engine_sd), with where it comes from."""

    workload: str  # a workload of matrix/workloads.toml (or of a benchmark's matrix folder)
    cell: str
    repeat_sd: float  # within one engine; with engine_sd absent: each repeat was its own engine (the total)
    engine_sd: float | None  # between engine starts, beyond the repeats' spread; None: not separable
    engines: int  # the engine starts it rests on
    repeats: int  # the measured repeats it rests on
    date: str
    source: str
    model: str | None = None  # the workload's model in this matrix; None: the matrix has no such workload
    shape: str = ""  # the workload it was measured at, for people

    @property
    def arch(self) -> str:
        parts = split_cell_id(self.cell)
        return parts[2] if parts else self.cell.rsplit("-", 1)[-1]

    @property
    def per_engine_sd(self) -> float:
        """The SD of one engine's level (its engine part and one repeat's), what a design of one repeat an engine sees."""
        return math.hypot(self.engine_sd or 0.0, self.repeat_sd) if self.engine_sd is not None else self.repeat_sd


@dataclass(frozen=True, kw_only=True, slots=True)
class ThroughputPolicy:
    tolerance: float  # the margin: H0 "current / baseline >= 1 - tolerance"
    alpha: float  # per check, at a slowdown equal to the tolerance, for interleaved A/B repeats (paired by round)
    alpha_unpaired: float  # the same for runs not interleaved (a stored baseline, FP8 vs auto of one run)
    multiplicity: str
    metric: str
    run_to_run_sd: float  # SD of a run's mean log throughput between runs (unpaired comparisons add it)
    run_to_run_sd_source: str  # where that figure comes from
    rounds: int  # interleaved A/B rounds the policy's power needs
    fp8_over_auto: tuple[Fp8OverAutoExpectation, ...] = ()
    measured_noise: tuple[MeasuredNoise, ...] = ()  # what the tests and their stated power rest on, per cell

    def noise_for(self, cell_id: str, model: str) -> MeasuredNoise | None:
        """The measured noise of this cell running this model (its workload's), or None."""
        return next((n for n in self.measured_noise if n.cell == cell_id and n.model == model), None)

    def engine_sd_for(self, cell_id: str, model: str) -> tuple[float, str]:
        """The engine-to-engine SD a test of this cell uses, and where it comes from: its measurement, else the
        policy's run_to_run_sd standing in for it."""
        noise = self.noise_for(cell_id, model)
        if noise is not None and noise.engine_sd is not None:
            return noise.engine_sd, (f"{100 * noise.engine_sd:.3g} % between engines, measured for {noise.workload} "
                                     f"({noise.date}, {noise.engines} engines)")
        return self.run_to_run_sd, (f"no engine-to-engine SD measured for this cell and model: the policy's "
                                    f"run-to-run {100 * self.run_to_run_sd:g} % stands in")

    def fp8_over_auto_expectation(self, cell: CellLike) -> Fp8OverAutoExpectation | None:
        """The first expectation declared for this FP8 cell, or None (then the ratio is only reported)."""
        if cell.kv_cache_dtype == "auto":
            return None
        return next((e for e in self.fp8_over_auto if e.covers(cell)), None)


THROUGHPUT_KEYS = ("tolerance", "alpha", "alpha_unpaired", "multiplicity", "metric", "run_to_run_sd",
                   "run_to_run_sd_source", "rounds")


def parse_throughput(reader: TomlReader, table: Any, matrix: Matrix | None) -> ThroughputPolicy | None:
    where = "throughput"
    if not reader.keys(table, where, THROUGHPUT_KEYS, ["fp8_over_auto", "measured_noise"]):
        return None
    expectations = []
    entries = table.get("fp8_over_auto", [])
    if not isinstance(entries, list):
        reader.error("expected [[throughput.fp8_over_auto]] tables", f"{where}.fp8_over_auto")
        entries = []
    for index, entry in enumerate(entries):
        sub = f"{where}.fp8_over_auto[{index}]"
        if not reader.keys(entry, sub, ["min_ratio", "reason"], ["cell", "match", "workload"]):
            continue
        if ("cell" in entry) == ("match" in entry):
            reader.error("give exactly one of 'cell' or 'match'", sub)
            continue
        cell_id = match = None
        if "cell" in entry:
            cell_id = reader.string(entry, "cell", sub)
            if matrix is not None and cell_id:
                fp8_cells = [c.id for c in matrix.cells if c.is_fp8]
                if cell_id not in fp8_cells:
                    reader.error(f"unknown FP8 cell '{cell_id}'", f"{sub}.cell", unknown_name_hint(cell_id, fp8_cells))
        elif matrix is not None:
            match = parse_match(reader, entry["match"], f"{sub}.match", matrix.kv_cache_dtypes, matrix.archs,
                                 matrix.backends, [*matrix.features, PLAIN])
            if match is not None and not any(match.matches(c) for c in matrix.cells if c.is_fp8):
                reader.error("matches no FP8 cell", f"{sub}.match", "Fix its names or delete it")
        model = None
        if "workload" in entry:
            name = reader.string(entry, "workload", sub)
            # another matrix folder's workload (a benchmark's): the expectation applies to no cell of this matrix
            model = matrix.workloads[name].model if matrix is not None and name in matrix.workloads else NO_MODEL
        expectations.append(Fp8OverAutoExpectation(
            min_ratio=_number(reader, entry, "min_ratio", sub, low=0, high=100, low_open=True),
            reason=reader.string(entry, "reason", sub), where=sub, cell=cell_id, match=match, model=model))
    return ThroughputPolicy(
        tolerance=_number(reader, table, "tolerance", where, low=0, high=1, high_open=True),
        alpha=_number(reader, table, "alpha", where, low=0, high=0.5, low_open=True),
        alpha_unpaired=_number(reader, table, "alpha_unpaired", where, low=0, high=0.5, low_open=True),
        multiplicity=_choice(reader, table, "multiplicity", where, MULTIPLICITY_METHODS, "multiplicity method"),
        metric=_choice(reader, table, "metric", where, THROUGHPUT_METRICS, "throughput metric"),
        run_to_run_sd=_number(reader, table, "run_to_run_sd", where, low=0, high=1),
        run_to_run_sd_source=reader.string(table, "run_to_run_sd_source", where),
        rounds=_count(reader, table, "rounds", where, low=2, high=math.inf),
        fp8_over_auto=tuple(expectations),
        measured_noise=_parse_measured_noise(reader, table.get("measured_noise", []), f"{where}.measured_noise", matrix),
    )


NOISE_KEYS = ("workload", "cell", "repeat_sd", "repeats", "engines", "date", "source")


def _parse_measured_noise(reader: TomlReader, entries: Any, where: str, matrix: Matrix | None) -> tuple[MeasuredNoise, ...]:
    if not isinstance(entries, list):
        reader.error("expected [[throughput.measured_noise]] tables", where)
        return ()
    found = []
    for index, entry in enumerate(entries):
        sub = f"{where}[{index}]"
        if not reader.keys(entry, sub, NOISE_KEYS, ["engine_sd", "shape"]):
            continue
        cell_id = reader.string(entry, "cell", sub)
        workload = reader.string(entry, "workload", sub)
        model = None
        if matrix is not None:
            ids = [c.id for c in matrix.cells]
            if cell_id and cell_id not in ids:
                reader.error(f"unknown cell '{cell_id}'", f"{sub}.cell", unknown_name_hint(cell_id, ids))
            if workload in matrix.workloads:  # another matrix folder's workload (a benchmark's): listed, not used
                model = matrix.workloads[workload].model
        engines = _count(reader, entry, "engines", sub, low=1, high=math.inf)
        engine_sd = None
        if "engine_sd" in entry:
            engine_sd = _number(reader, entry, "engine_sd", sub, low=0, high=1)
            if engines < 2:
                reader.error("an engine-to-engine SD needs at least 2 engines", f"{sub}.engines",
                             "Measure in several engine starts, or leave engine_sd out")
        found.append(MeasuredNoise(
            workload=workload, cell=cell_id, model=model, engine_sd=engine_sd, engines=engines,
            repeat_sd=_number(reader, entry, "repeat_sd", sub, low=0, high=1, low_open=True),
            repeats=_count(reader, entry, "repeats", sub, low=2, high=math.inf), date=reader.string(entry, "date", sub),
            source=reader.string(entry, "source", sub),
            shape=reader.string(entry, "shape", sub) if "shape" in entry else ""))
    return tuple(found)
