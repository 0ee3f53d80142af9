"""Pairing two lm-eval sample logs question by question (the paired tests need it; anything else is an error)."""

from __future__ import annotations

from kvgate.results.records import AccuracyResult, SampleOutcomes


class PairingError(ValueError):
    """The two sample logs cannot be paired question by question (a failing error of the check, named)."""


def samples(result: AccuracyResult, filter_name: str, who: str) -> SampleOutcomes:
    if not result.samples:
        raise PairingError(f"no per-question sample log in {who} (lm-eval --log_samples): the paired test cannot "
                            "run, and a test on the two means cannot resolve the margin")
    if filter_name not in result.samples:
        raise PairingError(f"{who}'s sample log has no records for filter {filter_name!r}")
    return result.samples[filter_name]


DOC_ID_KEY = "doc_id:"  # kvgate.results.parsers.lm_eval keys a record by doc_hash, else "doc_id:<n>"


def pair(ref: SampleOutcomes, cand: SampleOutcomes, *, reference: str = "reference",
          ordered: bool = False) -> tuple[list[bool], list[bool], list[str]]:
    """Per-question outcomes of both logs on the same questions, in the candidate's order.

    Raises PairingError (the check errors, named) when the logs identify questions differently (mixed join
    keys), hold different questions, or saw different prompts. ordered (a sequential comparison): both logs
    follow one question order and the shorter is a prefix of the longer; the pairs are that prefix."""
    sides = ((f"the {reference}'s", ref), ("this cell's", cand))
    kinds = []
    for who, log in sides:
        by_id = sum(1 for key in log.outcomes if key.startswith(DOC_ID_KEY))
        if 0 < by_id < log.n:
            raise PairingError(f"mixed join keys in {who} sample log: {by_id} records keyed by doc_id, "
                                f"{log.n - by_id} by doc_hash; one log must use one key")
        kinds.append("doc_id" if by_id else "doc_hash")
    if kinds[0] != kinds[1]:
        raise PairingError(f"the {reference}'s sample log identifies questions by {kinds[0]}, this cell's by "
                            f"{kinds[1]}: they cannot be joined")
    if ordered:
        ref_keys, cand_keys = list(ref.outcomes), list(cand.outcomes)
        length = min(len(ref_keys), len(cand_keys))
        if ref_keys[:length] != cand_keys[:length]:
            first = next(i for i, (a, b) in enumerate(zip(ref_keys[:length], cand_keys[:length], strict=True)) if a != b)
            raise PairingError(f"the two sample logs do not follow one question order (a sequential comparison "
                                f"needs it): they differ first at question {first + 1}")
        keys = cand_keys[:length]
    else:
        only_ref = ref.outcomes.keys() - cand.outcomes.keys()
        only_cand = cand.outcomes.keys() - ref.outcomes.keys()
        if only_ref or only_cand:
            common = ref.n - len(only_ref)
            raise PairingError(f"the two sample logs hold different questions: {common} in common, {len(only_ref)} "
                                f"only in the {reference}'s, {len(only_cand)} only in this cell's")
        keys = list(cand.outcomes)
    ref_rows = [ref.outcomes[k] for k in keys]
    cand_rows = [cand.outcomes[k] for k in keys]
    notes = []
    ref_prompts = [row[1] for row in ref_rows]
    cand_prompts = [row[1] for row in cand_rows]
    if ref_prompts != cand_prompts:  # the common case (identical prompts) costs one C-level comparison
        missing = [sum(p is None for p in prompts) for prompts in (ref_prompts, cand_prompts)]
        if any(missing):
            who = f"the {reference}'s" if missing[0] else "this cell's"
            raise PairingError(f"prompt_hash is missing on {max(missing)} of {len(keys)} records of {who} sample "
                                "log while the other has them: the prompts cannot be compared")
        differ = sum(1 for a, b in zip(ref_prompts, cand_prompts, strict=True) if a != b)
        raise PairingError(f"prompt_hash differs on {differ} of {len(keys)} questions: the two runs saw different "
                            "prompts (few-shot examples, chat template or task version)")
    if keys and all(p is None for p in ref_prompts):
        notes.append("no prompt_hash in either sample log: the prompts could not be compared")
    return [row[0] for row in ref_rows], [row[0] for row in cand_rows], notes
