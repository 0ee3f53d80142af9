"""What the trusted side decides about each cell, held against what its results folder says. Pure.

A results folder is written where the change under test runs, so anything in it that the matrix or the policy
already determines is a claim to check, never an input to the gate:

    cell.json    model and task, workload, cell_id (the matrix's cell of that backend, dtype and arch), and for an
                 FP8 cell checkpoint_kv_scales and calculate_kv_scales (its workload's; cell.json's absent
                 checkpoint_kv_scales means false, as the contract says); a cell of a feature (1.10): the
                 feature is part of its id, and feature_engine_args where written are the feature's (axes.toml)
    the tools'   lm-eval's shots (results n-shot: the workload's num_fewshot) and each throughput repeat's prompts
    outputs      (num_requests: its num_prompts)
    status.json  accuracy.question_plan: the design, questions and looks the policy plans for the cell
                 (kvgate.gate.question_plan); throughput: the workload's design (its engines and repeats a side,
                 contract 1.9), in an A/B run both sides by turns; folders written before 1.9 (a repeat an engine):
                 in an A/B run both sides interleaved in at least the policy's rounds (throughput.rounds), paired by
                 their repeat-N.json files, and under --require-baseline at least that many measured repeats

A cell whose folder says otherwise, or that is no cell of the matrix, is refused: the gate judges nothing of it and
its check `cell` is an ERROR naming the field, what the folder said and what the trusted side says. A cell it
compared with (its auto cell, its base side) then has no partner, so those comparisons fail too: fail closed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvgate.gate import question_plan
from kvgate.gate.policy import Policy
from kvgate.matrix.cells import Matrix
from kvgate.results.records import DEFAULT_TASK, HEAD, CellResults, RunResults

WORKLOADS_FILE = "matrix/workloads.toml"


@dataclass(frozen=True, kw_only=True, slots=True)
class TrustedCell:
    """A cell as the matrix declares it: what its cell.json must say."""

    id: str
    model: str
    task: str
    workload: str
    is_fp8: bool
    checkpoint_kv_scales: bool  # FP8 cells of a workload with fp8_kv_scales = "checkpoint"
    calculate_kv_scales: bool  # FP8 cells: the workload's calculate_kv_scales
    num_fewshot: int | None = None  # the workload's gsm8k shots (lm-eval's results say n-shot)
    num_prompts: int | None = None  # the workload's `vllm bench throughput` prompts (each repeat's num_requests)
    engines: int = 1  # the workload's throughput design: engine starts a side, measured repeats in each
    repeats: int = 1
    long_context_lengths: tuple[int, ...] = ()  # the passkey lengths its accuracy engine runs (workloads long_context)
    long_context_model: str = ""  # the model that answers them (long_context.model, else the gsm8k model); "": none
    source: str = WORKLOADS_FILE  # the workloads file that declares it, as messages name it
    feature: str = ""  # its value of the feature axis; "": a plain cell
    feature_engine_args: Mapping[str, Any] | None = None  # the engine arguments its feature turns on (axes.toml)


def trusted_cells(matrix: Matrix, source: str = WORKLOADS_FILE) -> dict[str, TrustedCell]:
    """Every cell of the matrix by id (one workload per backend, dtype and arch: kvgate.matrix.cells); `source`: the
    matrix's workloads.toml as messages name it."""
    return {cell.id: TrustedCell(id=cell.id, model=cell.model, task=str(cell.workload.gsm8k.get("task", DEFAULT_TASK)),
                                 workload=cell.workload.name, is_fp8=cell.is_fp8,
                                 checkpoint_kv_scales=cell.loads_checkpoint_kv_scales,
                                 calculate_kv_scales=cell.workload.calculate_kv_scales,
                                 num_fewshot=_count(cell.workload.gsm8k.get("num_fewshot")),
                                 num_prompts=_count(cell.workload.throughput.get("num_prompts")),
                                 engines=_count(cell.workload.throughput.get("engines", 1)) or 1,
                                 repeats=_count(cell.workload.throughput.get("repeats")) or 1,
                                 long_context_lengths=cell.workload.long_context_lengths[0],
                                 long_context_model=cell.workload.long_context_model
                                 if cell.workload.long_context is not None else "", source=source,
                                 feature=cell.feature_name,
                                 feature_engine_args=cell.engine_args if cell.feature is not None else None)
            for cell in matrix.cells}



def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Refusal:
    """A cell the gate does not judge: what its folder says against what the trusted side says."""

    cell: CellResults
    problems: tuple[str, ...]  # "<file> <field> is <said>, <the trusted side says ...>"


def shown(value: Any) -> str:
    """A value from a results folder in a message: quoted, escaped, short (a hostile value stays one line)."""
    if isinstance(value, str):
        return repr(value[:60]) + ("…" if len(value) > 60 else "")
    return "absent" if value is None else repr(value)[:60]


def identity_problems(cell: CellResults, trusted: Mapping[str, TrustedCell]) -> list[str]:
    """cell.json against the matrix's cell of the same id."""
    source = f"{cell.folder}/cell.json"
    expected = trusted.get(cell.identity.id)
    if expected is None:
        return [f"{source} names cell {cell.identity.id}, which is no cell of the matrix (the backend does not "
                "support that dtype on that arch, or matrix/exclusions.toml leaves it out): nothing was planned "
                "for it"]
    where = f"({expected.source} workloads.{expected.workload})"
    problems = []
    said: list[tuple[str, Any, Any]] = [("model", cell.identity.model, expected.model),
                                        ("task", cell.identity.task, expected.task)]
    extra = cell.extra
    if "workload" in extra:
        said.append(("workload", extra["workload"], expected.workload))
    if "cell_id" in extra:
        said.append(("cell_id", extra["cell_id"], expected.id))
    if expected.is_fp8:  # absent means false (docs/results-folder.md)
        said.append(("checkpoint_kv_scales", extra.get("checkpoint_kv_scales", False), expected.checkpoint_kv_scales))
        if "calculate_kv_scales" in extra:
            said.append(("calculate_kv_scales", extra["calculate_kv_scales"], expected.calculate_kv_scales))
    elif extra.get("checkpoint_kv_scales", False) is not False:
        said.append(("checkpoint_kv_scales", extra["checkpoint_kv_scales"], False))
    if "feature_engine_args" in extra:  # a plain cell turns no feature on (the matrix: axes.toml [features])
        said.append(("feature_engine_args", extra["feature_engine_args"], expected.feature_engine_args))
    for field, value, wanted in said:
        if value != wanted or type(value) is not type(wanted):
            shown_value = "absent (false)" if field == "checkpoint_kv_scales" and field not in extra else shown(value)
            said_by = (f"matrix/axes.toml features.{expected.feature}.engine_args" if expected.feature
                       else "a plain cell turns no feature on") if field == "feature_engine_args" else where
            problems.append(f"{source} {field} is {shown_value}, but the matrix says "
                            f"{shown(wanted) if wanted is not None else 'none'} for {expected.id} ({said_by})"
                            if field == "feature_engine_args" else
                            f"{source} {field} is {shown_value}, but the matrix says {shown(wanted)} for "
                            f"{expected.id} {where}")
    return problems + workload_problems(cell, expected, where)


def workload_problems(cell: CellResults, expected: TrustedCell, where: str) -> list[str]:
    """What the tools' own outputs say the workload was, where the matrix says it: lm-eval's shots (results
    `n-shot`), each throughput repeat's prompts (`num_requests` of vllm bench's --output-json)."""
    problems = []
    accuracy = cell.stage("accuracy").data
    if accuracy is not None and expected.num_fewshot is not None and accuracy.num_fewshot != expected.num_fewshot:
        shots = "absent" if accuracy.num_fewshot is None else accuracy.num_fewshot  # lm-eval always writes it
        problems.append(f"{accuracy.results_file} n-shot is {shots}, but the matrix says {expected.num_fewshot} for "
                        f"{expected.id} {where}")
    throughput = cell.stage("throughput").data
    for repeat in getattr(throughput, "repeats", ()) if expected.num_prompts is not None else ():
        if repeat.num_requests != expected.num_prompts:
            problems.append(f"{repeat.source} num_requests is {repeat.num_requests}, but the matrix says "
                            f"{expected.num_prompts} prompts (num_prompts) for {expected.id} {where}")
            break
    return problems


def question_plan_problems(cell: CellResults, policy: Policy, *, compared: bool) -> list[str]:
    """status.json accuracy.question_plan against the policy's plans for the cell (as the gate will judge it).

    compared: an A/B run or --require-baseline (only the powered plan)."""
    status = cell.stage("accuracy").status
    record = status.questions if status is not None else None
    if record is None or record.problem:
        return []  # no runner's record (the comparisons use the plan's questions), or unreadable (they error)
    identity = cell.identity
    powered = question_plan.plan(policy, arch=identity.arch, task=identity.task, model=identity.model, ab=True)
    plans = [powered]
    if not compared:
        plans.insert(0, question_plan.plan(policy, arch=identity.arch, task=identity.task, model=identity.model,
                                           ab=False))
    ran = {"design": record.design, "questions": record.questions, "looks": list(record.looks)}
    if any(plan.as_record() == ran for plan in plans):
        return []
    wanted = " or ".join(dict.fromkeys(f"{p.design} with {p.questions} questions, looks {list(p.looks)}"
                                       for p in plans))
    return [f"{cell.folder}/status.json accuracy.question_plan is {record.design} with {record.questions} questions, "
            f"looks {list(record.looks)[:8]}, but the policy plans {wanted} ({policy.source} [accuracy])"]


ROUND_FILE = re.compile(r"(?:^|[/\\])repeat-(\d+)\.json$")


def measured_rounds(cell: CellResults) -> set[int]:
    """The round numbers of a cell's measured throughput repeats (throughput/repeat-N.json)."""
    data = cell.stage("throughput").data
    found = (ROUND_FILE.search(repeat.source) for repeat in getattr(data, "repeats", ()))
    return {int(match[1]) for match in found if match}


def engine_design_problems(cell: CellResults, expected: TrustedCell) -> list[str]:
    """A side measured as kvgate's runners record it from contract 1.9 (status.json throughput.engines): as many
    engines as the cell's workload declares, each with its repeats. Nothing to hold when the record is absent (a
    folder written before 1.9: every repeat its own engine; the rounds rule below holds it)."""
    status = cell.stage("throughput").status
    engines = status.engines if status is not None else None
    if engines is None:
        return []
    counts = sorted({len(engine) for engine in engines})
    if len(engines) == expected.engines and counts == [expected.repeats]:
        return []
    said = f"{len(engines)} engine{'s' if len(engines) != 1 else ''} of {'/'.join(map(str, counts))} repeats"
    return [f"{cell.folder}/status.json throughput.engines: {said}, but workload {expected.workload} runs "
            f"{expected.engines} engine{'s' if expected.engines != 1 else ''} of {expected.repeats} repeats "
            f"({expected.source})"]


def throughput_design_problems(cell: CellResults, partner: CellResults | None, policy: Policy, expected: TrustedCell,
                               *, ab: bool, require_baseline: bool, has_baseline: bool) -> list[str]:
    """The throughput design the trusted side says. Folders of contract 1.9 ran the workload's design (its engines
    and repeats, engine_design_problems), and in an A/B run both sides say they took turns. Folders written before
    (no engines record, every repeat its own engine): in an A/B run both sides interleaved in at least the policy's
    rounds, counted from the repeats that pair; under --require-baseline against a stored baseline, at least that many
    measured repeats. A stage that did not end ok is its health check's matter, not this."""
    own = cell.stage("throughput")
    needed = policy.throughput.rounds
    where = f"{policy.source} throughput.rounds"
    if own.health != "ok":
        return []
    problems = engine_design_problems(cell, expected)
    recorded = own.status is not None and own.status.engines is not None
    if ab:
        if partner is None or partner.stage("throughput").health != "ok":
            return problems  # the throughput check fails the missing or failed base side
        problems += engine_design_problems(partner, expected)
        for side in (cell, partner):
            status = side.stage("throughput").status
            if status is None or not status.interleaved:
                problems.append(f"{side.folder}/status.json throughput.interleaved is absent, but an A/B run's "
                                "throughput runs both sides by turns")
            elif not recorded and (status.interleaved_rounds is None or status.interleaved_rounds < needed):
                problems.append(f"{side.folder}/status.json throughput.interleaved.rounds is "
                                f"{shown(status.interleaved_rounds)}, but the policy needs at least {needed} ({where})")
        if not recorded:
            paired = len(measured_rounds(cell) & measured_rounds(partner))
            if paired < needed:
                problems.append(f"{cell.folder}/throughput: {paired} rounds pair with the base side's repeats "
                                f"(repeat-N.json), but the policy needs at least {needed} ({where})")
        return problems
    if require_baseline and has_baseline and not recorded:
        repeats = len(getattr(own.data, "repeats", ()))
        if repeats < needed:
            return [f"{cell.folder}/throughput: {repeats} measured repeats, but --require-baseline needs at least "
                    f"{needed} ({where})"]
    return problems


def refusals(run: RunResults, base: RunResults | None, baseline: RunResults | None, trusted: Mapping[str, TrustedCell],
             policy: Policy, *, ab: bool, require_baseline: bool) -> list[Refusal]:
    """Every cell of the run (both sides of an A/B run: `base`) whose folder disagrees with the trusted side."""
    compared = ab or require_baseline
    found = []
    for results in (run, base):
        for cell in results.cells if results is not None else ():
            problems = identity_problems(cell, trusted)
            if not problems:
                problems = question_plan_problems(cell, policy, compared=compared)
            if not problems and cell.side == HEAD:
                partner = base.find(cell.identity) if ab and base is not None else None
                problems = throughput_design_problems(cell, partner, policy, trusted[cell.identity.id], ab=ab,
                                                      require_baseline=require_baseline,
                                                      has_baseline=baseline is not None)
            if problems:
                found.append(Refusal(cell=cell, problems=tuple(problems)))
    return found


def without(results: RunResults | None, refused: Sequence[Refusal]) -> RunResults | None:
    """The run without the refused cells (the gate judges none of them)."""
    if results is None:
        return None
    gone = {id(r.cell) for r in refused}
    return replace(results, cells=tuple(c for c in results.cells if id(c) not in gone))
