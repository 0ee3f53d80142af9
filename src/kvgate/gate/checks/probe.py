"""The probe: an FP8 cell's logprob agreement with its auto cell, against the policy's limits for its dtype and arch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvgate.gate.checks.formatting import fmt
from kvgate.gate.checks.health import health_check
from kvgate.gate.policy import Policy
from kvgate.gate.verdict import Check
from kvgate.results.records import CellIdentity, CellResults, RunResults


def probe_check(cell: CellResults, run: RunResults, policy: Policy, require: Mapping[str, str],
                 probe_compare: Callable[[Any, Any], Any] | None, unplanned: Mapping[str, str] | None = None) -> Check:
    unhealthy = health_check(cell, "probe", "probe", require, unplanned)
    if unhealthy:
        return unhealthy
    base = dict(cell=cell.identity.id, kind="probe", model=cell.identity.model)
    if not cell.identity.is_fp8:
        return Check(**base, status="pass", detail="probe outputs present (the reference for this backend's FP8 cells)")
    partner = run.find(cell.identity.with_dtype("auto"))
    if partner is None or partner.stage("probe").health != "ok":
        why = "no auto cell in this run" if partner is None else f"the auto cell's probe stage: {partner.stage('probe').health}"
        return Check(**base, status="missing", reference="auto cell", detail=f"cannot compare logprobs: {why}")
    if probe_compare is None:
        return Check(**base, status="error", detail="this kvgate cannot compare probe outputs (kvgate.results.probe_file missing)")
    agreement = probe_compare(partner.stage("probe").data, cell.stage("probe").data)
    limits = probe_limits(policy, cell.identity)
    figures = {k: v for k, v in as_mapping(agreement).items() if isinstance(v, (int, float, str))}
    broken = []
    thresholds = policy.probe.thresholds(cell.identity.kv_cache_dtype, cell.identity.arch)
    if thresholds.require_effect and figures.get("identical") is True:
        broken.append(f"no measurable {cell.identity.kv_cache_dtype} effect: every logprob and token equals the auto "
                      "cell's, so the FP8 cache was most likely never used")
    for name, limit in limits.items():
        if name.startswith("max_"):
            key = name[4:]
            value = figures.get(key)
            if value is None or value != value or value > limit:  # NaN: nothing to measure: fails
                broken.append(f"{key} {fmt(value)} > {limit:g}")
        elif name.startswith("min_"):
            key = name[4:]
            value = figures.get(key)
            if value is None or value != value or value < limit:
                broken.append(f"{key} {fmt(value)} < {limit:g}")
    shown = ", ".join(f"{k[4:]} {fmt(figures.get(k[4:]))}" for k in limits) or "no thresholds for this dtype"
    threshold_text = ", ".join(f"{k[4:]} {'≤' if k.startswith('max_') else '≥'} {v:g}" for k, v in limits.items())
    return Check(**base, status="fail" if broken else "pass", reference="auto cell", figures=figures,
                 threshold=dict(limits), threshold_text=threshold_text,
                 detail=("; ".join(broken) if broken else shown) + " vs the auto cell")


def probe_limits(policy: Policy, identity: CellIdentity) -> dict[str, float]:
    limits = policy.probe.thresholds(identity.kv_cache_dtype, identity.arch)
    found = {"max_mean_abs_logprob_diff": limits.mean_abs_logprob_diff_max,
             "max_max_abs_logprob_diff": limits.max_abs_logprob_diff_max,
             "min_top1_agreement": limits.top1_agreement_min,
             "max_decode_mean_abs_logprob_diff": limits.decode_mean_abs_logprob_diff_max,
             "min_greedy_prefix_match": limits.greedy_prefix_match_min}
    return {name: value for name, value in found.items() if value == value}  # NaN: not judged


def as_mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    if hasattr(value, "__dataclass_fields__"):
        return {name: getattr(value, name) for name in value.__dataclass_fields__}
    return dict(vars(value)) if hasattr(value, "__dict__") else {}
