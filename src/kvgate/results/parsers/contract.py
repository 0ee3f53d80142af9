"""kvgate's own small files of a results run: cell.json, status.json, run.json (docs/results-folder.md)."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from kvgate import InputError, unknown_name_hint
from kvgate.results import schema
from kvgate.results.parsers.reading import expect_object, expect_string, kind, loads, major_version
from kvgate.results.records import (
    BASE,
    CONTRACT_VERSION,
    DEFAULT_TASK,
    HEAD,
    SIDES,
    STAGE_STATUSES,
    STAGES,
    CellIdentity,
    KvCacheEvidence,
    QuestionsRecord,
    StageStatus,
)

READ_MAJOR = int(CONTRACT_VERSION.split(".", 1)[0])
IDENTITY_KEYS = ("backend", "kv_cache_dtype", "arch", "model")


def check_contract_version(data: Mapping[str, Any], source: str) -> None:
    if "contract_version" not in data:
        return  # hand-written folders may leave it out: they follow v1
    major = major_version(data["contract_version"], source, "contract_version")
    if major > READ_MAJOR:
        raise InputError(source, f"written for results contract version {data['contract_version']}, "
                                 f"but this kvgate reads version {CONTRACT_VERSION}", "contract_version",
                         "Upgrade kvgate to a release that reads it")
    if major < 1:
        raise InputError(source, f"unknown results contract version {data['contract_version']!r}",
                         "contract_version", f"Write {CONTRACT_VERSION!r}")


def parse_cell(text: str, source: str, *, backends: Collection[str], kv_cache_dtypes: Collection[str],
               archs: Collection[str], features: Collection[str] = ()) -> tuple[CellIdentity, dict[str, Any]]:
    """cell.json -> (identity, the other keys). Names are checked against the matrix's axes; `feature` (1.10) is
    part of the identity, and a folder without it is a plain cell (what every folder before 1.10 is)."""
    data = expect_object(loads(text, source), source, "")
    check_contract_version(data, source)
    schema.validate(data, "cell", source)
    missing = [key for key in IDENTITY_KEYS if key not in data]
    if missing:
        raise InputError(source, f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
                         "the top level", "cell.json needs backend, kv_cache_dtype, arch and model")
    values = {key: expect_string(data[key], source, key) for key in IDENTITY_KEYS}
    task = expect_string(data.get("task", DEFAULT_TASK), source, "task")
    for key, known, label in (("backend", backends, "backend"), ("kv_cache_dtype", kv_cache_dtypes, "kv_cache_dtype"),
                              ("arch", archs, "arch")):
        if values[key] not in known:
            raise InputError(source, f"unknown {label} {values[key]!r}", key, unknown_name_hint(values[key], known))
    side = data.get("side", HEAD)
    if side not in SIDES:
        raise InputError(source, f"unknown side {side!r}", "side",
                         f"An A/B run writes side \"{BASE}\" or \"{HEAD}\"; leave it out for a run of one side")
    feature = data.get("feature", "")
    if feature != "":
        feature = expect_string(feature, source, "feature")
        if feature not in features:
            raise InputError(source, f"unknown feature {feature[:60]!r}", "feature",
                             unknown_name_hint(feature, features) if features else
                             "This matrix declares no feature axis (matrix/axes.toml [features]); leave `feature` out "
                             "for a plain cell")
    identity = CellIdentity(task=task, feature=feature, **values)
    extra = {k: v for k, v in data.items() if k not in (*IDENTITY_KEYS, "task", "feature")}
    return identity, extra


def parse_status(text: str, source: str) -> dict[str, StageStatus]:
    """status.json -> {stage: StageStatus}."""
    data = expect_object(loads(text, source), source, "")
    schema.validate(data, "status", source)
    out: dict[str, StageStatus] = {}
    for stage, entry in data.items():
        if stage not in STAGES:
            raise InputError(source, f"unknown stage {stage!r}", "the top level", unknown_name_hint(stage, STAGES))
        entry = expect_object(entry, source, stage)
        if "status" not in entry:
            raise InputError(source, "missing key 'status'", stage, f"Write one of {', '.join(STAGE_STATUSES)}")
        status = entry["status"]
        if status not in STAGE_STATUSES:
            raise InputError(source, f"unknown status {kind(status)}", f"{stage}.status",
                             unknown_name_hint(str(status), STAGE_STATUSES))
        reason, tail = entry.get("reason"), entry.get("log_tail")
        for key, value in (("reason", reason), ("log_tail", tail)):
            if value is not None and not isinstance(value, str):
                raise InputError(source, f"expected a string, got {kind(value)}", f"{stage}.{key}")
        interleaved = entry.get("interleaved")
        if interleaved is not None and not isinstance(interleaved, dict):
            raise InputError(source, f"expected an object, got {kind(interleaved)}", f"{stage}.interleaved")
        kv_cache = parse_kv_cache(entry["kv_cache"], f"{stage}.kv_cache") if stage == "accuracy" and \
            "kv_cache" in entry else long_context_kv_cache(entry) if stage == "long_context" else None
        questions = parse_questions(entry["question_plan"], f"{stage}.question_plan") if stage == "accuracy" and \
            "question_plan" in entry else None
        retries = tuple(f"{r['run']}: {r['reason']}" for r in entry.get("infra_retries", ()))  # the schema checked them
        engines = parse_engines(entry["engines"], source, f"{stage}.engines") if stage == "throughput" and \
            "engines" in entry else None
        model = entry.get("model") if stage == "long_context" else None
        if model is not None and (not isinstance(model, str) or not model):
            raise InputError(source, f"expected a model name, got {kind(model)}", f"{stage}.model",
                             "Write the workload's long_context.model, or leave `model` out (gsm8k's engine answered)")
        rounds = interleaved.get("rounds") if interleaved is not None else None  # the schema checked its type
        out[stage] = StageStatus(status=status, reason=reason, log_tail=tail, interleaved=interleaved is not None,
                                 interleaved_rounds=rounds if isinstance(rounds, int) else None,
                                 kv_cache=kv_cache, questions=questions, elapsed_s=stage_duration(
                                     entry.get("elapsed_s", entry.get("seconds") if stage == "kernels" else None)),
                                 infra_retries=retries, engines=engines, model=model)
    return out


def long_context_kv_cache(entry: Mapping[str, Any]) -> KvCacheEvidence | None:
    """status.json long_context.engine.kv_cache (1.12): the KV cache of the passkey task's engine of its own, read as
    accuracy.kv_cache is (a malformed value becomes `problem`); None where the entry records none."""
    if "engine" not in entry:
        return None
    engine = entry["engine"]
    if not isinstance(engine, Mapping):
        return KvCacheEvidence(problem=f"long_context.engine: expected an object, got {_describe(engine)}")
    if engine.get("kv_cache") is None:
        return None
    return parse_kv_cache(engine["kv_cache"], "long_context.engine.kv_cache")


def parse_engines(value: Any, source: str, where: str) -> tuple[tuple[int, ...], ...]:
    """throughput.engines (1.9): each engine's repeat numbers; a repeat belongs to one engine only (the schema has
    checked the shapes)."""
    seen: set[int] = set()
    engines = []
    for index, engine in enumerate(value):
        numbers = tuple(engine["repeats"])
        again = sorted(seen.intersection(numbers))
        if again or len(set(numbers)) != len(numbers):
            raise InputError(source, f"repeat {again[0] if again else numbers[0]} is listed twice",
                             f"{where}[{index}].repeats", "Each repeat-N.json belongs to one engine")
        seen.update(numbers)
        engines.append(numbers)
    return tuple(engines)


def stage_duration(value: Any) -> float | None:
    """A status.json entry's `elapsed_s` (a kernels entry written before contract 1.8: `seconds`) as seconds: a figure
    for people (junit.xml's times), never judged, so a value that is not a finite number of seconds (at most a year)
    is left out rather than refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= 366 * 24 * 3600 else None


# accuracy.kv_cache (contract 1.4): bounds far beyond any real engine, so that a hostile value is named, never used
KV_CACHE_MAX_LAYERS = 100_000
KV_CACHE_MAX_TOKENS = 10**15 - 1  # the engine log's figure, at most 15 digits (kvgate.runners.engine.log)
KV_CACHE_MAX_ELEMENT_BYTES = 64
KV_CACHE_MAX_NAMES = 64
KV_CACHE_MAX_SCALES = 1024  # distinct k (or v) scales: one per layer at most
KV_SCALE_MAX = 1e6
_DTYPE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def parse_kv_cache(value: Any, where: str) -> KvCacheEvidence:
    """status.json accuracy.kv_cache -> KvCacheEvidence. Never raises: the evidence is optional and judged by one
    check, so a malformed value becomes `problem` (every fault, each with its key path) and that check errors,
    while the rest of the cell is still read. Keys beyond the eight known ones are ignored (a newer minor)."""
    if not isinstance(value, Mapping):
        return KvCacheEvidence(problem=f"{where}: expected an object, got {_describe(value)}")
    problems: list[str] = []
    fields: dict[str, Any] = {}
    if "layers" in value:
        fields["layers"] = _count(value["layers"], f"{where}.layers", 0, KV_CACHE_MAX_LAYERS, problems)
    for key in ("layer_kv_cache_dtypes", "tensor_dtypes"):
        if key in value:
            fields[key] = _names(value[key], f"{where}.{key}", problems)
    if "element_bytes" in value:
        items = _list(value["element_bytes"], f"{where}.element_bytes", problems)
        fields["element_bytes"] = tuple(
            _count(item, f"{where}.element_bytes[{i}]", 1, KV_CACHE_MAX_ELEMENT_BYTES, problems)
            for i, item in enumerate(items))
    if "tokens" in value:
        fields["tokens"] = _count(value["tokens"], f"{where}.tokens", 1, KV_CACHE_MAX_TOKENS, problems)
    for key in ("k_scales", "v_scales"):  # 1.7
        if key in value:
            items = _list(value[key], f"{where}.{key}", problems, KV_CACHE_MAX_SCALES)
            fields[key] = tuple(_scale(item, f"{where}.{key}[{i}]", problems) for i, item in enumerate(items))
    if "bytes_per_token" in value:  # 1.9
        fields["bytes_per_token"] = _bytes_per_token(value["bytes_per_token"], f"{where}.bytes_per_token", problems)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return KvCacheEvidence(problem="; ".join(problems[:3]) + more)
    return KvCacheEvidence(**fields)


def _scale(value: Any, where: str, problems: list[str]) -> float:
    """A k/v scale: a finite float in (0, KV_SCALE_MAX]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= KV_SCALE_MAX:
        problems.append(f"{where}: expected a scale in (0, {KV_SCALE_MAX:g}], got {_describe(value)}")
        return 0.0
    return float(value)


KV_CACHE_MAX_BYTES_PER_TOKEN = 10**9  # a token's KV cache over all layers: about 10^5 bytes for the largest models


def _bytes_per_token(value: Any, where: str, problems: list[str]) -> float:
    """A KV cache spec's bytes per token: a finite number in (0, KV_CACHE_MAX_BYTES_PER_TOKEN]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= KV_CACHE_MAX_BYTES_PER_TOKEN:
        problems.append(f"{where}: expected a number of bytes in (0, {KV_CACHE_MAX_BYTES_PER_TOKEN:,}], got "
                        f"{_describe(value)}")
        return 0.0
    return float(value)


# accuracy.question_plan (contract 1.6)
QUESTIONS_MAX = 10**7
DESIGNS = ("fixed", "kvgate-gs/1")


def parse_questions(value: Any, where: str) -> QuestionsRecord:
    """status.json accuracy.question_plan -> QuestionsRecord. Never raises: a malformed value becomes `problem` and the
    cell's comparisons error (its questions cannot be held against the policy's plan). Other keys are ignored."""
    if not isinstance(value, Mapping):
        return QuestionsRecord(problem=f"{where}: expected an object, got {_describe(value)}")
    problems: list[str] = []
    design = value.get("design")
    if design not in DESIGNS:
        problems.append(f"{where}.design: expected one of {', '.join(DESIGNS)}, got {_describe(design)}")
    questions = _count(value.get("questions"), f"{where}.questions", 1, QUESTIONS_MAX, problems)
    looks = tuple(_count(item, f"{where}.looks[{i}]", 1, QUESTIONS_MAX, problems)
                  for i, item in enumerate(_list(value.get("looks"), f"{where}.looks", problems)))
    if looks and (list(looks) != sorted(set(looks)) or looks[-1] != questions):
        problems.append(f"{where}.looks: expected increasing numbers of questions ending at questions "
                        f"({questions}), got {list(looks)[:8]}")
    answered = _count(value.get("answered"), f"{where}.answered", 0, QUESTIONS_MAX, problems)
    if answered > questions:
        problems.append(f"{where}.answered: {answered} is more than questions ({questions})")
    seconds = value.get("seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not 0 <= seconds < 10**9):
        problems.append(f"{where}.seconds: expected a number of seconds, got {_describe(seconds)}")
        seconds = None
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return QuestionsRecord(problem="; ".join(problems[:3]) + more)
    return QuestionsRecord(design=design, questions=questions, looks=looks, answered=answered,
                           seconds=float(seconds) if seconds is not None else None)


def _list(value: Any, where: str, problems: list[str], limit: int = KV_CACHE_MAX_NAMES) -> list[Any]:
    if not isinstance(value, list):
        problems.append(f"{where}: expected a list, got {_describe(value)}")
        return []
    if len(value) > limit:
        problems.append(f"{where}: {len(value)} entries, more than {limit}")
        return []
    return value


def _names(value: Any, where: str, problems: list[str]) -> tuple[str, ...]:
    names = []
    for index, item in enumerate(_list(value, where, problems)):
        if isinstance(item, str) and _DTYPE_NAME.fullmatch(item):
            names.append(item)
        else:
            problems.append(f"{where}[{index}]: expected a dtype name (letters, digits, _ . : -; at most 64), got "
                            f"{_describe(item)}")
    return tuple(names)


def _count(value: Any, where: str, low: int, high: int, problems: list[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        problems.append(f"{where}: expected a whole number from {low:,} to {high:,}, got {_describe(value)}")
        return 0
    return value


def _describe(value: Any) -> str:
    """A value in an error message, short and printable whatever it holds."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return f"an integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits"
    if isinstance(value, str):
        return f"string {value[:40]!r}" + ("…" if len(value) > 40 else "")
    return kind(value)


def parse_run(text: str, source: str) -> dict[str, Any]:
    """run.json: free-form facts about the run (commit, versions, GPU); only its version is checked."""
    data = expect_object(loads(text, source), source, "")
    check_contract_version(data, source)
    schema.validate(data, "run", source)
    return dict(data)


# run.json planned_out (contract 1.5): cells the writing host could not run, each with the reason
PLANNED_OUT_MAX = 10_000
CELL_ID = re.compile(r"[a-z0-9_]{1,64}-[a-z0-9_]{1,32}-[a-z0-9]{1,16}(-[a-z][a-z0-9_]{0,39})?")  # 1.11: a feature's


def parse_planned_out(run_info: Mapping[str, Any], source: str) -> list[tuple[str, str]]:
    """(cell id, reason) of every run.json `planned_out` entry, its invocations' included; InputError naming the
    place for a malformed one (the whole run is unusable: it cannot say what it left out)."""
    found: dict[str, str] = {}
    lists = [("planned_out", run_info.get("planned_out"))]
    invocations = run_info.get("invocations")
    if isinstance(invocations, list):
        lists += [(f"invocations[{i}].planned_out", item.get("planned_out")) for i, item in enumerate(invocations)
                  if isinstance(item, Mapping)]
    for where, entries in lists:
        if entries is None:
            continue
        if not isinstance(entries, list) or len(entries) > PLANNED_OUT_MAX:
            raise InputError(source, f"expected a list of at most {PLANNED_OUT_MAX:,} entries, got {_describe(entries)}",
                             where, "Write [{\"cell\": \"<id>\", \"reason\": \"...\"}, ...], or leave it out")
        for index, entry in enumerate(entries):
            at = f"{where}[{index}]"
            if not isinstance(entry, Mapping):
                raise InputError(source, f"expected an object, got {_describe(entry)}", at)
            cell, reason = entry.get("cell"), entry.get("reason")
            if not isinstance(cell, str) or not CELL_ID.fullmatch(cell):
                raise InputError(source, f"expected a cell id, got {_describe(cell)}", f"{at}.cell")
            if not isinstance(reason, str) or not reason.strip() or len(reason) > 2000:
                raise InputError(source, f"expected a reason (a string of 1-2000 characters), got {_describe(reason)}",
                                 f"{at}.reason")
            found.setdefault(cell, " ".join(reason.split()))
    return list(found.items())


def parse_stage_plan(run_info: Mapping[str, Any], source: str) -> tuple[dict[str, set[str]], dict[str, dict[str, str]]]:
    """(cell id -> the stages planned for it, cell id -> {stage: why it was not planned}) from run.json: each
    invocation's `planned_stages` (contract 1.5), else its `cells` x `stages`. A stage planned is a stage required;
    the accuracy stage brings its probe. InputError naming the place for a malformed entry."""
    records = [("", run_info)]
    invocations = run_info.get("invocations")
    if isinstance(invocations, list):
        records += [(f"invocations[{i}].", item) for i, item in enumerate(invocations) if isinstance(item, Mapping)]
    planned: dict[str, set[str]] = {}
    reasons: dict[str, dict[str, str]] = {}
    for prefix, record in records:
        per_cell = record.get("planned_stages")
        if per_cell is not None:
            if not isinstance(per_cell, Mapping):
                raise InputError(source, f"expected an object of cell id -> [stages], got {_describe(per_cell)}",
                                 f"{prefix}planned_stages")
            for cell, stages in per_cell.items():
                where = f"{prefix}planned_stages.{str(cell)[:60]}"
                if not isinstance(cell, str) or not CELL_ID.fullmatch(cell):
                    raise InputError(source, "expected a cell id as the key", where)
                planned.setdefault(cell, set()).update(_stage_names(stages, source, where))
        else:
            cells, stages = record.get("cells"), record.get("stages")
            if isinstance(cells, list) and isinstance(stages, list):
                known = [s for s in stages if s in STAGES]
                for cell in cells:
                    if isinstance(cell, str):
                        planned.setdefault(cell, set()).update(known)
        not_planned = record.get("not_planned")
        if not_planned is not None:
            if not isinstance(not_planned, Mapping):
                raise InputError(source, f"expected an object of cell id -> {{stage: reason}}, got "
                                         f"{_describe(not_planned)}", f"{prefix}not_planned")
            for cell, entry in not_planned.items():
                where = f"{prefix}not_planned.{str(cell)[:60]}"
                if not isinstance(entry, Mapping) or not all(
                        stage in STAGES and isinstance(reason, str) and 0 < len(reason) <= 2000
                        for stage, reason in entry.items()):
                    raise InputError(source, "expected {stage: reason} with known stages and reasons of 1-2000 "
                                             "characters", where)
                reasons.setdefault(str(cell), {}).update(entry)
    for stages in planned.values():
        if "accuracy" in stages:
            stages.add("probe")
    return planned, reasons


def _stage_names(value: Any, source: str, where: str) -> set[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v in STAGES for v in value):
        raise InputError(source, f"expected a list of stages ({', '.join(STAGES)}), got {_describe(value)}", where)
    return set(value)
