"""How closely an FP8 cell's probe follows the auto cell's on the same prompts (pure).

Reads records of kvgate.results.probe_file; the gate's probe check holds the figures against the policy's
limits.
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
    top1_same = 0
    generated = matched = prefix = 0
    for ref, cand in zip(reference.prompts, candidate.prompts, strict=True):
        for i in range(1, len(ref.prompt_token_ids)):
            diffs.append(_abs_diff(ref.prompt_logprobs[i], cand.prompt_logprobs[i]))
            top1_same += ref.prompt_top[i][0][0] == cand.prompt_top[i][0][0]
        length = max(len(ref.generated_token_ids), len(cand.generated_token_ids))
        same = [a == b for a, b in zip(ref.generated_token_ids, cand.generated_token_ids, strict=False)]
        generated += length
        matched += sum(same)
        prefix += same.index(False) if False in same else len(same)
    return ProbeAgreement(
        prompts=len(reference.prompts),
        prompt_positions=len(diffs),
        mean_abs_logprob_diff=math.fsum(diffs) / len(diffs) if diffs else 0.0,
        max_abs_logprob_diff=max(diffs, default=0.0),
        top1_agreement=top1_same / len(diffs) if diffs else 1.0,
        generated_positions=generated,
        greedy_token_match=matched / generated if generated else 1.0,
        greedy_prefix_match=prefix / generated if generated else 1.0,
    )


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
    ref_max, cand_max = reference.settings.get("max_tokens"), candidate.settings.get("max_tokens")
    if ref_max != cand_max:
        raise InputError(candidate.source, f"max_tokens {cand_max} differs from the reference's {ref_max}",
                         "settings.max_tokens", "Probe both cells with the same settings")
