"""kvgate's own small files of a results run: cell.json, status.json, run.json (docs/results-folder.md)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from kvgate import InputError, unknown_name_hint
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
               archs: Collection[str]) -> tuple[CellIdentity, dict[str, Any]]:
    """cell.json -> (identity, the other keys). Names are checked against the matrix's axes."""
    data = expect_object(loads(text, source), source, "")
    check_contract_version(data, source)
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
    identity = CellIdentity(task=task, **values)
    extra = {k: v for k, v in data.items() if k not in (*IDENTITY_KEYS, "task")}
    return identity, extra


def parse_status(text: str, source: str) -> dict[str, StageStatus]:
    """status.json -> {stage: StageStatus}."""
    data = expect_object(loads(text, source), source, "")
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
        out[stage] = StageStatus(status=status, reason=reason, log_tail=tail, interleaved=interleaved is not None)
    return out


def parse_run(text: str, source: str) -> dict[str, Any]:
    """run.json: free-form facts about the run (commit, versions, GPU); only its version is checked."""
    data = expect_object(loads(text, source), source, "")
    check_contract_version(data, source)
    return dict(data)
