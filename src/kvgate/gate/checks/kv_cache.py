"""fp8_kv_cache: was an FP8 cell's KV cache FP8? The accuracy stage's engine evidence (status.json accuracy.kv_cache)."""

from __future__ import annotations

from typing import Any

from kvgate.gate.policy import Policy
from kvgate.gate.verdict import Check
from kvgate.results.records import (
    KV_CACHE_EVIDENCE_SINCE,
    CellResults,
    KvCacheEvidence,
    RunResults,
    contract_version_tuple,
)

BYTES_PER_TOKEN_SINCE = (1, 9)  # from this contract version on, the evidence holds the KV cache spec's bytes per token
# from this contract version on, a long_context entry that names the model of its own engine records that engine's
# KV cache (status.json long_context.engine.kv_cache)
LONG_CONTEXT_ENGINE_EVIDENCE_SINCE = (1, 14)


def fp8_kv_cache_check(cell: CellResults, partner: CellResults | None, run: RunResults, policy: Policy) -> Check:
    """Was the FP8 cell's KV cache FP8? The accuracy stage's evidence (status.json accuracy.kv_cache): the cache
    tensors' element size (1 byte; 2 means the FP8 setting was ignored), the layers' cache dtype (an FP8 one), and
    the bytes a token takes in the engine's KV cache spec against the auto cell's (an FP8 cache holds about twice
    the tokens in a byte; fewer than the policy's ratio fails). The KV cache's size in tokens is reported, never
    judged: it is what the free memory at engine start allowed (on a GPU other engines share, a fraction). Without
    evidence: an error for results of contract 1.4 on (their writers must record it), not judged for older ones; a
    writer of 1.9 on must record the bytes per token. Where the passkey task ran in an engine of its own model
    (status.json long_context.model, 1.12), that engine's KV cache is judged the same way (long_context.engine
    .kv_cache, against the auto cell's passkey engine): an FP8 cell whose second engine ignored FP8 would otherwise
    pass its passkey comparisons on a 16-bit cache."""
    base = dict(cell=cell.identity.id, kind="fp8_kv_cache", model=cell.identity.model, reference="auto cell")
    dtype = cell.identity.kv_cache_dtype
    own = cell.stage("accuracy")
    if own.health != "ok":
        return Check(**base, status="not_run", detail=f"the accuracy stage is {own.health.replace('_', ' ')}: no "
                                                      "engine evidence to judge (the accuracy checks judge that stage)")
    source = f"{cell.folder}/status.json accuracy.kv_cache"
    evidence = own.status.kv_cache if own.status is not None else None
    if evidence is not None and evidence.problem:
        what = f"unreadable KV cache evidence: {evidence.problem}"
        return Check(**base, status="error", detail=f"{what} ({cell.folder}/status.json)", headline=what)
    minimum = policy.kv_cache.fp8_min_token_ratio
    threshold = {"element_bytes": 1, "min_token_ratio": minimum}
    threshold_text = f"1-byte elements, an FP8 layer dtype, ≥ {minimum:g}x auto's tokens a byte (KV cache spec)"
    evidence = evidence or KvCacheEvidence()
    figures: dict[str, Any] = {"layers": evidence.layers, "layer_kv_cache_dtypes": list(evidence.layer_kv_cache_dtypes),
                               "tensor_dtypes": list(evidence.tensor_dtypes),
                               "element_bytes": list(evidence.element_bytes), "tokens": evidence.tokens,
                               "bytes_per_token": evidence.bytes_per_token}
    broken: list[str] = []
    notes: list[str] = []
    tensors = f" ({', '.join(evidence.tensor_dtypes)})" if evidence.tensor_dtypes else ""
    broken += _not_fp8(evidence, dtype, tensors)
    scales_text = _checkpoint_scales(cell, evidence, figures, threshold, broken)
    version = _contract_version(cell, run)
    if evidence.bytes_per_token is None and version is not None and version >= BYTES_PER_TOKEN_SINCE:
        broken.append("accuracy.kv_cache records no bytes_per_token (the engine's KV cache spec; a writer of "
                      f"contract {'.'.join(map(str, BYTES_PER_TOKEN_SINCE))} records it)")
    # the layout against the auto cell's: judged where both engines said their KV cache spec
    layout_text, compared, problem = "", False, ""
    auto = partner.stage("accuracy") if partner is not None else None
    auto_evidence = auto.status.kv_cache if auto is not None and auto.health == "ok" and auto.status else None
    if auto_evidence is not None and auto_evidence.problem:
        problem = (f"the auto cell's KV cache evidence is unreadable: {auto_evidence.problem} "
                   f"({partner.folder}/status.json)")
    elif evidence.bytes_per_token is not None and auto_evidence is not None and auto_evidence.bytes_per_token:
        ratio = auto_evidence.bytes_per_token / evidence.bytes_per_token
        figures.update({"auto_bytes_per_token": auto_evidence.bytes_per_token, "bytes_ratio": ratio})
        compared = True
        layout_text = (f"{evidence.bytes_per_token:,.6g} bytes a token in the KV cache spec, {ratio:.2f}x fewer "
                       f"than the auto cell's {auto_evidence.bytes_per_token:,.6g}")
        if ratio < minimum:
            broken.append(f"{evidence.bytes_per_token:,.6g} bytes a token in the KV cache spec against the auto "
                          f"cell's {auto_evidence.bytes_per_token:,.6g}: {ratio:.2f}x fewer, below {minimum:g}x (an "
                          "FP8 cache takes about half the bytes)")
    else:
        why = ("no auto cell of the same backend, arch and model in this run" if partner is None else
               f"the auto cell's accuracy stage is {auto.health.replace('_', ' ')}" if auto.health != "ok" else
               "the auto cell recorded no bytes_per_token" if evidence.bytes_per_token is not None else
               "this cell recorded no bytes_per_token")
        notes.append(f"KV cache layout not compared with the auto cell's: {why}")
        if evidence.bytes_per_token is not None:
            layout_text = f"{evidence.bytes_per_token:,.6g} bytes a token in the KV cache spec"
    long_text, long_problem = _long_context_engine(cell, partner, version, minimum, figures, broken, notes)
    problem = problem or long_problem
    if auto_evidence is not None and not auto_evidence.problem:
        figures["auto_element_bytes"] = list(auto_evidence.element_bytes)
    if evidence.tokens is not None:
        size = f"KV cache size {evidence.tokens:,} tokens"
        if auto_evidence is not None and auto_evidence.tokens:
            figures.update({"auto_tokens": auto_evidence.tokens, "token_ratio": evidence.tokens / auto_evidence.tokens})
            size += f" = {evidence.tokens / auto_evidence.tokens:.2f}x the auto cell's ({auto_evidence.tokens:,})"
        notes.append(f"{size}: reported, not judged (the size is what the free memory at engine start allowed)")
    if broken:
        return Check(**base, status="fail", figures=figures, threshold=threshold, threshold_text=threshold_text,
                     notes=tuple(notes), detail="; ".join(broken) + f" ({source})", headline="; ".join(broken))
    if problem:
        return Check(**base, status="error", figures=figures, threshold=threshold, threshold_text=threshold_text,
                     detail=problem, headline=problem)
    if not evidence.has_layer_facts and not compared:
        declared = cell.extra.get("contract_version", run.run_info.get("contract_version"))
        lacking = ("accuracy has no kv_cache" if own.status is None or own.status.kv_cache is None else
                   "accuracy.kv_cache has no element_bytes or layer_kv_cache_dtypes, and no bytes_per_token to "
                   "compare with the auto cell's")
        since = ".".join(map(str, KV_CACHE_EVIDENCE_SINCE))
        if version is not None and version < KV_CACHE_EVIDENCE_SINCE:
            shown = "no contract_version (1)" if declared is None else f"contract {declared}"
            return Check(**base, status="not_run", figures=figures, notes=tuple(notes),
                         detail=f"not judged: the results predate the KV cache evidence ({shown}, before {since}; "
                                f"{cell.folder}/status.json {lacking})")
        what = "no evidence the KV cache was FP8"
        return Check(**base, status="error", figures=figures, threshold=threshold, threshold_text=threshold_text,
                     notes=tuple(notes), headline=f"{what}: status.json {lacking}",
                     detail=f"{what}: {cell.folder}/status.json {lacking}; from contract {since} on the accuracy "
                            "stage must record it")
    parts = []
    if evidence.element_bytes:
        parts.append(f"1-byte cache elements{tensors}")
    elif evidence.layer_kv_cache_dtypes:
        notes.append("the cache tensors' element size was not recorded")
    if layout_text:
        parts.append(layout_text)
    if evidence.layer_kv_cache_dtypes:
        layers = f"{evidence.layers} layers" if evidence.layers is not None else "layers"
        parts.append(f"{layers} built for {', '.join(evidence.layer_kv_cache_dtypes)}")
    if scales_text:
        parts.append(scales_text)
    if long_text:
        parts.append(long_text)
    return Check(**base, status="pass", figures=figures, threshold=threshold, threshold_text=threshold_text,
                 notes=tuple(notes), detail=", ".join(parts))


def _long_context_engine(cell: CellResults, partner: CellResults | None, version: tuple[int, int] | None,
                         minimum: float, figures: dict[str, Any], broken: list[str], notes: list[str]
                         ) -> tuple[str, str]:
    """The passkey task's engine of its own (status.json long_context.model, 1.12), judged as the accuracy stage's
    engine is: 1-byte cache elements, layers built for an FP8 dtype, and about half the bytes a token of the auto
    cell's passkey engine. What fails goes to `broken`; returns (the text for a pass, why it errors: unreadable
    evidence, or none from a writer of 1.14 on)."""
    stage = cell.stage("long_context")
    if stage.health != "ok" or stage.status is None or stage.status.model is None:
        return "", ""  # gsm8k's engine answered it (judged above), or it did not run (the long-context checks say so)
    label = f"the passkey task's engine ({stage.status.model})"
    where = f"{cell.folder}/status.json long_context.engine.kv_cache"
    evidence = stage.status.kv_cache
    if evidence is not None and evidence.problem:
        return "", f"unreadable KV cache evidence of {label}: {evidence.problem} ({cell.folder}/status.json)"
    if evidence is None or not evidence.has_layer_facts:
        if version is not None and version >= LONG_CONTEXT_ENGINE_EVIDENCE_SINCE:
            since = ".".join(map(str, LONG_CONTEXT_ENGINE_EVIDENCE_SINCE))
            return "", (f"no evidence {label} held an FP8 KV cache: {where} records no element_bytes or "
                        f"layer_kv_cache_dtypes; from contract {since} on a runner whose passkey task has an engine "
                        "of its own must record it")
        notes.append(f"{label} recorded no KV cache evidence ({where}; contract before 1.14): not judged")
        return "", ""
    dtype = cell.identity.kv_cache_dtype
    figures["long_context_engine"] = {"model": stage.status.model, "layers": evidence.layers,
                                      "layer_kv_cache_dtypes": list(evidence.layer_kv_cache_dtypes),
                                      "element_bytes": list(evidence.element_bytes),
                                      "bytes_per_token": evidence.bytes_per_token}
    failed_before = len(broken)
    broken += [f"{label}: {fault} ({where})" for fault in _not_fp8(evidence, dtype)]
    auto = partner.stage("long_context") if partner is not None else None
    auto_evidence = auto.status.kv_cache if auto is not None and auto.health == "ok" and auto.status is not None \
        and auto.status.model == stage.status.model else None
    compared = ""
    if evidence.bytes_per_token is not None and auto_evidence is not None and not auto_evidence.problem \
            and auto_evidence.bytes_per_token:
        ratio = auto_evidence.bytes_per_token / evidence.bytes_per_token
        figures["long_context_engine"].update(auto_bytes_per_token=auto_evidence.bytes_per_token, bytes_ratio=ratio)
        compared = f", {ratio:.2f}x fewer bytes a token than the auto cell's ({auto_evidence.bytes_per_token:,.6g})"
        if ratio < minimum:
            broken.append(f"{label}: {evidence.bytes_per_token:,.6g} bytes a token in its KV cache spec against the "
                          f"auto cell's passkey engine's {auto_evidence.bytes_per_token:,.6g}: {ratio:.2f}x fewer, "
                          f"below {minimum:g}x ({where})")
    else:
        notes.append(f"{label}: KV cache layout not compared with the auto cell's passkey engine (not recorded by "
                     "both)")
    if len(broken) > failed_before:
        return "", ""
    sizes = "1-byte cache elements, " if evidence.element_bytes else ""
    built = f"layers built for {', '.join(evidence.layer_kv_cache_dtypes)}" if evidence.layer_kv_cache_dtypes else ""
    return f"{label}: {sizes}{built}{compared}".rstrip(", "), ""


def _not_fp8(evidence: KvCacheEvidence, dtype: str, tensors: str = "") -> list[str]:
    """What in an engine's KV cache evidence says its FP8 setting was ignored: cache elements of other than 1 byte, or
    attention layers built for a dtype that is not FP8."""
    faults = []
    if evidence.element_bytes and set(evidence.element_bytes) != {1}:
        sizes = "/".join(str(b) for b in evidence.element_bytes)
        faults.append(f"{sizes}-byte cache elements{tensors}: the {dtype} KV cache setting was ignored")
    not_fp8 = [name for name in evidence.layer_kv_cache_dtypes if not is_fp8_name(name)]
    if not_fp8:
        faults.append(f"the attention layers' kv_cache_dtype is {', '.join(not_fp8)}, not an FP8 type")
    return faults


def _contract_version(cell: CellResults, run: RunResults) -> tuple[int, int] | None:
    declared = cell.extra.get("contract_version", run.run_info.get("contract_version"))
    return (1, 0) if declared is None else contract_version_tuple(declared)


def _checkpoint_scales(cell: CellResults, evidence: KvCacheEvidence, figures: dict[str, Any],
                       threshold: dict[str, Any], broken: list[str]) -> str:
    """The k/v scales the layers used; for a cell that was to load them from its checkpoint (cell.json
    `checkpoint_kv_scales`, contract 1.7), every layer at 1.0 means the loader dropped them (fails), and no scales
    recorded at all means no evidence (fails: the writer of 1.7 records them). Returns the text for a pass."""
    if evidence.k_scales or evidence.v_scales:
        figures.update(k_scales=list(evidence.k_scales), v_scales=list(evidence.v_scales))
    if cell.extra.get("checkpoint_kv_scales") is not True:
        return ""
    threshold["checkpoint_kv_scales"] = "loaded (not 1.0)"
    if not (evidence.k_scales or evidence.v_scales):
        broken.append("the cell was to load its checkpoint's k/v scales, but accuracy.kv_cache records no "
                      "k_scales or v_scales (a 1.7 writer records them)")
        return ""
    if set(evidence.k_scales) | set(evidence.v_scales) == {1.0}:
        broken.append("the checkpoint's k/v scales were not loaded: every layer wrote and read its FP8 cache with "
                      "scale 1.0")
        return ""
    def span(values: tuple[float, ...]) -> str:
        return "none" if not values else f"{min(values):.4g}" if len(values) == 1 else \
            f"{min(values):.4g}-{max(values):.4g}"
    return f"k/v scales from the checkpoint (k {span(evidence.k_scales)}, v {span(evidence.v_scales)})"


def is_fp8_name(name: str) -> bool:
    """vLLM's FP8 cache dtype names (fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla, ...) and torch's float8_*."""
    lowered = name.lower()
    return lowered.startswith("fp8") or lowered.startswith("float8")
