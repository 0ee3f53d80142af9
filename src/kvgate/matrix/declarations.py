"""What the matrix declares, as frozen records: archs, backends, workloads, exclusions, waivers, and the cells they
make (attention backend x kv_cache_dtype x arch, with the workload that runs it). Pure and stdlib only; built from
the TOML files by kvgate.matrix.cells.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate import InputError, InputErrors, did_you_mean, unknown_name_hint
from kvgate.matrix.host_requirements import HostRequirement

MATCH_KEYS = ("backend", "kv_cache_dtype", "arch", "feature")
PLAIN = "plain"  # a match's `feature` value for the cells without one
LOCAL_MODEL_PREFIX = "kvgate:"
GSM8K_FILTERS = ("strict-match", "flexible-extract")  # lm-eval's gsm8k filters (the gate's policy names them too)


@dataclass(frozen=True, kw_only=True, slots=True)
class Arch:
    name: str
    description: str
    runner: str
    compute_capability: str | None = None
    gpus: int = 0  # GPUs one host of `runner` has (axes.toml; 1 for a GPU arch unless it says)
    multi_gpu_runners: Mapping[str, int] = field(default_factory=dict)  # label -> GPUs, for cells that need more

    def runner_with(self, gpus: int) -> str | None:
        """The label of this arch's smallest runner with at least `gpus` GPUs; None when none has them."""
        if gpus <= self.gpus:
            return self.runner
        fits = sorted((count, label) for label, count in self.multi_gpu_runners.items() if count >= gpus)
        return fits[0][1] if fits else None

    @property
    def is_gpu(self) -> bool:
        return self.name != "cpu"


@dataclass(frozen=True, kw_only=True, slots=True)
class Backend:
    name: str
    mla: bool
    kv_cache_dtypes: tuple[str, ...]
    archs: tuple[str, ...]
    arch_kv_cache_dtypes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    block_sizes: tuple[int, ...] = ()
    block_size_multiple: int | None = None
    sources: tuple[str, ...] = ()
    notes: str = ""
    host_requirements: tuple[HostRequirement, ...] = ()  # what its cells need from the host beyond the arch

    def supports(self, arch: str, kv_cache_dtype: str) -> bool:
        if arch not in self.archs:
            return False
        allowed = self.arch_kv_cache_dtypes.get(arch, self.kv_cache_dtypes)
        return kv_cache_dtype in allowed


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpectedAccuracy:
    """A workload's expected auto gsm8k accuracy per filter, with a relative tolerance (vLLM CI's form):
    the gate's accuracy floor is value x (1 - rtol)."""

    values: Mapping[str, float]  # by gsm8k filter, fractions
    rtol: float
    source: str  # where the figures come from (a link, a run)


FP8_KV_SCALES = ("none", "checkpoint")  # workloads.toml fp8_kv_scales


LONG_CONTEXT_SEED = 20261202  # workloads.toml long_context.seed's default (kvgate.workloads.passkey's keys)
DEFAULT_MAX_MODEL_LEN = 4096  # a workload's engine max_model_len where its model_args set none
LONG_CONTEXT_ANSWER_TOKENS = 16  # the passkey task's generation cap: " 71432" is 1-6 tokens in every tokenizer


@dataclass(frozen=True, kw_only=True, slots=True)
class LongContext:
    """A workload's long-context task (workloads.toml `long_context`; kvgate.workloads.passkey writes it): context
    lengths in tokens, needle depths (0 = right after the instruction, 1 = right before the question), keys per
    (length, depth) and the keys' seed. `model`: the model that answers it in an engine of its own (with the cell's
    backend, kv_cache_dtype and engine arguments, and `max_model_len`), where the workload's gsm8k model has too few
    positions; None: the gsm8k engine answers it."""

    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    keys_per_depth: int
    seed: int = LONG_CONTEXT_SEED
    model: str | None = None
    max_model_len: int | None = None  # the own engine's (set exactly when `model` is)

    @property
    def per_length(self) -> int:
        return len(self.depths) * self.keys_per_depth

    def as_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"lengths": list(self.lengths), "depths": list(self.depths),
                                  "keys_per_depth": self.keys_per_depth, "seed": self.seed}
        if self.model is not None:
            record.update(model=self.model, max_model_len=self.max_model_len)
        return record

    def fitting(self, max_model_len: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(lengths an engine of max_model_len runs, lengths it cannot): a prompt of the length and its answer fit."""
        fit = tuple(n for n in self.lengths if n + LONG_CONTEXT_ANSWER_TOKENS <= max_model_len)
        return fit, tuple(n for n in self.lengths if n not in fit)


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    name: str
    model: str
    mla: bool
    archs: tuple[str, ...]
    model_args: Mapping[str, Any]
    gsm8k: Mapping[str, Any]
    throughput: Mapping[str, Any]
    timeouts: Mapping[str, int] = field(default_factory=dict)  # stage -> seconds (accuracy, throughput)
    calculate_kv_scales: bool = False  # FP8 cells: vLLM computes k/v scales from the data (else checkpoint or 1.0)
    # FP8 cells: "checkpoint" loads the model's FP8-checkpoint variant, which ships per-tensor k/v scales
    # (compressed-tensors kv_cache_scheme; kvgate.workloads.kv_scales); "none": the model as it is (scales 1.0)
    fp8_kv_scales: str = "none"
    expected_accuracy: ExpectedAccuracy | None = None
    architectures: tuple[str, ...] = ()  # the model's architectures (config.json), for the import-graph selection
    # GPU-minutes one side of a stage took where it was measured: arch -> stage -> minutes (the plan's estimate)
    measured_minutes: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    long_context: LongContext | None = None  # the passkey task beside gsm8k (kvgate.workloads.passkey)

    @property
    def max_model_len(self) -> int:
        """The max_model_len its engines run with (model_args, else kvgate's default)."""
        return int(self.model_args.get("max_model_len", DEFAULT_MAX_MODEL_LEN))

    @property
    def long_context_lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the passkey lengths its accuracy engine runs, those its max_model_len cannot hold); both empty without
        the task."""
        if self.long_context is None:
            return (), ()
        return self.long_context.fitting(self.long_context.max_model_len or self.max_model_len)

    @property
    def long_context_model(self) -> str:
        """The model that answers the passkey task: its own (long_context.model), else the gsm8k model."""
        return (self.long_context.model if self.long_context is not None and self.long_context.model
                else self.model)

    @property
    def is_local_model(self) -> bool:
        """True for the tiny models kvgate builds itself ("kvgate:<name>")."""
        return self.model.startswith(LOCAL_MODEL_PREFIX)


@dataclass(frozen=True, kw_only=True, slots=True)
class Feature:
    """A value of the feature axis (matrix/axes.toml [features.<name>]): an engine feature users run FP8 with, which
    its cells turn on over the workload's engine arguments. A plain cell has none."""

    name: str
    description: str
    engine_args: Mapping[str, Any]  # what its cells pass to the engine, in every stage, over the workload's
    gpus: int = 1  # GPUs one engine of its cells needs (tensor_parallel_size)
    cells: tuple[Match, ...] = ()  # which plain cells take it (each taken cell gets a variant with the feature)
    vllm_paths: tuple[str, ...] = ()  # vLLM path globs whose change implies the feature (kvgate.change.selection)
    where: str = ""  # "features.spec_decode"


@dataclass(frozen=True, kw_only=True, slots=True)
class Match:
    """A selector over cells: each key holds the allowed values, or is absent (any)."""

    backend: tuple[str, ...] = ()
    kv_cache_dtype: tuple[str, ...] = ()
    arch: tuple[str, ...] = ()
    feature: tuple[str, ...] = ()  # feature names, "plain" for the cells without one

    def matches(self, cell: Cell) -> bool:
        return all(
            not allowed or value in allowed
            for value, allowed in ((cell.backend, self.backend), (cell.kv_cache_dtype, self.kv_cache_dtype),
                                   (cell.arch, self.arch), (cell.feature_name or PLAIN, self.feature))
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Exclusion:
    match: Match
    reason: str
    link: str
    where: str  # e.g. "exclude[1]"


@dataclass(frozen=True, kw_only=True, slots=True)
class Waiver:
    match: Match
    checks: tuple[str, ...]
    reason: str
    issue: str
    expires: dt.date
    where: str

    def covers(self, cell: Cell, check: str) -> bool:
        return self.match.matches(cell) and ("*" in self.checks or check in self.checks)

    def expired(self, today: dt.date) -> bool:
        return today > self.expires


def cell_id(backend: str, kv_cache_dtype: str, arch: str, feature: str = "") -> str:
    """The one name of a cell: nox parameter id, GitHub job name, results folder and report row. A cell of the
    feature axis ends in its feature: flashmla-fp8-sm90-spec_decode."""
    return f"{backend.lower()}-{kv_cache_dtype}-{arch}" + (f"-{feature}" if feature else "")


ARCH_NAME = re.compile(r"sm\d{2,3}|cpu")
FEATURE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
KV_CACHE_DTYPE_NAME = re.compile(r"[a-z0-9][a-z0-9_]{0,39}")  # vLLM's: auto, fp8, fp8_e4m3, fp8_inc, nvfp4, ...


def split_cell_id(cell: str) -> tuple[str, str, str, str] | None:
    """(backend as in the id, kv_cache_dtype, arch, feature or "") of a cell id; None when it is not one."""
    parts = cell.split("-")
    if len(parts) >= 4 and ARCH_NAME.fullmatch(parts[-2]) and FEATURE_NAME.fullmatch(parts[-1]):
        *head, dtype, arch, feature = parts
    elif len(parts) >= 3 and ARCH_NAME.fullmatch(parts[-1]):
        *head, dtype, arch = parts
        feature = ""
    else:
        return None
    backend = "-".join(head)
    if not backend or not dtype:
        return None
    return backend, dtype, arch, feature


@dataclass(frozen=True, kw_only=True, slots=True)
class Cell:
    backend: str
    kv_cache_dtype: str
    arch: str
    workload: Workload
    mla: bool
    host_requirements: tuple[HostRequirement, ...] = ()  # what this cell needs from the host beyond its arch
    feature: Feature | None = None  # its value of the feature axis; None: a plain cell

    @property
    def id(self) -> str:
        return cell_id(self.backend, self.kv_cache_dtype, self.arch, self.feature_name)

    @property
    def feature_name(self) -> str:
        """"" for a plain cell."""
        return self.feature.name if self.feature is not None else ""

    @property
    def engine_args(self) -> dict[str, Any]:
        """What the cell passes to the engine in every stage over its workload's: its feature's (none when plain)."""
        return dict(self.feature.engine_args) if self.feature is not None else {}

    @property
    def gpus(self) -> int:
        """GPUs one engine of the cell needs (0 on the CPU)."""
        return 0 if self.arch == "cpu" else (self.feature.gpus if self.feature is not None else 1)

    @property
    def model(self) -> str:
        return self.workload.model

    @property
    def is_fp8(self) -> bool:
        return self.kv_cache_dtype != "auto"

    @property
    def loads_checkpoint_kv_scales(self) -> bool:
        """An FP8 cell of a workload whose FP8 cells load the model's k/v scales from its checkpoint."""
        return self.is_fp8 and self.workload.fp8_kv_scales == "checkpoint"

    def as_record(self) -> dict[str, Any]:
        """The identity written to a results folder's cell.json (docs/results-folder.md)."""
        return {
            "backend": self.backend,
            "kv_cache_dtype": self.kv_cache_dtype,
            "arch": self.arch,
            "model": self.model,
            "task": str(self.workload.gsm8k["task"]),  # the lm-eval task name its results are filed under
            "cell_id": self.id,
            "workload": self.workload.name,
            # FP8 cells: the engine's calculate_kv_scales, passed explicitly (docs/results-folder.md 1.3)
            **({"calculate_kv_scales": self.workload.calculate_kv_scales} if self.is_fp8 else {}),
            # FP8 cells: whether the engine loaded k/v scales shipped with the checkpoint (1.7)
            **({"checkpoint_kv_scales": self.loads_checkpoint_kv_scales} if self.is_fp8 else {}),
            # cells of the feature axis: the feature and the engine arguments it adds (1.10; absent: a plain cell)
            **({"feature": self.feature_name, "feature_engine_args": self.engine_args} if self.feature else {}),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class SelectionRules:
    """How a vLLM change selects cells (backends.toml [selection]; kvgate.change.selection applies them)."""

    attention_registry: str = "vllm.v1.attention.backends.registry"
    model_registry: str = "vllm.model_executor.models.registry"
    engine_roots: tuple[str, ...] = ()  # modules every cell's engine starts from
    arch_roots: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # "cpu" | "gpu" -> more roots
    inert: tuple[str, ...] = ()  # path globs no cell reads (docs, examples, vLLM's own tests, CI files)


@dataclass(frozen=True, kw_only=True, slots=True)
class Matrix:
    kv_cache_dtypes: tuple[str, ...]
    archs: Mapping[str, Arch]
    backends: Mapping[str, Backend]
    workloads: Mapping[str, Workload]
    exclusions: tuple[Exclusion, ...]
    waivers: tuple[Waiver, ...]
    shared_sources: tuple[str, ...]
    cells: tuple[Cell, ...]
    selection: SelectionRules = field(default_factory=SelectionRules)
    features: Mapping[str, Feature] = field(default_factory=dict)

    def cell(self, cell_id_: str, source: str = "--cell") -> Cell:
        for cell in self.cells:
            if cell.id == cell_id_:
                return cell
        raise InputError(source, f"unknown cell '{cell_id_}'",
                         hint=did_you_mean(cell_id_, [c.id for c in self.cells])
                         or "List them with `nox -s matrix`")

    def select(
        self,
        *,
        archs: Sequence[str] = (),
        backends: Sequence[str] = (),
        kv_cache_dtypes: Sequence[str] = (),
        cell_ids: Sequence[str] = (),
    ) -> list[Cell]:
        """Cells passing every filter; names are checked (InputErrors) before anything is filtered. Backend names
        are vLLM's (FLASHINFER), any case (flashinfer). Which cells a change selects: kvgate.change.selection."""
        problems = []
        backends = [self._backend_name(b) for b in backends]
        for flag, values, known in (("--arch", archs, self.archs), ("--backend", backends, self.backends),
                                    ("--kv-cache-dtype", kv_cache_dtypes, self.kv_cache_dtypes)):
            for value in values:
                if value not in known:
                    problems.append(InputError(flag, f"unknown value '{value}'", hint=unknown_name_hint(value, known)))
        for value in cell_ids:
            try:
                self.cell(value)
            except InputError as error:
                problems.append(error)
        if problems:
            raise InputErrors(problems)
        return [
            cell for cell in self.cells
            if (not archs or cell.arch in archs)
            and (not backends or cell.backend in backends)
            and (not kv_cache_dtypes or cell.kv_cache_dtype in kv_cache_dtypes)
            and (not cell_ids or cell.id in cell_ids)
        ]

    def _backend_name(self, name: str) -> str:
        matches = [known for known in self.backends if known.lower() == name.lower()]
        return matches[0] if matches else name

    def runner_for(self, cell: Cell) -> str:
        """The CI runner label of hosts that can run the cell: its host requirement's, else its arch's."""
        labels = [r.runner for r in cell.host_requirements if r.routes]
        return labels[0] if labels else self.archs[cell.arch].runner

    def waiver_for(self, cell: Cell, check: str) -> Waiver | None:
        """The first waiver covering this cell's check, expired or not (the gate decides)."""
        return next((w for w in self.waivers if w.covers(cell, check)), None)

    def cells_by_arch(self) -> dict[str, list[Cell]]:
        by_arch: dict[str, list[Cell]] = {arch: [] for arch in self.archs}
        for cell in self.cells:
            by_arch[cell.arch].append(cell)
        return by_arch


# ---------------------------------------------------------------------------------------------- globs

def glob_matches(pattern: str, path: str) -> bool:
    """Match a repository path against a glob: `**` spans folders, `*` and `?` stay inside one."""
    return _glob_regex(pattern).fullmatch(path) is not None


_GLOB_CACHE: dict[str, re.Pattern[str]] = {}


def _glob_regex(pattern: str) -> re.Pattern[str]:
    if pattern not in _GLOB_CACHE:
        out, i = [], 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
            elif pattern.startswith("**", i):
                out.append(".*")
                i += 2
            elif pattern[i] == "*":
                out.append("[^/]*")
                i += 1
            elif pattern[i] == "?":
                out.append("[^/]")
                i += 1
            else:
                out.append(re.escape(pattern[i]))
                i += 1
        _GLOB_CACHE[pattern] = re.compile("".join(out))
    return _GLOB_CACHE[pattern]
