"""Typed records of one results run (docs/results-folder.md), as the parsers read them.

Plain frozen dataclasses, no I/O: the parsers (kvgate.results.parsers) build them at the edge, the run loader
(kvgate.results.run_loader) assembles a `RunResults`, and the gate (kvgate.gate.evaluation) judges it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvgate.matrix.cells import cell_id

CONTRACT_VERSION = "1.18"  # docs/results-folder.md; readers refuse a newer major, writers write this
KV_CACHE_EVIDENCE_SINCE = (1, 4)  # from this contract version on, an ok accuracy stage records accuracy.kv_cache
STAGES = ("kernels", "accuracy", "throughput", "probe", "long_context")  # long_context: 1.10
HEAD, BASE = "head", "base"  # the sides of an A/B run (cell.json "side"); a cell without one is head
SIDES = (BASE, HEAD)
LONG_CONTEXT_TASK = "kvgate_passkey"  # the lm-eval task of long_context/ (kvgate.workloads.passkey)
STAGE_STATUSES = ("ok", "error", "timeout", "skipped")
DEFAULT_TASK = "gsm8k"


@dataclass(frozen=True, kw_only=True, slots=True)
class CellIdentity:
    """Who a cell is (cell.json): the gate pairs cells on these, never on folder names."""

    backend: str
    kv_cache_dtype: str
    arch: str
    model: str
    task: str = DEFAULT_TASK
    feature: str = ""  # its value of the feature axis (cell.json `feature`, contract 1.10); "": a plain cell

    @property
    def id(self) -> str:
        return cell_id(self.backend, self.kv_cache_dtype, self.arch, self.feature)

    @property
    def feature_name(self) -> str:
        """As a matrix Cell says it (a Match reads either)."""
        return self.feature

    @property
    def is_fp8(self) -> bool:
        return self.kv_cache_dtype != "auto"

    def with_dtype(self, kv_cache_dtype: str) -> CellIdentity:
        return CellIdentity(backend=self.backend, kv_cache_dtype=kv_cache_dtype, arch=self.arch,
                            model=self.model, task=self.task, feature=self.feature)


@dataclass(frozen=True, kw_only=True, slots=True)
class KvCacheEvidence:
    """status.json `accuracy.kv_cache`: the KV cache the accuracy stage's engine really held (contract 1.4).

    Every field is optional in the file (empty/None here when absent). `problem` says why the entry could not be
    read (a malformed or hostile value): the figures are then empty and the gate's check errors."""

    layers: int | None = None  # attention layers inspected
    layer_kv_cache_dtypes: tuple[str, ...] = ()  # the kv_cache_dtype the layers were built for, e.g. ("fp8",)
    tensor_dtypes: tuple[str, ...] = ()  # the dtypes of the cache tensors bound to them, e.g. ("uint8",)
    element_bytes: tuple[int, ...] = ()  # their element sizes: (1,) for an FP8 cache, (2,) for bf16/fp16
    tokens: int | None = None  # the KV cache size the engine log reported, in tokens
    k_scales: tuple[float, ...] = ()  # the distinct k/v scales the layers used (contract 1.7; 1.0 = none loaded)
    v_scales: tuple[float, ...] = ()
    bytes_per_token: float | None = None  # the KV cache spec's bytes per token over all layers (contract 1.9)
    problem: str | None = None

    @property
    def has_layer_facts(self) -> bool:
        """It says what the layers held (element sizes or the layers' cache dtype), not only a size."""
        return bool(self.element_bytes or self.layer_kv_cache_dtypes)


@dataclass(frozen=True, kw_only=True, slots=True)
class QuestionsRecord:
    """status.json `accuracy.question_plan` (contract 1.6): the design the runner ran the stage under and how far it
    got. The gate holds the design against the policy's plan and replays every decision from the answers; nothing
    here is trusted beyond that. `problem`: why the entry could not be read (the comparisons then error)."""

    design: str = ""  # "fixed" | "kvgate-gs/1"
    questions: int = 0  # the plan's questions (the most the stage would answer)
    looks: tuple[int, ...] = ()  # where it could stop
    answered: int = 0  # questions answered (fewer than `questions`: it stopped at a look)
    seconds: float | None = None  # answering them
    problem: str | None = None

    @property
    def stopped_early(self) -> bool:
        return 0 < self.answered < self.questions


@dataclass(frozen=True, kw_only=True, slots=True)
class StageStatus:
    """One entry of status.json."""

    status: str  # ok | error | timeout | skipped
    reason: str | None = None
    log_tail: str | None = None
    interleaved: bool = False  # throughput: the repeats ran by turns with the other side of an A/B run
    interleaved_rounds: int | None = None  # and in how many rounds, as status.json says (interleaved.rounds)
    # accuracy: the KV cache the engine held; long_context (1.12): its engine of its own's (engine.kv_cache); None
    # when not recorded
    kv_cache: KvCacheEvidence | None = None
    questions: QuestionsRecord | None = None  # accuracy: the design it ran under; None when not recorded
    elapsed_s: float | None = None  # how long the stage ran (seconds); None when not recorded or not a duration
    # engine starts that failed on the machine and were made again (status.json infra_retries): "run: reason"
    infra_retries: tuple[str, ...] = ()
    # throughput (1.9): the repeat numbers each engine measured (status.json engines[].repeats), in engine order;
    # None when not recorded (written before 1.9: every repeat its own engine)
    engines: tuple[tuple[int, ...], ...] | None = None
    model: str | None = None  # long_context (1.12): the model of the engine of its own that answered it; None: gsm8k's


def contract_version_tuple(value: Any) -> tuple[int, int] | None:
    """(major, minor) of a cell.json/run.json `contract_version` (1, 1.0, "1", "1.4"); None when its minor part
    cannot be read (the readers have already checked the major part)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return (value, 0)
    if isinstance(value, float) and value.is_integer():
        return (int(value), 0)
    if not isinstance(value, str):
        return None
    major, _, rest = value.strip().partition(".")
    minor = rest.split(".", 1)[0] if rest else "0"
    if not all(part.isascii() and part.isdigit() and len(part) <= 6 for part in (major, minor)):
        return None
    return (int(major), int(minor))


@dataclass(frozen=True, kw_only=True, slots=True)
class FilterScore:
    """One "<metric>,<filter>" figure of an lm-eval results file."""

    filter: str
    mean: float
    stderr: float | None  # None when lm-eval wrote "N/A"


@dataclass(frozen=True, kw_only=True, slots=True)
class SampleOutcomes:
    """Per-question outcomes of one filter, from samples_<task>_*.jsonl.

    `outcomes` maps the join key (doc_hash, else "doc_id:<n>") to (correct, prompt_hash or None).
    """

    filter: str
    outcomes: Mapping[str, tuple[bool, str | None]]

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def mean(self) -> float:
        return sum(correct for correct, _ in self.outcomes.values()) / self.n if self.outcomes else float("nan")


@dataclass(frozen=True, kw_only=True, slots=True)
class AccuracyResult:
    task: str
    metric: str
    scores: Mapping[str, FilterScore]  # by filter name
    n: int | None  # n-samples effective
    samples: Mapping[str, SampleOutcomes] | None  # by filter; None when no samples file was logged
    results_file: str
    samples_file: str | None = None
    lm_eval_version: str | None = None
    model_args: str | None = None
    limit: float | int | None = None
    num_fewshot: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ThroughputRepeat:
    """One `vllm bench throughput --output-json` file (+ its captured stdout, when present)."""

    source: str
    requests_per_second: float
    tokens_per_second: float
    elapsed_time: float
    num_requests: int
    total_num_tokens: int
    output_tokens_per_second: float | None = None  # from the log's "Throughput:" line


@dataclass(frozen=True, kw_only=True, slots=True)
class ThroughputResult:
    repeats: tuple[ThroughputRepeat, ...]

    def values(self, measure: str) -> list[float]:
        values = [getattr(r, measure) for r in self.repeats]
        return [v for v in values if v is not None]


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelCase:
    name: str  # classname::name
    outcome: str  # passed | failed | error | skipped
    message: str = ""  # pytest's message (a failed assertion's first lines: mismatch counts, max error, tolerance)
    seconds: float | None = None  # the test's time in junit.xml


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelResult:
    source: str
    cases: tuple[KernelCase, ...]
    properties: Mapping[str, str] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return sum(case.outcome == outcome for case in self.cases)

    @property
    def problems(self) -> tuple[KernelCase, ...]:
        return tuple(c for c in self.cases if c.outcome in ("failed", "error"))


@dataclass(frozen=True, kw_only=True, slots=True)
class LogPointer:
    """Where a stage's first real error is (kvgate.results.parsers.tool_log): the log, its line, the error."""

    path: str  # relative to the run folder, e.g. "flashmla-fp8-sm90/logs/throughput.log"
    line: int | None  # 1-based; None when the error was read from status.json's log_tail (no log file)
    error: str  # the error's line, its logger prefix removed
    found_by: str  # "vllm: memory profiling", "traceback", "pytest: test failed", ...
    frame: str = ""  # the last frame of its traceback, where one was read
    url: str = ""  # where a report links it: relative to the gate's folder, or a CI artifact's address (the gate's CLI)

    @property
    def where(self) -> str:
        """e.g. "flashmla-fp8-sm90/logs/throughput.log:76", or "<cell>/status.json log_tail" without a log file"""
        return self.path + (f":{self.line}" if self.line is not None else " log_tail")


@dataclass(frozen=True, kw_only=True, slots=True)
class StageResult:
    """A stage of a cell as found on disk: requested or not, its status.json entry, its parsed outputs."""

    stage: str
    requested: bool
    status: StageStatus | None  # the status.json entry, when there is one
    data: Any = None  # AccuracyResult | ThroughputResult | KernelResult | probe record | None
    missing: str | None = None  # why the outputs are absent, when they are
    unreadable: tuple[str, ...] = ()  # "<file>: <what is wrong>", one per output that could not be read (truncated...)
    first_error: LogPointer | None = None  # a stage that broke or failed: the first real error of its log

    @property
    def health(self) -> str:
        """not_run | skipped | error | timeout | missing | ok (an unreadable output is an error)"""
        if not self.requested:
            return "not_run"
        if self.unreadable:
            return "error"
        if self.status is not None and self.status.status in ("error", "timeout", "skipped"):
            return self.status.status
        if self.data is None:
            return "missing"
        return "ok"


@dataclass(frozen=True, kw_only=True, slots=True)
class CellResults:
    identity: CellIdentity
    folder: str  # as shown in messages
    stages: Mapping[str, StageResult]
    extra: Mapping[str, Any] = field(default_factory=dict)  # cell.json keys beyond the identity
    side: str = HEAD  # the side of an A/B run (cell.json "side"); head when cell.json names none

    def stage(self, name: str) -> StageResult:
        return self.stages.get(name) or StageResult(stage=name, requested=False, status=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class UnreadableCell:
    """A cell folder whose own cell.json or status.json could not be read (a job killed mid-write, a hand edit gone
    wrong): the gate reports it as that cell's error and judges the other cells as usual."""

    folder: str  # as shown in messages
    cell: str  # its cell id when cell.json said it, else the folder's name (kvgate names folders by cell id)
    side: str  # head, or base for a `<cell id>--base` folder or a cell.json that says so
    problems: tuple[str, ...]  # one "<file>: <what is wrong> in <where>" per problem


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResults:
    folder: str
    cells: tuple[CellResults, ...]
    run_info: Mapping[str, Any] = field(default_factory=dict)  # run.json, when present
    unreadable: tuple[UnreadableCell, ...] = ()  # cell folders that could not be read; each is that cell's error

    def find(self, identity: CellIdentity) -> CellResults | None:
        return next((c for c in self.cells if c.identity == identity), None)

    @property
    def has_base_side(self) -> bool:
        """An A/B run: it holds base cells (the vLLM the change is compared with) beside the head cells."""
        return any(c.side == BASE for c in self.cells)

    def side(self, name: str) -> RunResults:
        """The cells of one side, as a run of their own."""
        return RunResults(folder=self.folder, cells=tuple(c for c in self.cells if c.side == name),
                          run_info=self.run_info, unreadable=tuple(u for u in self.unreadable if u.side == name))
