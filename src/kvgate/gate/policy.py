"""The gate's thresholds, read from matrix/policy.toml: what fails a check, and how sure the gate must be.

`load()` is the only function that touches the disk; `parse()` turns an already-read TOML document into a
frozen `Policy` and reports every problem it finds (file, key path, and a did-you-mean where one fits),
the same way kvgate.matrix.cells does (it reuses that module's reader). Names of backends, archs, kv dtypes,
models and cells are checked against the matrix, so a typo cannot silently switch a threshold off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgate import InputError, InputErrors, unknown_name_hint
from kvgate.gate.throughput_policy import ThroughputPolicy
from kvgate.gate.throughput_policy import parse_throughput as _parse_throughput
from kvgate.gate.value_readers import read_choice as _choice
from kvgate.gate.value_readers import read_count as _count
from kvgate.gate.value_readers import read_number as _number
from kvgate.matrix import cells as matrix_module
from kvgate.matrix.cells import GSM8K_FILTERS, Matrix
from kvgate.matrix.toml_reading import TomlReader, describe_value, read_toml, shown_path
from kvgate.statistics.margins import MULTIPLICITY_METHODS

POLICY_FILE = "policy.toml"


@dataclass(frozen=True, kw_only=True, slots=True)
class SequentialPolicy:
    """Group-sequential comparisons (kvgate.statistics.sequential): where the looks are and how beta is spent."""

    looks: tuple[float, ...]  # information fractions of the looks, the last 1.0
    beta_spending_rho: float  # beta(t) = beta t^rho (futility, non-binding); alpha spending is O'Brien-Fleming
    max_questions: int  # the questions at the last look (inflation x accuracy.questions)


@dataclass(frozen=True, kw_only=True, slots=True)
class AccuracyPolicy:
    fp8_tax_points: float  # allowed drop of an FP8 cell against auto in the same run (the margin)
    fp8_tax_points_by_model: Mapping[str, float] = field(default_factory=dict)
    baseline_margin_points: float  # allowed drop of a cell against the same cell in the baseline (the margin)
    alpha: float  # per check, at drop = margin (after `multiplicity`, which is none for margin tests)
    multiplicity: str  # holm | bh | none
    primary_filter: str  # the one gsm8k filter a comparison is decided on
    filters: tuple[str, ...]  # gsm8k filters reported (the primary one judged, the others status info)
    min_n: int  # fewer paired questions than this: the check errors (fail closed)
    power: float  # wanted at a drop of margin + gap_points
    gap_points: float
    design_flips: float  # the noise flips `questions` is sized for
    questions: int  # questions a comparison needs for `power` at design_flips (fixed design)
    sequential: SequentialPolicy
    # model -> {comparison kind -> the noise flips measured for it}: what the questions of its cells are sized for
    design_flips_by_model: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # arch -> questions of a run with no base side (the README's main job keeps its time budget; power stated)
    single_side_questions: Mapping[str, int] = field(default_factory=dict)
    # lm-eval task -> questions it holds in one fixed order (kvgate's held-out pool; gsm8k's test and train splits)
    pool_questions: Mapping[str, int] = field(default_factory=dict)
    # lm-eval task -> what its questions are, said with every plan that draws from it (the run's first lines, the report)
    pool_notes: Mapping[str, str] = field(default_factory=dict)

    def fp8_tax_for(self, model: str) -> float:
        return self.fp8_tax_points_by_model.get(model, self.fp8_tax_points)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeThresholds:
    """Limits for the logprob-agreement probe of a kv dtype against auto on fixed prompts."""

    mean_abs_logprob_diff_max: float
    max_abs_logprob_diff_max: float
    top1_agreement_min: float  # a fraction, 0..1
    decode_mean_abs_logprob_diff_max: float = math.nan  # NaN: not judged
    greedy_prefix_match_min: float = math.nan
    require_effect: bool = False  # the cell must differ measurably from auto (an FP8 cache that changes nothing
    #                               was most likely never used)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbePolicy:
    by_kv_cache_dtype: Mapping[str, ProbeThresholds]
    by_kv_cache_dtype_and_arch: Mapping[tuple[str, str], ProbeThresholds] = field(default_factory=dict)
    source: str = "matrix/policy.toml"

    def thresholds(self, kv_cache_dtype: str, arch: str) -> ProbeThresholds:
        found = self.by_kv_cache_dtype_and_arch.get((kv_cache_dtype, arch)) or self.by_kv_cache_dtype.get(kv_cache_dtype)
        if found is None:
            raise InputError(self.source, f"no probe thresholds for kv_cache_dtype '{kv_cache_dtype}'",
                             "probe", f"Add a [probe.{kv_cache_dtype}] table")
        return found


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeAbLimits:
    """How far an A/B run's head may move an FP8 cell away from its auto cell, relative to the base side doing the
    same on the same prompts ([probe_ab] of policy.toml): the change moved FP8 away from auto."""

    growth_max: float  # head's divergence from auto over base's (decode mean |delta logprob|; prompt mean)
    greedy_prefix_drop_max: float  # base's greedy prefix agreement minus head's, a share 0..1
    source: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeAbPolicy:
    default: ProbeAbLimits | None = None  # None: no [probe_ab] table, the check is not run
    by_arch: Mapping[str, ProbeAbLimits] = field(default_factory=dict)

    def limits(self, arch: str) -> ProbeAbLimits | None:
        return self.by_arch.get(arch, self.default)


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelsPolicy:
    min_executed_tests: int  # a junit.xml with fewer executed (not skipped) tests fails; any failure fails


@dataclass(frozen=True, kw_only=True, slots=True)
class KvCachePolicy:
    """The fp8_kv_cache check (optional table [kv_cache] of policy.toml; the defaults apply without it)."""

    # The tokens a byte of an FP8 cell's KV cache holds over its auto cell's, from each engine's KV cache spec (the
    # bytes a token takes over all attention layers): an FP8 cache holds 1-byte elements where auto holds 2, so a
    # byte holds about twice the tokens (2.0x; vLLM's fp8_ds_mla 1.76x, its per-token scales included). Below this
    # the FP8 setting most likely did not apply. (The cache's size in tokens is not judged: it is what the free
    # memory at engine start allowed, a fraction of it on a GPU other engines share.)
    fp8_min_token_ratio: float = 1.5


@dataclass(frozen=True, kw_only=True, slots=True)
class AccuracyFloor:
    """A workload's expected auto accuracy (matrix/workloads.toml expected_accuracy), as the gate uses it."""

    workload: str
    model: str
    archs: tuple[str, ...]
    task: str
    expected: Mapping[str, float]  # by gsm8k filter
    rtol: float
    source: str

    def floor(self, filter_name: str) -> float | None:
        value = self.expected.get(filter_name)
        return None if value is None else value * (1 - self.rtol)

    def covers(self, model: str, arch: str, task: str) -> bool:
        # results filed under lm-eval's own gsm8k (earlier runs; the hub models' pool now, which begins with it) too
        return model == self.model and arch in self.archs and task in (self.task, "gsm8k")


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    accuracy: AccuracyPolicy
    throughput: ThroughputPolicy
    probe: ProbePolicy
    kernels: KernelsPolicy
    source: str
    floors: tuple[AccuracyFloor, ...] = ()  # from the matrix's workloads
    kv_cache: KvCachePolicy = field(default_factory=KvCachePolicy)
    probe_ab: ProbeAbPolicy = field(default_factory=ProbeAbPolicy)
    # the oldest results contract judged under --require-baseline ([results] oldest_contract)
    oldest_contract: tuple[int, int] = (1, 6)

    def fp8_tax_points(self, model: str) -> float:
        """The allowed FP8-vs-auto accuracy drop (points) for this model."""
        return self.accuracy.fp8_tax_for(model)

    def floor_for(self, model: str, arch: str, task: str) -> AccuracyFloor | None:
        return next((f for f in self.floors if f.covers(model, arch, task)), None)


# ---------------------------------------------------------------------------------------------- loading

def default_policy_path() -> Path:
    return matrix_module.default_matrix_dir() / POLICY_FILE


def load(path: Path | None = None, *, matrix: Matrix | None = None) -> Policy:
    """Read and parse the policy; names are checked against `matrix` (default: the repository's)."""
    path = path or default_policy_path()
    doc = read_toml(path, missing_hint="Pass --policy or restore matrix/policy.toml")
    shown = shown_path(path)
    return parse(doc, shown, matrix=matrix if matrix is not None else matrix_module.load())


TOP_KEYS = ("accuracy", "throughput", "probe", "kernels")
TOP_OPTIONAL = ("kv_cache", "probe_ab", "results")
PROBE_AB_KEYS = ("growth_max", "greedy_prefix_drop_max", "source")
KV_CACHE_OPTIONAL = ("fp8_min_token_ratio",)
ACCURACY_KEYS = ("fp8_tax_points", "baseline_margin_points", "alpha", "multiplicity", "primary_filter", "filters",
                 "min_n", "power", "gap_points", "design_flips", "questions", "sequential")
ACCURACY_OPTIONAL = ("fp8_tax_points_by_model", "design_flips_by_model", "single_side_questions", "pool_questions",
                     "pool_notes")
COMPARISON_KINDS = ("fp8_accuracy", "baseline_accuracy")
SEQUENTIAL_KEYS = ("looks", "beta_spending_rho", "max_questions")
PROBE_KEYS = ("mean_abs_logprob_diff_max", "max_abs_logprob_diff_max", "top1_agreement_min")
PROBE_OPTIONAL_KEYS = ("decode_mean_abs_logprob_diff_max", "greedy_prefix_match_min", "require_effect")


def parse(doc: Mapping[str, Any], source: str = "matrix/policy.toml", *, matrix: Matrix | None = None) -> Policy:
    """Build the Policy from a parsed TOML document; raises InputErrors naming every problem."""
    reader = TomlReader(source)
    if not reader.keys(doc, Path(source).name, TOP_KEYS, TOP_OPTIONAL):
        raise InputErrors(reader.problems)
    accuracy = _parse_accuracy(reader, doc["accuracy"], matrix)
    throughput = _parse_throughput(reader, doc["throughput"], matrix)
    probe = _parse_probe(reader, doc["probe"], matrix, source)
    kernels = _parse_kernels(reader, doc["kernels"])
    kv_cache = _parse_kv_cache(reader, doc.get("kv_cache", {}))
    probe_ab = _parse_probe_ab(reader, doc["probe_ab"], matrix) if "probe_ab" in doc else ProbeAbPolicy()
    oldest = _parse_results(reader, doc["results"]) if "results" in doc else (1, 6)
    floors = _floors(reader, matrix, accuracy)
    if not reader.problems and accuracy is not None:
        _check_design(reader, accuracy)
    if reader.problems:
        raise InputErrors(reader.problems)
    assert accuracy and throughput and probe and kernels
    return Policy(accuracy=accuracy, throughput=throughput, probe=probe, kernels=kernels, source=source,
                  floors=floors, kv_cache=kv_cache, probe_ab=probe_ab, oldest_contract=oldest)


MAX_DESIGN_QUESTIONS = 1_000_000  # the most questions a comparison may need (gsm8k's test split has 1319)


def _check_design(reader: TomlReader, accuracy: AccuracyPolicy) -> None:
    """Every comparison the question plan sizes must be one: each margin (fp8_tax_points, by model, and
    baseline_margin_points) plus gap_points at each noise of design_flips (and by model) fits in the questions and
    needs at most MAX_DESIGN_QUESTIONS, and the sequential design has boundaries. Values each in range can still make
    none (a gap of 1e-9 points needs 10^12 questions: the plan ran out of memory), which the gate met as a traceback."""
    from kvgate.statistics import power, sequential

    margins = {"accuracy.fp8_tax_points": accuracy.fp8_tax_points,
               **{f"accuracy.fp8_tax_points_by_model.{m}": v for m, v in accuracy.fp8_tax_points_by_model.items()},
               "accuracy.baseline_margin_points": accuracy.baseline_margin_points}
    noises = {"accuracy.design_flips": accuracy.design_flips,
              **{f"accuracy.design_flips_by_model.{m}.{kind}": v
                 for m, kinds in accuracy.design_flips_by_model.items() for kind, v in kinds.items()}}
    for margin_key, margin in margins.items():
        target = margin + accuracy.gap_points
        for flips_key, flips in noises.items():
            if flips + target / 100 > 1:
                reader.error(f"a drop of {target:g} points ({margin_key} + gap_points) on top of {100 * flips:g} % "
                             "noise flips breaks more answers than there are questions", flips_key,
                             "Lower the margin, gap_points or the noise")
                return
            try:
                needed: float = power.normal_questions(margin_points=margin, target_points=target, flips=flips,
                                                       alpha=accuracy.alpha, power=accuracy.power)
            except ValueError:  # 1 - alpha rounded to 1: no normal quantile
                reader.error(f"alpha {accuracy.alpha:g} is too near 0 to compute a design with", "accuracy.alpha",
                             "Write e.g. alpha = 0.01")
                return
            except ArithmeticError:  # a gap of 1e-300 points: a division by zero or an overflow
                needed = math.inf
            if needed > MAX_DESIGN_QUESTIONS:
                shown = f"about {needed:.3g}" if math.isfinite(needed) else "unboundedly many"
                reader.error(f"catching a drop of {target:g} points over a margin of {margin:g} ({margin_key}) at "
                             f"{100 * flips:g} % noise flips with alpha {accuracy.alpha:g} and power {accuracy.power:g} "
                             f"needs {shown} questions, more than {MAX_DESIGN_QUESTIONS}", "accuracy.gap_points",
                             "Widen gap_points, or ask less (alpha, power)")
                return
    looks = accuracy.sequential.looks
    if len(looks) > 1:
        try:
            sequential.boundaries(looks, alpha=accuracy.alpha, beta=1 - accuracy.power,
                                  rho=accuracy.sequential.beta_spending_rho)
        except (ValueError, OverflowError, ArithmeticError) as error:
            reader.error(f"the sequential design has no boundaries at alpha {accuracy.alpha:g}, power "
                         f"{accuracy.power:g} and beta_spending_rho {accuracy.sequential.beta_spending_rho:g} ({error})",
                         "accuracy.sequential", "kvgate's design uses beta_spending_rho = 2.0")


def _floors(reader: TomlReader, matrix: Matrix | None, accuracy: AccuracyPolicy | None) -> tuple[AccuracyFloor, ...]:
    """The workloads' expected accuracies; each must name the primary filter the gate judges."""
    if matrix is None:
        return ()
    floors = []
    for workload in matrix.workloads.values():
        expected = workload.expected_accuracy
        if expected is None:
            continue
        if accuracy is not None and accuracy.primary_filter and accuracy.primary_filter not in expected.values:
            reader.error(f"workload '{workload.name}' declares no expected accuracy for the primary filter "
                         f"'{accuracy.primary_filter}'", "accuracy.primary_filter",
                         f"Add {accuracy.primary_filter} to workloads.{workload.name}.expected_accuracy")
        floors.append(AccuracyFloor(workload=workload.name, model=workload.model, archs=workload.archs,
                                    task=str(workload.gsm8k.get("task", "gsm8k")), expected=dict(expected.values),
                                    rtol=expected.rtol, source=expected.source))
    return tuple(floors)


def _parse_accuracy(reader: TomlReader, table: Any, matrix: Matrix | None) -> AccuracyPolicy | None:
    where = "accuracy"
    if not reader.keys(table, where, ACCURACY_KEYS, ACCURACY_OPTIONAL):
        return None
    by_model: dict[str, float] = {}
    overrides = table.get("fp8_tax_points_by_model", {})
    if not isinstance(overrides, dict):
        reader.error(f"expected a table of \"model\" = points, got {describe_value(overrides)}",
                     f"{where}.fp8_tax_points_by_model")
        overrides = {}
    models = sorted({w.model for w in matrix.workloads.values()}) if matrix is not None else None
    for model in overrides:
        sub = f"{where}.fp8_tax_points_by_model"
        if models is not None and model not in models:
            reader.error(f"unknown model '{model}'", sub, unknown_name_hint(model, models))
            continue
        by_model[model] = _number(reader, overrides, model, sub, low=0, high=100, low_open=True)
    filters = table["filters"]
    if not isinstance(filters, list) or not filters:
        reader.error(f"expected a list of gsm8k filter names, got {describe_value(filters)}", f"{where}.filters")
        filters = []
    for index, name in enumerate(filters):
        if name not in GSM8K_FILTERS:
            shown = f"'{name}'" if isinstance(name, str) else describe_value(name)
            reader.error(f"unknown gsm8k filter {shown}", f"{where}.filters[{index}]",
                         unknown_name_hint(name, GSM8K_FILTERS))
        elif name in filters[:index]:
            reader.error(f"duplicate gsm8k filter '{name}'", f"{where}.filters[{index}]")
    primary = _choice(reader, table, "primary_filter", where, GSM8K_FILTERS, "gsm8k filter")
    if primary and filters and all(f in GSM8K_FILTERS for f in filters) and primary not in filters:
        reader.error(f"the primary filter '{primary}' is not among the reported filters", f"{where}.filters",
                     f"Add '{primary}'")
    return AccuracyPolicy(
        fp8_tax_points=_number(reader, table, "fp8_tax_points", where, low=0, high=100, low_open=True),
        fp8_tax_points_by_model=by_model,
        baseline_margin_points=_number(reader, table, "baseline_margin_points", where, low=0, high=100,
                                       low_open=True),
        alpha=_number(reader, table, "alpha", where, low=0, high=0.5, low_open=True, high_open=True),
        multiplicity=_choice(reader, table, "multiplicity", where, MULTIPLICITY_METHODS, "multiplicity method"),
        primary_filter=primary,
        filters=tuple(filters),
        min_n=_count(reader, table, "min_n", where, low=1, high=math.inf),
        power=_number(reader, table, "power", where, low=0.5, high=1, low_open=True, high_open=True),
        gap_points=_number(reader, table, "gap_points", where, low=0, high=100, low_open=True),
        design_flips=_number(reader, table, "design_flips", where, low=0, high=1, low_open=True, high_open=True),
        questions=_count(reader, table, "questions", where, low=1, high=math.inf),
        sequential=_parse_sequential(reader, table["sequential"], f"{where}.sequential"),
        design_flips_by_model=_flips_by_model(reader, table.get("design_flips_by_model", {}),
                                              f"{where}.design_flips_by_model"),
        single_side_questions=_counts_by_name(reader, table.get("single_side_questions", {}),
                                              f"{where}.single_side_questions",
                                              list(matrix.archs) if matrix is not None else None, "arch"),
        pool_questions=_counts_by_name(reader, table.get("pool_questions", {}), f"{where}.pool_questions", None,
                                       "task"),
        pool_notes=_notes_by_task(reader, table.get("pool_notes", {}), f"{where}.pool_notes"),
    )


def _notes_by_task(reader: TomlReader, table: Any, where: str) -> dict[str, str]:
    if not isinstance(table, dict):
        reader.error(f"expected a table of task = \"note\", got {describe_value(table)}", where)
        return {}
    return {name: reader.string(table, name, where) for name in table}


def _flips_by_model(reader: TomlReader, table: Any, where: str) -> dict[str, dict[str, float]]:
    """{"model" = { fp8_accuracy = flips, baseline_accuracy = flips, source = "..." }}."""
    if not isinstance(table, dict):
        reader.error(f"expected a table of models, got {describe_value(table)}", where)
        return {}
    out: dict[str, dict[str, float]] = {}  # models the matrix lacks are allowed: one policy serves several matrices
    for name, spec in table.items():
        at = f"{where}.{name}"
        if not reader.keys(spec, at, ["source"], COMPARISON_KINDS):
            continue
        reader.string(spec, "source", at)
        out[name] = {kind: _number(reader, spec, kind, at, low=0, high=1, low_open=True, high_open=True)
                     for kind in COMPARISON_KINDS if kind in spec}
    return out


def _counts_by_name(reader: TomlReader, table: Any, where: str, known: Sequence[str] | None,
                    what: str) -> dict[str, int]:
    if not isinstance(table, dict):
        reader.error(f"expected a table of {what} = questions, got {describe_value(table)}", where)
        return {}
    out = {}
    for name in table:
        if known is not None and name not in known:
            reader.error(f"unknown {what} '{name}'", f"{where}.{name}", unknown_name_hint(name, known))
            continue
        out[name] = _count(reader, table, name, where, low=1, high=math.inf)
    return out


def _parse_sequential(reader: TomlReader, table: Any, where: str) -> SequentialPolicy:
    if not reader.keys(table, where, SEQUENTIAL_KEYS):
        return SequentialPolicy(looks=(1.0,), beta_spending_rho=math.nan, max_questions=0)
    looks = table["looks"]
    numbers = isinstance(looks, list) and looks and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in looks)
    if not numbers or any(not 0 < v <= 1 for v in looks) or looks != sorted(set(looks)) or looks[-1] != 1:
        reader.error(f"expected increasing fractions in (0, 1] ending at 1, got {describe_value(looks)}",
                     f"{where}.looks")
        looks = [1.0]
    return SequentialPolicy(
        looks=tuple(float(v) for v in looks),
        beta_spending_rho=_number(reader, table, "beta_spending_rho", where, low=0, high=20, low_open=True),
        max_questions=_count(reader, table, "max_questions", where, low=1, high=math.inf))


def _parse_probe(reader: TomlReader, table: Any, matrix: Matrix | None, source: str) -> ProbePolicy | None:
    where = "probe"
    if not isinstance(table, dict):
        reader.error(f"expected a table, got {describe_value(table)}", where)
        return None
    dtypes = list(matrix.kv_cache_dtypes) if matrix is not None else list(table)
    archs = list(matrix.archs) if matrix is not None else None
    by_dtype: dict[str, ProbeThresholds] = {}
    by_arch: dict[tuple[str, str], ProbeThresholds] = {}
    for dtype, spec in table.items():
        sub = f"{where}.{dtype}"
        if dtype not in dtypes:
            reader.error(f"unknown kv_cache_dtype '{dtype}'", sub, unknown_name_hint(dtype, dtypes))
            continue
        if not reader.keys(spec, sub, PROBE_KEYS, [*PROBE_OPTIONAL_KEYS, "by_arch"]):
            continue
        base = _probe_thresholds(reader, spec, sub, required=True)
        by_dtype[dtype] = base
        overrides = spec.get("by_arch", {})
        if not isinstance(overrides, dict):
            reader.error(f"expected a table of arch tables, got {describe_value(overrides)}", f"{sub}.by_arch")
            continue
        for arch, override in overrides.items():
            arch_where = f"{sub}.by_arch.{arch}"
            if archs is not None and arch not in archs:
                reader.error(f"unknown arch '{arch}'", arch_where, unknown_name_hint(arch, archs))
                continue
            if not reader.keys(override, arch_where, [], [*PROBE_KEYS, *PROBE_OPTIONAL_KEYS]):
                continue
            values = {k: getattr(base, k) for k in (*PROBE_KEYS, *PROBE_OPTIONAL_KEYS)}
            values.update({k: getattr(_probe_thresholds(reader, override, arch_where, required=False), k)
                           for k in override})
            by_arch[(dtype, arch)] = ProbeThresholds(**values)
    if matrix is not None:
        missing = [d for d in matrix.kv_cache_dtypes if d not in table]
        if missing:
            reader.error(f"no thresholds for kv_cache_dtype {', '.join(repr(d) for d in missing)}", where,
                         f"Add [probe.{missing[0]}] with {', '.join(PROBE_KEYS)}")
    return ProbePolicy(by_kv_cache_dtype=by_dtype, by_kv_cache_dtype_and_arch=by_arch, source=source)


def _probe_thresholds(reader: TomlReader, spec: Mapping[str, Any], where: str, *, required: bool) -> ProbeThresholds:
    def get(key: str, **bounds: Any) -> float:
        if not required and key not in spec:
            return math.nan
        return _number(reader, spec, key, where, **bounds)

    def optional(key: str, **bounds: Any) -> float:
        return _number(reader, spec, key, where, **bounds) if key in spec else math.nan

    require_effect = spec.get("require_effect", False)
    if not isinstance(require_effect, bool):
        reader.error(f"expected true or false, got {describe_value(require_effect)}", f"{where}.require_effect")
        require_effect = False
    return ProbeThresholds(
        mean_abs_logprob_diff_max=get("mean_abs_logprob_diff_max", low=0, high=math.inf),
        max_abs_logprob_diff_max=get("max_abs_logprob_diff_max", low=0, high=math.inf),
        top1_agreement_min=get("top1_agreement_min", low=0, high=1),
        decode_mean_abs_logprob_diff_max=optional("decode_mean_abs_logprob_diff_max", low=0, high=math.inf),
        greedy_prefix_match_min=optional("greedy_prefix_match_min", low=0, high=1),
        require_effect=require_effect,
    )


def _parse_kernels(reader: TomlReader, table: Any) -> KernelsPolicy | None:
    if not reader.keys(table, "kernels", ["min_executed_tests"]):
        return None
    return KernelsPolicy(min_executed_tests=_count(reader, table, "min_executed_tests", "kernels", low=1,
                                                   high=math.inf))


def _parse_results(reader: TomlReader, table: Any) -> tuple[int, int]:
    """[results] oldest_contract = "MAJOR.MINOR": results of an older contract fail under --require-baseline."""
    from kvgate.results.records import CONTRACT_VERSION, contract_version_tuple

    if not reader.keys(table, "results", ["oldest_contract"]):
        return (1, 6)
    value = table["oldest_contract"]
    parsed = contract_version_tuple(value) if isinstance(value, str) else None
    newest = contract_version_tuple(CONTRACT_VERSION)
    if parsed is None or newest is None or parsed > newest or parsed < (1, 0):
        reader.error(f"expected a contract version from \"1.0\" to \"{CONTRACT_VERSION}\" (a string), got "
                     f"{describe_value(value)}", "results.oldest_contract")
        return (1, 6)
    return parsed


def _parse_probe_ab(reader: TomlReader, table: Any, matrix: Matrix | None) -> ProbeAbPolicy:
    """[probe_ab] (growth_max, greedy_prefix_drop_max, source) with optional [probe_ab.by_arch.<arch>] overrides."""
    if not reader.keys(table, "probe_ab", PROBE_AB_KEYS, ["by_arch"]):
        return ProbeAbPolicy()
    default = _probe_ab_limits(reader, table, "probe_ab", None)
    overrides = table.get("by_arch", {})
    by_arch: dict[str, ProbeAbLimits] = {}
    if not isinstance(overrides, dict):
        reader.error(f"expected a table of arch tables, got {describe_value(overrides)}", "probe_ab.by_arch")
        return ProbeAbPolicy(default=default)
    archs = list(matrix.archs) if matrix is not None else None
    for arch, spec in overrides.items():
        where = f"probe_ab.by_arch.{arch}"
        if archs is not None and arch not in archs:
            reader.error(f"unknown arch '{arch}'", where, unknown_name_hint(arch, archs))
            continue
        if reader.keys(spec, where, [], PROBE_AB_KEYS):
            by_arch[arch] = _probe_ab_limits(reader, spec, where, default)
    return ProbeAbPolicy(default=default, by_arch=by_arch)


def _probe_ab_limits(reader: TomlReader, spec: Mapping[str, Any], where: str,
                     inherit: ProbeAbLimits | None) -> ProbeAbLimits:
    def get(key: str, **bounds: Any) -> float:
        if inherit is not None and key not in spec:
            return getattr(inherit, key)
        return _number(reader, spec, key, where, **bounds)

    source = spec.get("source", inherit.source if inherit else "")
    if not isinstance(source, str):
        reader.error(f"expected a string, got {describe_value(source)}", f"{where}.source")
        source = ""
    return ProbeAbLimits(growth_max=get("growth_max", low=1, high=1000),
                         greedy_prefix_drop_max=get("greedy_prefix_drop_max", low=0, high=1), source=source)


def _parse_kv_cache(reader: TomlReader, table: Any) -> KvCachePolicy:
    """[kv_cache], optional, every key optional (KvCachePolicy's defaults)."""
    if not reader.keys(table, "kv_cache", [], KV_CACHE_OPTIONAL):
        return KvCachePolicy()
    if "fp8_min_token_ratio" not in table:
        return KvCachePolicy()
    ratio = _number(reader, table, "fp8_min_token_ratio", "kv_cache", low=0, high=16, low_open=True)
    return KvCachePolicy(fp8_min_token_ratio=ratio)
