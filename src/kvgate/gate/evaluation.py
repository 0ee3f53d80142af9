"""The gate's evaluation, pure: run results (+ baseline) + policy + waivers + today -> Verdict. No I/O.

One check per (cell, kind[, subject]), each family in its module under kvgate.gate.checks:
    health      kernels (any failed or errored test fails it; none run fails it), accuracy (the stage ran and
                parsed), and every stage's health: a requested stage that is missing, error or timeout fails
    accuracy    accuracy_floor (an auto cell against its workload's expected accuracy), fp8_accuracy (FP8 vs the
                auto cell: the margin test on the policy's primary filter, the other filters reported as info),
                baseline_accuracy (a cell vs its baseline or the A/B run's base side)
    throughput  throughput (with a baseline, the margin test of current/baseline req/s), fp8_throughput (judged
                only where the policy declares an expectation)
    probe       logprob agreement of an FP8 cell with its auto cell
    kv_cache    fp8_kv_cache: the FP8 cell's engine really held an FP8 cache
Here, about the run as a whole: cell (a planned cell or a baseline cell absent from the run, or a cell whose folder
disagrees with what the matrix and the policy decide: kvgate.gate.trusted), host (a cell the
run's host could not run: NEUTRAL, missing under require_baseline), baseline (the run was compared with nothing).

Comparisons are one-sided tests of "within the margin" (kvgate.statistics.margins), each at the policy's alpha; the
policy's multiplicity method (none by default, see matrix/policy.toml) adjusts the p-values of each family before
deciding. A check covered by a live waiver reads WAIVED whatever it measured; an expired waiver does not apply.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvgate.gate import probe_agreement
from kvgate.gate import trusted as trusted_module
from kvgate.gate.checks.accuracy import (
    accuracy_floor_check,
    baseline_accuracy_checks,
    cell_plans,
    fp8_accuracy_checks,
)
from kvgate.gate.checks.health import accuracy_check, kernels_check
from kvgate.gate.checks.kv_cache import fp8_kv_cache_check
from kvgate.gate.checks.long_context import baseline_long_context_checks, fp8_long_context_checks
from kvgate.gate.checks.pending import Pending, decide
from kvgate.gate.checks.probe import probe_ab_check, probe_check
from kvgate.gate.checks.throughput import fp8_throughput_check, throughput_check
from kvgate.gate.checks.waivers import WaiverLookup, apply_waiver
from kvgate.gate.policy import Policy
from kvgate.gate.trusted import TrustedCell
from kvgate.gate.verdict import Check, Verdict
from kvgate.results.records import BASE, HEAD, RunResults, contract_version_tuple
from kvgate.statistics import margins

# A cell whose outputs are wrong (one of these failed or errored): its speed is not evidence of anything
OUTPUT_KINDS = ("accuracy", "fp8_accuracy", "baseline_accuracy", "accuracy_floor", "fp8_kv_cache", "probe", "probe_ab",
                "fp8_long_context", "baseline_long_context")
KIND_ORDER = ("baseline", "contract", "host", "cell", "kernels", "accuracy", "fp8_kv_cache", "accuracy_floor",
              "fp8_accuracy", "baseline_accuracy", "fp8_long_context", "baseline_long_context", "throughput",
              "fp8_throughput", "probe", "probe_ab")


def evaluate(run: RunResults, *, policy: Policy, baseline: RunResults | None = None,
             waiver_for: WaiverLookup | None = None, today: dt.date, require: Sequence[str] = (),
             probe_compare: Callable[[Any, Any], Any] | None = probe_agreement.compare, ab: bool = False,
             require_baseline: bool = False, planned: Sequence[tuple[str, str]] = (),
             planned_out: Sequence[tuple[str, str]] = (), planned_stages: Mapping[str, Iterable[str]] | None = None,
             not_planned: Mapping[str, Mapping[str, str]] | None = None,
             trusted: Mapping[str, TrustedCell] | None = None) -> Verdict:
    """The verdict on `run` (its head cells).

    ab: `baseline` is the base side of the same A/B run (same machine, same job): every head cell must have its
    base counterpart, and a missing or failed one fails the comparison. require_baseline: with no baseline at
    all the run fails (a change compared with nothing is not a pass); without it the run is neutral.
    planned: (cell id, side) pairs the run was asked for (run.json, --expect-cells); an absent one fails.
    planned_out: (cell id, reason) of cells the writing host could not run (run.json planned_out).
    planned_stages: cell id -> the stages planned for it (run.json, the CI plan): each is required, so one that ended
    skipped or never ran fails (unless waived). not_planned: cell id -> {stage: why the plan left it out}.
    trusted: the matrix's cells (kvgate.gate.trusted.trusted_cells): a cell of the run, either side, whose folder
    says otherwise than the matrix or the policy is refused, its check `cell` an ERROR naming the field and both
    values, and nothing else of it judged (the CLI always passes them; None only in tests of other checks).
    """
    refused = trusted_module.refusals(run, baseline if ab else None, None if ab else baseline, trusted, policy,
                                      ab=ab, require_baseline=require_baseline) if trusted is not None else []
    run = trusted_module.without(run, refused)
    if ab:
        baseline = trusted_module.without(baseline, refused)
    checks: list[Check] = planned_checks(run, baseline if ab else None, planned, refused)
    checks += refused_checks(refused, ab)
    checks += unreadable_checks(run, baseline, ab)
    checks += planned_out_checks(run, planned_out, require_baseline)
    pending: list[Pending] = []
    if baseline is None:
        checks.append(no_baseline_check(require_baseline))
    checks += contract_checks(run, baseline, require_baseline, policy.oldest_contract)
    for cell in run.cells:
        required = required_stages(cell.identity.id, require, planned_stages or {})
        unplanned = (not_planned or {}).get(cell.identity.id, {})
        checks.append(kernels_check(cell, policy, required, unplanned))
        checks.append(accuracy_check(cell, required, unplanned))
        floor = accuracy_floor_check(cell, policy)
        if floor is not None:
            (pending.append(floor) if isinstance(floor, Pending) else checks.append(floor))
        # the design is the trusted side's: an A/B run pairs its rounds (kvgate.gate.trusted refused a cell whose
        # sides did not interleave them), any other comparison is unpaired, whatever status.json says
        tput_check, tput_pending = throughput_check(cell, baseline, policy, required, ab=ab, interleaved=ab,
                                                    unplanned=unplanned)
        if tput_pending:
            pending.append(tput_pending)
        else:
            checks.append(tput_check)
        checks.append(probe_check(cell, run, policy, required, probe_compare, unplanned))
        plans = cell_plans(cell, policy, compared=ab or require_baseline)
        if cell.identity.is_fp8:
            partner = run.find(cell.identity.with_dtype("auto"))
            for item in [*fp8_accuracy_checks(cell, partner, policy, plans=plans, strict=require_baseline),
                         *fp8_long_context_checks(cell, partner, policy, declared=declared_long_context(
                             trusted, cell), declared_model=declared_long_context_model(trusted, cell))]:
                (pending.append(item) if isinstance(item, Pending) else checks.append(item))
            item = fp8_throughput_check(cell, partner, policy)
            if isinstance(item, Pending):
                pending.append(item)
            elif item is not None:
                checks.append(item)
            checks.append(fp8_kv_cache_check(cell, partner, run, policy))
        if ab and baseline is not None:
            moved = probe_ab_check(cell, run, baseline, policy, probe_compare)
            if moved is not None:
                checks.append(moved)
        if baseline is not None:
            old = baseline.find(cell.identity)
            for item in [*baseline_accuracy_checks(cell, old, policy, ab=ab, plans=plans, strict=require_baseline),
                         *baseline_long_context_checks(cell, old, policy, ab=ab,
                                                       declared=declared_long_context(trusted, cell),
                                                       declared_model=declared_long_context_model(trusted, cell))]:
                (pending.append(item) if isinstance(item, Pending) else checks.append(item))
    if baseline is not None:
        unreadable_here = {u.cell for u in run.unreadable} | {r.cell.identity.id for r in refused}
        for old in baseline.cells:
            if run.find(old.identity) is None and old.identity.id not in unreadable_here:
                checks.append(Check(cell=old.identity.id, kind="cell", status="missing", model=old.identity.model,
                                    reference="baseline",
                                    detail=f"in the baseline ({old.folder}) but not in this run"))
    # Multiplicity: the decisions are margin tests, each at alpha (policy.toml says why no adjustment is needed);
    # a method other than none adjusts the p-values of each family. Sequential comparisons decide by their
    # boundaries (family "sequential") and are never adjusted.
    adjusted_by_id: dict[int, float] = {}
    family_sizes = {}
    for family, method in (("accuracy", policy.accuracy.multiplicity), ("throughput", policy.throughput.multiplicity)):
        members = [p for p in pending if p.family == family and getattr(p.test, "p_value", None) is not None]
        family_sizes[family] = len(members)
        if members:
            adjusted = margins.adjust_p_values([p.test.p_value for p in members], method)
            adjusted_by_id.update({id(p): a for p, a in zip(members, adjusted, strict=True)})
    for item in pending:
        checks.append(decide(item, adjusted_by_id.get(id(item))))
    checks = speed_of_broken_cells(checks)
    if waiver_for is not None:
        identities = {(c.identity.id, c.identity.model): c.identity
                      for results in (baseline, run) if results is not None for c in results.cells}
        checks = [apply_waiver(c, identities.get((c.cell, c.model)), waiver_for, today) for c in checks]
    checks = with_stage_facts(checks, run)
    checks = name_models_where_ids_repeat(checks)
    checks.sort(key=lambda c: (c.cell, KIND_ORDER.index(c.kind), c.subject or ""))
    return Verdict(checks=tuple(checks), run=run.folder, baseline=baseline.folder if baseline else None,
                   today=today.isoformat(), multiplicity={
                       "accuracy": {"method": policy.accuracy.multiplicity, "alpha": policy.accuracy.alpha,
                                    "family_size": family_sizes["accuracy"]},
                       "throughput": {"method": policy.throughput.multiplicity, "alpha": policy.throughput.alpha,
                                      "family_size": family_sizes["throughput"]}},
                   policy=policy_summary(policy), run_info=dict(run.run_info), required_stages=tuple(require))


RUN = "(run)"  # the `cell` of checks about the run as a whole


def planned_checks(run: RunResults, base: RunResults | None, planned: Sequence[tuple[str, str]],
                   refused: Sequence[trusted_module.Refusal] = ()) -> list[Check]:
    """A planned cell that left no folder (a run killed between cells, an artifact lost) fails, named."""
    present = {(c.identity.id, HEAD) for c in run.cells} | {(u.cell, HEAD) for u in run.unreadable}
    present |= {(r.cell.identity.id, r.cell.side) for r in refused}
    if base is not None:
        present |= {(c.identity.id, BASE) for c in base.cells} | {(u.cell, BASE) for u in base.unreadable}
    missing = [(cell, side) for cell, side in dict.fromkeys(planned) if (cell, side) not in present]
    return [Check(cell=cell, kind="cell", status="missing", reference=side if side != HEAD else None,
                  detail=f"planned{' (' + side + ' side)' if side != HEAD else ''} but no folder of this run holds "
                         f"it: the cell never started, or its results were lost on the way to the gate",
                  headline=f"planned{' (' + side + ' side)' if side != HEAD else ''}, but absent from the run")
            for cell, side in missing]


def refused_checks(refused: Sequence[trusted_module.Refusal], ab: bool) -> list[Check]:
    """A cell whose folder disagrees with the matrix or the policy (kvgate.gate.trusted) is that cell's error, naming
    each field with what the folder said and what the trusted side says."""
    checks = []
    for refusal in refused:
        cell = refusal.cell
        what = "; ".join(refusal.problems)
        checks.append(Check(cell=cell.identity.id, kind="cell", status="error", model=cell.identity.model,
                            reference=BASE if ab and cell.side == BASE else None,
                            detail=f"not judged: the results folder disagrees with the trusted side: {what}; a "
                                   "results folder cannot choose what the matrix and the policy decide (rerun the "
                                   "cell with this matrix and policy)",
                            headline=f"disagrees with the trusted side: {refusal.problems[0]}"))
    return checks


def unreadable_checks(run: RunResults, baseline: RunResults | None, ab: bool) -> list[Check]:
    """A cell folder whose cell.json or status.json could not be read (a job killed mid-write) is that cell's error,
    naming the file and what is wrong; the other cells are judged as usual. Those of the base side or the baseline
    too: the comparisons that needed them fail on their own, this says why."""
    checks = []
    for results, reference in ((run, None), (baseline, BASE if ab else "baseline")):
        for cell in results.unreadable if results is not None else ():
            checks.append(Check(cell=cell.cell, kind="cell", status="error", reference=reference,
                                detail=f"unreadable cell folder: {'; '.join(cell.problems)}",
                                headline=f"unreadable: {cell.problems[0]}"))
    return checks


def required_stages(cell_id: str, require: Sequence[str], planned: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """stage -> why the cell must have run it: planned for it (a planned stage is a required stage), or --require."""
    required = {stage: "the gate requires it (--require)" for stage in require}
    required.update({stage: "it was planned for this cell (a planned stage must run)"
                     for stage in planned.get(cell_id, ())})
    return required


def planned_out_checks(run: RunResults, planned_out: Sequence[tuple[str, str]], required: bool) -> list[Check]:
    """Cells the host could not run: NEUTRAL (nothing failed, but they were not tested), or failing when the caller
    requires a complete comparison (CI). A cell that another invocation did run into the same folder is judged as
    usual instead."""
    present = {c.identity.id for c in run.cells}
    out = []
    for cell, reason in planned_out:
        if cell in present:
            continue
        detail = f"not run: the host that made this run could not run it ({reason})"
        if required:
            out.append(Check(cell=cell, kind="host", status="missing", detail=f"{detail}; --require-baseline needs "
                             "every cell run", headline=f"not run on this host: {reason}"))
        else:
            out.append(Check(cell=cell, kind="host", status="not_run", headline=f"not run on this host: {reason}",
                             detail=f"{detail}; the verdict is NEUTRAL (CI passes --require-baseline, which fails it)"))
    return out


def contract_checks(run: RunResults, baseline: RunResults | None, required: bool,
                    oldest: tuple[int, int] = (1, 6)) -> list[Check]:
    """One check per results folder older than the policy's oldest contract (results/oldest_contract: 1.6, the
    first that shows every planned stage ran and every comparison had the policy's questions): failing under
    require_baseline, so relabelling a folder as an older contract cannot buy a green check; else a note."""
    out = []
    for results in (run, baseline):
        if results is None:
            continue
        versions = {}
        for cell in results.cells:
            declared = cell.extra.get("contract_version", results.run_info.get("contract_version"))
            versions[cell.folder] = (1, 0) if declared is None else contract_version_tuple(declared)
        old = sorted(folder for folder, version in versions.items() if version is None or version < oldest)
        if not old:
            continue
        need = ".".join(map(str, oldest))
        shown = ", ".join(old[:3]) + (f" (+{len(old) - 3} more)" if len(old) > 3 else "")
        what = (f"{len(old)} cell folder(s) of {results.folder} predate results contract {need} ({shown}): they "
                "cannot show that every planned stage ran or that the comparisons had the policy's questions")
        if required:
            out.append(Check(cell=RUN, kind="contract", status="error", detail=f"{what}; --require-baseline needs "
                             f"contract {need} or later (rerun with this kvgate)",
                             headline=f"results older than contract {need}"))
        else:
            out.append(Check(cell=RUN, kind="contract", status="info", detail=what))
    return out


def no_baseline_check(required: bool) -> Check:
    what = ("compared with nothing: the run has no base side (kvgate run --base-vllm) and no --baseline was "
            "given, so no check could see a regression that the change itself caused")
    if required:
        return Check(cell=RUN, kind="baseline", status="missing", detail=f"{what}; --require-baseline makes it fail",
                     headline="no baseline: the change was compared with nothing")
    return Check(cell=RUN, kind="baseline", status="not_run",
                 detail=f"{what}; the verdict is NEUTRAL (CI passes --require-baseline, which fails it)")


def declared_long_context(trusted: Mapping[str, TrustedCell] | None, cell: Any) -> tuple[int, ...]:
    """The passkey lengths the matrix's cell runs, which a folder of contract 1.10 or later whose accuracy stage ran
    must hold (none without a trusted side or a declaration; an older folder was written before the task existed)."""
    declared = (trusted or {}).get(cell.identity.id)
    version = contract_version_tuple(cell.extra.get("contract_version", 1))
    if declared is None or version is None or version < LONG_CONTEXT_CONTRACT:
        return ()
    return declared.long_context_lengths


def declared_long_context_model(trusted: Mapping[str, TrustedCell] | None, cell: Any) -> str:
    """The model the matrix says answers the cell's passkey task ("" without a trusted side or a declaration)."""
    declared = (trusted or {}).get(cell.identity.id)
    return declared.long_context_model if declared is not None else ""


LONG_CONTEXT_CONTRACT = (1, 10)  # the contract that added long_context/


KIND_STAGE = {"kernels": "kernels", "accuracy": "accuracy", "fp8_kv_cache": "accuracy", "accuracy_floor": "accuracy",
              "fp8_accuracy": "accuracy", "baseline_accuracy": "accuracy", "throughput": "throughput",
              "fp8_throughput": "throughput", "probe": "probe", "probe_ab": "probe", "fp8_long_context": "long_context",
              "baseline_long_context": "long_context"}  # the stage each kind judges


def with_stage_facts(checks: list[Check], run: RunResults) -> list[Check]:
    """Each check of a cell's stage with what status.json says of that stage beyond its outcome: the seconds it ran
    (`elapsed_s` of the head cell, for junit.xml) and, on either side, the engine starts it made again after an
    infrastructure failure (`infra_retries`, a note: a pass after a retry says so)."""
    seconds: dict[tuple[str, str, str], float] = {}
    retried: dict[tuple[str, str, str], list[str]] = {}
    for cell in run.cells:
        for stage, result in cell.stages.items():
            if result.status is None:
                continue
            key = (cell.identity.id, cell.identity.model, stage)
            if cell.side == HEAD and result.status.elapsed_s is not None:
                seconds[key] = result.status.elapsed_s
            side = "" if cell.side == HEAD else f"{cell.side} side: "
            retried.setdefault(key, []).extend(f"{side}{retry}" for retry in result.status.infra_retries)
    out = []
    for check in checks:
        key = (check.cell, check.model, KIND_STAGE.get(check.kind))
        if key in seconds:
            check = replace(check, seconds=seconds[key])
        if retried.get(key):
            check = replace(check, notes=(*check.notes, f"started again after an infrastructure failure "
                                                        f"({'; '.join(retried[key])})"))
        out.append(check)
    return out


def name_models_where_ids_repeat(checks: list[Check]) -> list[Check]:
    """A cell id names backend, dtype and arch; where one id holds several models, add the model to the name."""
    models: dict[str, set[str]] = {}
    for check in checks:
        models.setdefault(check.cell, set()).add(check.model)
    shared = {cell for cell, names in models.items() if len(names) > 1}
    if not shared:
        return checks
    every_model = {m for cell in shared for m in models[cell]}
    short = {m: m.rstrip("/").rsplit("/", 1)[-1] for m in every_model}
    if len(set(short.values())) < len(short):
        short = {m: m for m in every_model}
    return [replace(c, cell=f"{c.cell} [{short[c.model]}]") if c.cell in shared else c for c in checks]


def policy_summary(policy: Policy) -> dict[str, Any]:
    """The thresholds a verdict was judged with (verdict.json)."""
    acc, tput = policy.accuracy, policy.throughput
    return {"source": policy.source, "fp8_tax_points": acc.fp8_tax_points,
            "fp8_tax_points_by_model": dict(acc.fp8_tax_points_by_model),
            "baseline_margin_points": acc.baseline_margin_points, "accuracy_alpha": acc.alpha,
            "accuracy_multiplicity": acc.multiplicity, "primary_filter": acc.primary_filter,
            "filters": list(acc.filters), "min_n": acc.min_n, "questions": acc.questions,
            "sequential_looks": list(acc.sequential.looks), "throughput_tolerance": tput.tolerance,
            "throughput_alpha": tput.alpha, "throughput_alpha_unpaired": tput.alpha_unpaired,
            "throughput_multiplicity": tput.multiplicity,
            "throughput_metric": tput.metric, "run_to_run_sd": tput.run_to_run_sd, "rounds": tput.rounds,
            "fp8_over_auto": [{"where": e.where, "min_ratio": e.min_ratio, "reason": e.reason}
                              for e in tput.fp8_over_auto],
            "accuracy_floors": [{"workload": f.workload, "model": f.model, "expected": dict(f.expected),
                                 "rtol": f.rtol} for f in policy.floors],
            "kernels_min_executed_tests": policy.kernels.min_executed_tests,
            "oldest_contract": ".".join(map(str, policy.oldest_contract)),
            "probe_ab": {arch: {"growth_max": limits.growth_max,
                                "greedy_prefix_drop_max": limits.greedy_prefix_drop_max, "source": limits.source}
                         for arch, limits in ([("default", policy.probe_ab.default)] if policy.probe_ab.default
                                              else []) + list(policy.probe_ab.by_arch.items())},
            "design_flips_by_model": {model: dict(flips)
                                      for model, flips in policy.accuracy.design_flips_by_model.items()},
            "fp8_kv_cache_min_token_ratio": policy.kv_cache.fp8_min_token_ratio}


def speed_of_broken_cells(checks: list[Check]) -> list[Check]:
    """Throughput counts only for a cell whose outputs are right: a throughput check of a cell whose accuracy, KV cache
    or probe check failed or errored is reported as that broken cell's speed (info), never as a pass; a throughput
    failure stays a failure."""
    broken: dict[tuple[str, str | None], Check] = {}
    for check in checks:
        if check.kind in OUTPUT_KINDS and check.status in ("fail", "error"):
            broken.setdefault((check.cell, check.model), check)
    out = []
    for check in checks:
        cause = broken.get((check.cell, check.model))
        if cause is not None and check.kind in ("throughput", "fp8_throughput") and check.status in ("pass", "info"):
            why = f"the speed of a broken cell: its {cause.kind} check {'failed' if cause.status == 'fail' else 'errored'}"
            check = replace(check, status="info", detail=f"{why}; {check.detail}", headline=why,
                            notes=(*check.notes, "throughput counts only for a cell whose outputs are right"))
        out.append(check)
    return out
