"""The logprob-agreement probe, engine side: the fast first signal of a broken KV-cache path.

Per cell, a fixed set of prompts runs greedy through the cell's engine (the same `vllm.LLM` lm-eval used)
with prompt logprobs and top-k logprobs (`collect`); the record is written as `probe/probe.json` in the
cell folder in kvgate.results.probe_file's format, and the gate compares an FP8 cell's record with the auto
cell's (kvgate.gate.probe_agreement). A broken path shows within seconds, long before gsm8k accuracy can
tell 0.65 from 0.64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kvgate.results.probe_file import FORMAT, VERSION, encode_float

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

# Prompts that continue a cached prefix: one shared prefix of worked problems (well over two CPU cache blocks of 128
# tokens, dozens of GPU blocks of 16) and a question each. The first is run alone, which computes the prefix and
# leaves it in vLLM's prefix cache; the others then prefill only their question, attending to the prefix *read
# back from the KV cache* (the FP8 cache in an FP8 cell). That is the attention path of a prefix-cache hit and of
# every later chunk of a chunked prefill (a prefill continuing context already in the cache: on MLA backends the
# context path that dequantizes the FP8 latent cache), which plain prompts and 0-shot gsm8k never reach.
CACHED_CONTEXT_PREFIX = (
    "Question: Ava buys 4 packs of 12 pencils and gives 9 pencils to her brother. How many pencils does she keep?\n"
    "Answer: She buys 4*12 = <<4*12=48>>48 pencils.\nShe keeps 48-9 = <<48-9=39>>39 pencils.\n#### 39\n\n"
    "Question: A farmer has 3 fields with 45 cows each. He sells 28 cows. How many cows are left?\n"
    "Answer: He has 3*45 = <<3*45=135>>135 cows.\nAfter selling he has 135-28 = <<135-28=107>>107 cows.\n"
    "#### 107\n\n"
    "Question: Ben reads 18 pages a day for 7 days and then 25 more pages. How many pages does he read?\n"
    "Answer: In 7 days he reads 18*7 = <<18*7=126>>126 pages.\nIn all he reads 126+25 = <<126+25=151>>151 "
    "pages.\n#### 151\n\n"
    "Question: A shop sells 6 boxes of 15 apples and 4 boxes of 20 pears. How many fruits does it sell?\n"
    "Answer: It sells 6*15 = <<6*15=90>>90 apples.\nIt sells 4*20 = <<4*20=80>>80 pears.\nIn all it sells "
    "90+80 = <<90+80=170>>170 fruits.\n#### 170\n\n"
    "Question: Mia earns $14 an hour for 6 hours and spends $37 on a game. How much money does she have left?\n"
    "Answer: She earns 14*6 = <<14*6=84>>84 dollars.\nShe has 84-37 = <<84-37=47>>47 dollars left.\n#### 47\n\n"
    "Question: A school orders 9 crates of 32 bottles and 47 bottles break. How many bottles are whole?\n"
    "Answer: It orders 9*32 = <<9*32=288>>288 bottles.\nWhole bottles: 288-47 = <<288-47=241>>241.\n#### 241\n\n"
)
CACHED_CONTEXT_QUESTIONS: tuple[str, ...] = (
    "Question: A library has 8 shelves of 35 books and lends out 56 books. How many books are on the shelves?\n"
    "Answer:",
    "Question: Noah runs 5 laps of 400 meters each day for 6 days. How many meters does he run?\nAnswer:",
    "Question: A baker makes 7 trays of 18 rolls and sells 99 rolls. How many rolls are left?\nAnswer:",
    "Question: Lily has $250 and buys 3 chairs for $46 each. How much money does she have left?\nAnswer:",
    "Question: A bus carries 42 people on each of 5 trips and 17 people on a sixth trip. How many people ride?\n"
    "Answer:",
    "Question: Tom plants 12 rows of 14 trees and 19 trees die. How many trees are alive?\nAnswer:",
)


def cached_context_prompts() -> list[str]:
    return [CACHED_CONTEXT_PREFIX + question for question in CACHED_CONTEXT_QUESTIONS]


# ---- collecting (needs vLLM) -----------------------------------------------------------------------


def collect(llm: Any, prompts: Sequence[str] | None = None, max_tokens: int = 64, top_k: int = 5,
            long_context: Sequence[str] = ()) -> dict:
    """Run the probe prompts greedy through a `vllm.LLM`; returns the JSON-able probe record. long_context: long
    prompts (the passkey documents of the cell's context lengths), whose decode divergence the gate reports by
    context length."""
    from vllm import SamplingParams

    prompts = list(PROMPTS if prompts is None else prompts)
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=top_k, prompt_logprobs=top_k, seed=0,
        ignore_eos=True,
    )
    outputs = llm.generate(prompts, params, use_tqdm=False)
    records = []
    for prompt, output in zip(prompts, outputs, strict=True):
        token_ids = list(output.prompt_token_ids)
        prompt_positions = list(output.prompt_logprobs or [])
        if len(prompt_positions) != len(token_ids):
            raise RuntimeError(
                f"vLLM returned {len(prompt_positions)} prompt logprob positions for {len(token_ids)} tokens")
        records.append({
            "prompt": prompt,
            "prompt_token_ids": token_ids,
            "prompt_logprobs": [None] + [_actual(p, t) for p, t in zip(prompt_positions[1:], token_ids[1:],
                                                                        strict=True)],
            "prompt_top": [None] + [_top(p, top_k) for p in prompt_positions[1:]],
            **_generated(output, top_k),
        })
    return {
        "format": FORMAT,
        "version": VERSION,
        "settings": {"max_tokens": max_tokens, "top_k": top_k, "temperature": 0.0, "seed": 0,
                     "ignore_eos": True},
        "engine": _engine_facts(llm),
        "prompts": records,
        "cached_context": collect_cached_context(llm, max_tokens=max_tokens, top_k=top_k),
        **({"long_context": collect_long_context(llm, long_context, max_tokens=max_tokens, top_k=top_k)}
           if long_context else {}),
    }


def collect_long_context(llm: Any, prompts: Sequence[str], max_tokens: int = 64, top_k: int = 5) -> list[dict]:
    """Long prompts, greedy, their generated positions only (no prompt logprobs: tens of thousands of positions)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=top_k, seed=0, ignore_eos=True)
    outputs = llm.generate(list(prompts), params, use_tqdm=False)
    return [{"prompt": prompt, "prompt_token_ids": list(output.prompt_token_ids),
             "cached_tokens": int(getattr(output, "num_cached_tokens", None) or 0), **_generated(output, top_k)}
            for prompt, output in zip(prompts, outputs, strict=True)]


def collect_cached_context(llm: Any, max_tokens: int = 64, top_k: int = 5) -> list[dict]:
    """The cached-context prompts: the first alone (it computes the shared prefix), then the rest (they continue
    it from the cache). No prompt logprobs: vLLM serves no cached prefix to a request that asks for them. Each
    record says how many prompt tokens vLLM took from its prefix cache (`cached_tokens`), and holds the same prompt
    prefilled fresh in the same engine (`fresh_*`, the prefix cache not read): a healthy cached-context path gives
    what a fresh prefill gives, up to the cache's own rounding."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=top_k, seed=0, ignore_eos=True)
    prompts = cached_context_prompts()
    outputs = [*llm.generate(prompts[:1], params, use_tqdm=False), *llm.generate(prompts[1:], params, use_tqdm=False)]
    fresh = llm.generate(prompts, _fresh(params, max_tokens, top_k), use_tqdm=False)
    records = []
    for prompt, output, again in zip(prompts, outputs, fresh, strict=True):
        generated = _generated(again, top_k)
        records.append({"prompt": prompt, "prompt_token_ids": list(output.prompt_token_ids),
                        "cached_tokens": int(getattr(output, "num_cached_tokens", None) or 0),
                        **_generated(output, top_k),
                        "fresh_cached_tokens": int(getattr(again, "num_cached_tokens", None) or 0),
                        "fresh_generated_token_ids": generated["generated_token_ids"],
                        "fresh_generated_logprobs": generated["generated_logprobs"]})
    return records


def _fresh(params: Any, max_tokens: int, top_k: int) -> Any:
    """The same sampling, reading nothing from the prefix cache (vLLM's skip_reading_prefix_cache; an older vLLM
    without it skips the cache for any request that asks for prompt logprobs)."""
    from vllm import SamplingParams

    try:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=top_k, seed=0, ignore_eos=True,
                              skip_reading_prefix_cache=True)
    except TypeError:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=top_k, seed=0, ignore_eos=True,
                              prompt_logprobs=0)


def _generated(output: Any, top_k: int) -> dict[str, Any]:
    completion = output.outputs[0]
    generated_ids = list(completion.token_ids)
    generated_positions = list(completion.logprobs or [])
    if len(generated_positions) != len(generated_ids):
        raise RuntimeError(
            f"vLLM returned {len(generated_positions)} logprob positions for {len(generated_ids)} tokens")
    return {
        "generated_token_ids": generated_ids,
        "generated_logprobs": [_actual(p, t) for p, t in zip(generated_positions, generated_ids, strict=True)],
        "generated_top": [_top(p, top_k) for p in generated_positions],
        "generated_text": completion.text,
    }


def _actual(position: dict | None, token_id: int) -> float | str:
    if not position or token_id not in position:
        raise RuntimeError(f"vLLM returned no logprob for token {token_id}")
    return encode_float(float(position[token_id].logprob))


def _top(position: dict | None, top_k: int) -> list[list]:
    """The top-k [token id, logprob] pairs, most likely first (vLLM also returns the actual token)."""
    if not position:
        raise RuntimeError("vLLM returned no logprobs for a position")
    ranked = sorted(position.items(), key=lambda item: (item[1].rank or math.inf, -item[1].logprob, item[0]))
    return [[token, encode_float(float(lp.logprob))] for token, lp in ranked[:top_k]]


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
