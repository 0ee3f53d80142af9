"""How closely an FP8 cell's probe follows the auto cell's on the same prompts (pure).

Reads records of kvgate.results.probe_file; the gate's probe check holds the figures against the policy's
limits. Two families of figures:

- prompt positions: the logprob of each prompt token given the ones before it. On MLA backends these go
  through the prefill path, which computes attention from fresh latents, not from the KV cache, so a decode
  kernel that FP8 breaks cannot move them (seen on the H200: TRITON_MLA fp8 matched auto exactly there);
- decode positions: the generated tokens over the common greedy prefix, where both sides had the same context
  and the same chosen token, so the logprob difference is the cache's doing. These judge the decode path. They
  include the cached-context prompts' (probe_file.CachedContextProbe): their question was prefilled against a
  prefix read back from the cache, the path of a prefix-cache hit and of a chunked prefill's later chunks.

`identical` is true when nothing differs at all (every logprob and token equal): for an FP8 cell that means
the FP8 cache had no measurable effect, i.e. it was probably never used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvgate import InputError
from kvgate.results.probe_file import ProbeRecord, encode_float, from_dict


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeAgreement:
    prompts: int
    prompt_positions: int  # positions scored for logprob difference and top-1 agreement
    mean_abs_logprob_diff: float
    max_abs_logprob_diff: float
    top1_agreement: float  # share of prompt positions whose most likely next token is the same
    generated_positions: int
    greedy_token_match: float  # share of generated positions with the same token at the same index
    greedy_prefix_match: float  # share of generated tokens before the first divergence
    decode_positions: int = 0  # generated positions before the first divergence (same context, same token)
    decode_mean_abs_logprob_diff: float = 0.0
    decode_max_abs_logprob_diff: float = 0.0
    identical: bool = False  # every logprob and every token the same as the reference
    cached_context_prompts: int = 0  # prompts that continued a cached prefix (their generated positions count above)
    cached_tokens: int = 0  # the candidate's prompt tokens served from vLLM's prefix cache, over those prompts
    # decode divergence by the context length a prompt's decoding starts at (every prompt, cached-context and
    # long-context ones included; 1.10): ({"bucket", "prompts", "decode_positions", "decode_mean_abs_logprob_diff",
    # "greedy_prefix_match"}, ...), shortest first
    by_context_length: tuple[dict[str, Any], ...] = ()

    def as_record(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "prompt_positions": self.prompt_positions,
            "mean_abs_logprob_diff": encode_float(self.mean_abs_logprob_diff),
            "max_abs_logprob_diff": encode_float(self.max_abs_logprob_diff),
            "top1_agreement": self.top1_agreement,
            "generated_positions": self.generated_positions,
            "greedy_token_match": self.greedy_token_match,
            "greedy_prefix_match": self.greedy_prefix_match,
            "decode_positions": self.decode_positions,
            "decode_mean_abs_logprob_diff": encode_float(self.decode_mean_abs_logprob_diff),
            "decode_max_abs_logprob_diff": encode_float(self.decode_max_abs_logprob_diff),
            "identical": self.identical,
            "cached_context_prompts": self.cached_context_prompts,
            "cached_tokens": self.cached_tokens,
            "by_context_length": [dict(b) for b in self.by_context_length],
        }



def compare(reference: ProbeRecord | dict, candidate: ProbeRecord | dict) -> ProbeAgreement:
    """How closely `candidate` (e.g. an fp8 cell) follows `reference` (the auto cell) on the same prompts.

    A position where either logprob is not finite counts as an infinite difference (fail closed).
    Refuses (InputError) records of different prompts, tokenizations or generation lengths.
    """
    if isinstance(reference, dict):
        reference = from_dict(reference, "<reference>")
    if isinstance(candidate, dict):
        candidate = from_dict(candidate, "<candidate>")
    _check_comparable(reference, candidate)
    diffs: list[float] = []
    decode: list[float] = []
    top1_same = 0
    generated = matched = prefix = 0
    identical = True
    pairs = [*zip(reference.prompts, candidate.prompts, strict=True),
             *zip(reference.cached_context, candidate.cached_context, strict=True)]
    if len(reference.long_context) != len(candidate.long_context) or any(
            a.prompt_token_ids != b.prompt_token_ids for a, b in zip(reference.long_context, candidate.long_context,
                                                                     strict=False)):
        raise InputError(candidate.source, "the long-context probe prompts differ from the reference's "
                         f"({len(candidate.long_context)} and {len(reference.long_context)} prompts)", "'long_context'",
                         "Run both cells with the same matrix (workloads.toml long_context)")
    buckets: dict[int, list[tuple[int, int, list[float]]]] = {}
    for ref, cand in [*pairs, *zip(reference.long_context, candidate.long_context, strict=True)]:
        same = [a == b for a, b in zip(ref.generated_token_ids, cand.generated_token_ids, strict=False)]
        common = same.index(False) if False in same else len(same)
        length = max(len(ref.generated_token_ids), len(cand.generated_token_ids))
        buckets.setdefault(context_bucket(len(ref.prompt_token_ids)), []).append(
            (length, common, [_abs_diff(ref.generated_logprobs[j], cand.generated_logprobs[j]) for j in range(common)]))
    for ref, cand in pairs:
        for i in range(1, len(getattr(ref, "prompt_logprobs", ()))):  # cached-context prompts have none
            diffs.append(_abs_diff(ref.prompt_logprobs[i], cand.prompt_logprobs[i]))
            top1_same += ref.prompt_top[i][0][0] == cand.prompt_top[i][0][0]
            identical = identical and ref.prompt_top[i] == cand.prompt_top[i]
        length = max(len(ref.generated_token_ids), len(cand.generated_token_ids))
        same = [a == b for a, b in zip(ref.generated_token_ids, cand.generated_token_ids, strict=False)]
        common = same.index(False) if False in same else len(same)
        generated += length
        matched += sum(same)
        prefix += common
        decode += [_abs_diff(ref.generated_logprobs[j], cand.generated_logprobs[j]) for j in range(common)]
        identical = (identical and common == length and ref.generated_top == cand.generated_top)
    identical = identical and all(d == 0.0 for d in diffs) and all(d == 0.0 for d in decode)
    return ProbeAgreement(
        prompts=len(reference.prompts),
        prompt_positions=len(diffs),
        mean_abs_logprob_diff=math.fsum(diffs) / len(diffs) if diffs else 0.0,
        max_abs_logprob_diff=max(diffs, default=0.0),
        top1_agreement=top1_same / len(diffs) if diffs else 1.0,
        generated_positions=generated,
        greedy_token_match=matched / generated if generated else 1.0,
        greedy_prefix_match=prefix / generated if generated else 1.0,
        decode_positions=len(decode),
        decode_mean_abs_logprob_diff=math.fsum(decode) / len(decode) if decode else math.nan,
        decode_max_abs_logprob_diff=max(decode, default=math.nan),
        identical=identical,
        cached_context_prompts=len(candidate.cached_context),
        cached_tokens=sum(p.cached_tokens for p in candidate.cached_context),
        by_context_length=tuple(_bucket_record(bound, rows) for bound, rows in sorted(buckets.items())),
    )


CONTEXT_BUCKETS = (1024, 4096, 8192, 16384, 32768, 65536, 131072)  # upper bounds in tokens


def context_bucket(tokens: int) -> int:
    """The smallest bound of CONTEXT_BUCKETS that holds a context of `tokens` (past the last: the last, doubled)."""
    return next((bound for bound in CONTEXT_BUCKETS if tokens <= bound), 2 * CONTEXT_BUCKETS[-1])


def _bucket_record(bound: int, rows: list[tuple[int, int, list[float]]]) -> dict[str, Any]:
    generated = sum(length for length, _, _ in rows)
    decode = [d for _, _, diffs in rows for d in diffs]
    return {"bucket": f"<={bound // 1024}k", "prompts": len(rows), "decode_positions": len(decode),
            "decode_mean_abs_logprob_diff": encode_float(math.fsum(decode) / len(decode)) if decode else "nan",
            "greedy_prefix_match": sum(common for _, common, _ in rows) / generated if generated else 1.0}


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheConsistency:
    """How one engine's answers to the cached-context prompts followed its own answers to the same prompts prefilled
    fresh (the prefix cache not read): the cached-context path against the plain prefill, in one cell."""

    prompts: int  # cached-context prompts that were served from the cache and prefilled fresh
    generated_positions: int
    greedy_prefix_match: float  # share of generated tokens before cached and fresh first differ
    decode_positions: int
    decode_mean_abs_logprob_diff: float  # over the common greedy prefix; NaN when there is none

    def as_record(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "generated_positions": self.generated_positions,
                "greedy_prefix_match": self.greedy_prefix_match, "decode_positions": self.decode_positions,
                "decode_mean_abs_logprob_diff": encode_float(self.decode_mean_abs_logprob_diff)}


def cache_consistency(record: ProbeRecord | dict) -> CacheConsistency | None:
    """The cached-context prompts that came from the prefix cache and were also prefilled fresh: their cached
    answers against their fresh ones. None when the record holds no such prompt."""
    if isinstance(record, dict):
        record = from_dict(record, "<record>")
    pairs = [p for p in record.cached_context if p.cached_tokens > 0 and p.fresh_generated_token_ids]
    if not pairs:
        return None
    generated = prefix = 0
    decode: list[float] = []
    for p in pairs:
        same = [a == b for a, b in zip(p.fresh_generated_token_ids, p.generated_token_ids, strict=False)]
        common = same.index(False) if False in same else len(same)
        generated += max(len(p.generated_token_ids), len(p.fresh_generated_token_ids))
        prefix += common
        decode += [_abs_diff(p.fresh_generated_logprobs[j], p.generated_logprobs[j]) for j in range(common)]
    return CacheConsistency(prompts=len(pairs), generated_positions=generated,
                            greedy_prefix_match=prefix / generated if generated else 1.0, decode_positions=len(decode),
                            decode_mean_abs_logprob_diff=math.fsum(decode) / len(decode) if decode else math.nan)


def _abs_diff(a: float | None, b: float | None) -> float:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b)


def _check_comparable(reference: ProbeRecord, candidate: ProbeRecord) -> None:
    if len(reference.prompts) != len(candidate.prompts):
        raise InputError(candidate.source, f"{len(candidate.prompts)} prompts, but the reference "
                         f"{reference.source} has {len(reference.prompts)}", "'prompts'",
                         "Probe both cells with the same kvgate version")
    for i, (ref, cand) in enumerate(zip(reference.prompts, candidate.prompts, strict=True)):
        if ref.prompt != cand.prompt:
            raise InputError(candidate.source, f"prompt differs from the reference {reference.source}",
                             f"prompts[{i}].prompt", "Probe both cells with the same kvgate version")
        if ref.prompt_token_ids != cand.prompt_token_ids:
            raise InputError(candidate.source, f"prompt token ids differ from the reference {reference.source}",
                             f"prompts[{i}].prompt_token_ids", "Compare cells of the same model and tokenizer")
    if [p.prompt for p in reference.cached_context] != [p.prompt for p in candidate.cached_context]:
        raise InputError(candidate.source, f"{len(candidate.cached_context)} cached-context prompts that differ from "
                         f"the {len(reference.cached_context)} of the reference {reference.source}",
                         "'cached_context'", "Probe both cells with the same kvgate version")
    for i, (ref, cand) in enumerate(zip(reference.cached_context, candidate.cached_context, strict=True)):
        if ref.prompt_token_ids != cand.prompt_token_ids:
            raise InputError(candidate.source, f"prompt token ids differ from the reference {reference.source}",
                             f"cached_context[{i}].prompt_token_ids", "Compare cells of the same model and tokenizer")
    ref_max, cand_max = reference.settings.get("max_tokens"), candidate.settings.get("max_tokens")
    if ref_max != cand_max:
        raise InputError(candidate.source, f"max_tokens {cand_max} differs from the reference's {ref_max}",
                         "settings.max_tokens", "Probe both cells with the same settings")
