"""The logprob-agreement probe: the fast first signal of a broken KV-cache path.

Per cell, a fixed set of prompts runs greedy through the engine with prompt logprobs and top-k logprobs
(`collect`), saved as `probe/probe.json` in the cell folder (`write`). Comparing an FP8 cell's record with
the `auto` cell's (`compare`) gives how far the prompt logprobs moved, how often greedy decoding picks the
same tokens, and how often the most likely next token agrees. A broken path shows within seconds, long
before gsm8k accuracy can tell 0.65 from 0.64.

The file format is kvgate's own, versioned: {"format": "kvgate-probe", "version": 1, "settings": {...},
"engine": {...}, "prompts": [{"prompt", "prompt_token_ids", "prompt_logprobs", "prompt_top",
"generated_token_ids", "generated_logprobs", "generated_top", "generated_text"}, ...]}. Position i of
`prompt_logprobs` is the logprob of prompt token i given the tokens before it (null for the first token);
`*_top` hold the top-k [token id, logprob] pairs at each position, most likely first. Non-finite logprobs
(a broken kernel can give NaN) are written as the strings "nan", "inf", "-inf", so the file stays JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate import InputError

FORMAT = "kvgate-probe"
VERSION = 1
FILE_NAME = "probe.json"

# Fixed prompts: gsm8k-style problems and plain prose, 30-120 tokens each with the tiny models' tokenizer.
PROMPTS: tuple[str, ...] = (
    "Question: Maria buys 5 notebooks for $3 each and 2 pens for $4 each. How much does she spend?\nAnswer:",
    "Question: A train travels at 60 miles per hour for 3 hours. How far does it travel?\nAnswer:",
    "Question: Leo has 48 marbles. He gives 1/4 of them to his sister. How many marbles does he have left?\n"
    "Answer: He gives away 48/4 = <<48/4=12>>12 marbles.\n",
    "Question: A baker bakes 6 trays of 24 cookies and packs them in boxes of 8. How many boxes does she fill?"
    "\nAnswer:",
    "Question: Tina is 12 years old. Her mother is 3 times as old as Tina. How old will her mother be in 5 "
    "years?\nAnswer: Her mother is 12*3 = <<12*3=36>>36 years old.\n",
    "Question: A shirt costs $40 and is 25% off. How much do 3 shirts cost?\nAnswer:",
    "Question: There are 30 students in a class. 2/5 of them are girls. How many boys are there?\nAnswer:",
    "Question: Omar earns $15 an hour and works 8 hours a day for 5 days. How much does he earn?\nAnswer: He "
    "earns 15*8 = <<15*8=120>>120 dollars a day.\nHe earns 120*5 = <<120*5=600>>600 dollars.\n#### 600\n\n"
    "Question: A bus has 25 passengers. 7 get off and 4 get on. How many are on the bus?\nAnswer:",
    "The farmer plants ten rows of corn with fifteen plants in each row. A quarter of the plants die, and",
    "First, we find the cost of the apples. Next, we add the cost of the pears. Then we subtract",
    "There are sixty minutes in an hour, twenty-four hours in a day and seven days in a week, so a week has",
    "The teacher gives each student three pencils. The school has six classrooms with twenty-five desks in",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "<<2+3=5>>5 <<10-4=6>>6 <<6*7=42>>42 <<48/2=24>>24 <<100*20/100=20>>20 <<(3+4)*5=35>>35",
    "Question: Priya saves $12 every week for 6 weeks and her aunt gives her $10. A bike costs $149. How much "
    "more does she need?\nAnswer: Priya saves 12*6 = <<12*6=72>>72 dollars.\nWith the gift she has",
    "Question: Sam scored 80, 90 and 75 on three tests. What does he need on the fourth test to average 85?"
    "\nAnswer: An average of 85 over 4 tests needs 85*4 = <<85*4=340>>340 points.\n",
)


# ---- records ----------------------------------------------------------------------------------------

TopList = tuple[tuple[int, float], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class PromptProbe:
    prompt: str
    prompt_token_ids: tuple[int, ...]
    prompt_logprobs: tuple[float | None, ...]  # logprob of the actual token; None for the first position
    prompt_top: tuple[TopList | None, ...]
    generated_token_ids: tuple[int, ...]
    generated_logprobs: tuple[float, ...]
    generated_top: tuple[TopList, ...]
    generated_text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeRecord:
    source: str  # the file it was read from, or "<memory>"
    settings: dict[str, Any]
    engine: dict[str, Any]
    prompts: tuple[PromptProbe, ...]


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
            "mean_abs_logprob_diff": _encode_float(self.mean_abs_logprob_diff),
            "max_abs_logprob_diff": _encode_float(self.max_abs_logprob_diff),
            "top1_agreement": self.top1_agreement,
            "generated_positions": self.generated_positions,
            "greedy_token_match": self.greedy_token_match,
            "greedy_prefix_match": self.greedy_prefix_match,
        }


# ---- collecting (needs vLLM) -----------------------------------------------------------------------


def collect(llm: Any, prompts: Sequence[str] | None = None, max_tokens: int = 64, top_k: int = 5) -> dict:
    """Run the probe prompts greedy through a `vllm.LLM`; returns the JSON-able probe record."""
    from vllm import SamplingParams

    prompts = list(PROMPTS if prompts is None else prompts)
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=top_k, prompt_logprobs=top_k, seed=0,
        ignore_eos=True,
    )
    outputs = llm.generate(prompts, params, use_tqdm=False)
    records = []
    for prompt, output in zip(prompts, outputs, strict=True):
        completion = output.outputs[0]
        token_ids = list(output.prompt_token_ids)
        prompt_positions = list(output.prompt_logprobs or [])
        if len(prompt_positions) != len(token_ids):
            raise RuntimeError(
                f"vLLM returned {len(prompt_positions)} prompt logprob positions for {len(token_ids)} tokens")
        generated_ids = list(completion.token_ids)
        generated_positions = list(completion.logprobs or [])
        if len(generated_positions) != len(generated_ids):
            raise RuntimeError(
                f"vLLM returned {len(generated_positions)} logprob positions for {len(generated_ids)} tokens")
        records.append({
            "prompt": prompt,
            "prompt_token_ids": token_ids,
            "prompt_logprobs": [None] + [_actual(p, t) for p, t in zip(prompt_positions[1:], token_ids[1:],
                                                                        strict=True)],
            "prompt_top": [None] + [_top(p, top_k) for p in prompt_positions[1:]],
            "generated_token_ids": generated_ids,
            "generated_logprobs": [_actual(p, t) for p, t in zip(generated_positions, generated_ids,
                                                                  strict=True)],
            "generated_top": [_top(p, top_k) for p in generated_positions],
            "generated_text": completion.text,
        })
    return {
        "format": FORMAT,
        "version": VERSION,
        "settings": {"max_tokens": max_tokens, "top_k": top_k, "temperature": 0.0, "seed": 0,
                     "ignore_eos": True},
        "engine": _engine_facts(llm),
        "prompts": records,
    }


def _actual(position: dict | None, token_id: int) -> float | str:
    if not position or token_id not in position:
        raise RuntimeError(f"vLLM returned no logprob for token {token_id}")
    return _encode_float(float(position[token_id].logprob))


def _top(position: dict | None, top_k: int) -> list[list]:
    """The top-k [token id, logprob] pairs, most likely first (vLLM also returns the actual token)."""
    if not position:
        raise RuntimeError("vLLM returned no logprobs for a position")
    ranked = sorted(position.items(), key=lambda item: (item[1].rank or math.inf, -item[1].logprob, item[0]))
    return [[token, _encode_float(float(lp.logprob))] for token, lp in ranked[:top_k]]


def _engine_facts(llm: Any) -> dict[str, Any]:
    """What the engine ran with, for the reader of the file (not used by compare)."""
    facts: dict[str, Any] = {}
    try:
        import vllm

        facts["vllm_version"] = vllm.__version__
        config = llm.llm_engine.vllm_config
        facts["model"] = config.model_config.model
        facts["kv_cache_dtype"] = str(config.cache_config.cache_dtype)
        facts["dtype"] = str(config.model_config.dtype)
        facts["enforce_eager"] = bool(config.model_config.enforce_eager)
    except (ImportError, AttributeError):
        pass
    return facts


# ---- the file ---------------------------------------------------------------------------------------


def write(record: dict, folder: Path) -> Path:
    """Write `record` as `folder/probe.json`; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    text = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
    temporary = path.with_name(f".{FILE_NAME}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
    return path


def read(path: Path) -> ProbeRecord:
    """Read and check a probe file; InputError names the file and the place of the first problem."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(source, "no probe file", hint="Did the probe stage run for this cell?") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(source, f"cannot read the probe file ({error})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(source, f"not valid JSON ({error.msg})", f"line {error.lineno} column {error.colno}",
                         "Was the probe interrupted while writing?") from None
    return from_dict(data, source)


def from_dict(data: Any, source: str = "<memory>") -> ProbeRecord:
    """A checked ProbeRecord from the JSON-able dict that `collect` returns or `read` parses."""
    if not isinstance(data, dict):
        raise InputError(source, "expected a JSON object", "the top level")
    if data.get("format") != FORMAT:
        raise InputError(source, f"not a kvgate probe file (format {data.get('format')!r})", "'format'",
                         f"Expected format {FORMAT!r}")
    version = data.get("version")
    if type(version) is not int:
        raise InputError(source, f"version must be a whole number, got {version!r}", "'version'")
    if version > VERSION:
        raise InputError(source, f"probe format version {version} is newer than this kvgate reads ({VERSION})",
                         "'version'", "Upgrade kvgate")
    settings = _field(data, "settings", dict, source, "")
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        raise InputError(source, "expected an object", "'engine'")
    items = _field(data, "prompts", list, source, "")
    if not items:
        raise InputError(source, "no prompts", "'prompts'")
    prompts = tuple(_prompt_from_dict(item, source, f"prompts[{i}]") for i, item in enumerate(items))
    return ProbeRecord(source=source, settings=settings, engine=engine, prompts=prompts)


def _field(data: dict, key: str, kind: type, source: str, where: str) -> Any:
    location = f"{where}.{key}" if where else f"'{key}'"
    if key not in data:
        raise InputError(source, f"missing key {key!r}", where or "the top level")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InputError(source, f"expected {_kind_name(kind)}, got {type(value).__name__}", location)
    return value


def _kind_name(kind: type) -> str:
    return {dict: "an object", list: "a list", str: "a string", int: "a whole number"}.get(kind, kind.__name__)


def _token_ids(values: list, source: str, where: str) -> tuple[int, ...]:
    for i, value in enumerate(values):
        if type(value) is not int or value < 0:
            raise InputError(source, f"expected a token id, got {value!r}", f"{where}[{i}]")
    return tuple(values)


def _logprob(value: Any, source: str, where: str) -> float:
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(source, f"expected a logprob, got {value!r}", where)
    return float(value)


def _top_list(value: Any, source: str, where: str) -> TopList:
    if not isinstance(value, list) or not value:
        raise InputError(source, "expected a non-empty list of [token id, logprob] pairs", where)
    pairs = []
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int):
            raise InputError(source, f"expected a [token id, logprob] pair, got {pair!r}", f"{where}[{i}]")
        pairs.append((pair[0], _logprob(pair[1], source, f"{where}[{i}][1]")))
    return tuple(pairs)


def _prompt_from_dict(item: Any, source: str, where: str) -> PromptProbe:
    if not isinstance(item, dict):
        raise InputError(source, "expected an object", where)
    prompt = _field(item, "prompt", str, source, where)
    token_ids = _token_ids(_field(item, "prompt_token_ids", list, source, where), source,
                           f"{where}.prompt_token_ids")
    if not token_ids:
        raise InputError(source, "no prompt tokens", f"{where}.prompt_token_ids")
    logprobs_in = _field(item, "prompt_logprobs", list, source, where)
    top_in = _field(item, "prompt_top", list, source, where)
    for key, values in (("prompt_logprobs", logprobs_in), ("prompt_top", top_in)):
        if len(values) != len(token_ids):
            raise InputError(source, f"{len(values)} positions for {len(token_ids)} prompt tokens",
                             f"{where}.{key}")
        if values[0] is not None:
            raise InputError(source, "the first prompt position has no logprob; expected null",
                             f"{where}.{key}[0]")
    prompt_logprobs = (None, *(
        _logprob(v, source, f"{where}.prompt_logprobs[{i}]") for i, v in enumerate(logprobs_in) if i > 0))
    prompt_top = (None, *(
        _top_list(v, source, f"{where}.prompt_top[{i}]") for i, v in enumerate(top_in) if i > 0))
    generated = _token_ids(_field(item, "generated_token_ids", list, source, where), source,
                           f"{where}.generated_token_ids")
    generated_logprobs_in = _field(item, "generated_logprobs", list, source, where)
    generated_top_in = _field(item, "generated_top", list, source, where)
    for key, values in (("generated_logprobs", generated_logprobs_in), ("generated_top", generated_top_in)):
        if len(values) != len(generated):
            raise InputError(source, f"{len(values)} positions for {len(generated)} generated tokens",
                             f"{where}.{key}")
    text = item.get("generated_text", "")
    if not isinstance(text, str):
        raise InputError(source, f"expected a string, got {type(text).__name__}", f"{where}.generated_text")
    return PromptProbe(
        prompt=prompt,
        prompt_token_ids=token_ids,
        prompt_logprobs=prompt_logprobs,
        prompt_top=prompt_top,
        generated_token_ids=generated,
        generated_logprobs=tuple(_logprob(v, source, f"{where}.generated_logprobs[{i}]")
                                 for i, v in enumerate(generated_logprobs_in)),
        generated_top=tuple(_top_list(v, source, f"{where}.generated_top[{i}]")
                            for i, v in enumerate(generated_top_in)),
        generated_text=text,
    )


def _encode_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


# ---- comparing (pure) -------------------------------------------------------------------------------


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
