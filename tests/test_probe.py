"""The logprob-agreement probe: the comparison math on records the tests build, the file format, and one
real-engine run (tiny-llama, auto twice in one engine: must agree exactly)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest

import archives
from kvgate import InputError
from kvgate.gate import probe_agreement
from kvgate.results import probe_file
from kvgate.results.parsers import reading
from kvgate.runners.stages import probe


def make_record(prompts: int = 2, prompt_len: int = 5, generated: int = 4) -> dict:
    """A probe record in the file format, with distinct, predictable values."""
    items = []
    for p in range(prompts):
        ids = [10 * p + i for i in range(prompt_len)]
        items.append({
            "prompt": f"prompt {p}",
            "prompt_token_ids": ids,
            "prompt_logprobs": [None] + [-(0.5 + 0.1 * i) for i in range(1, prompt_len)],
            "prompt_top": [None] + [[[100 + i, -0.2], [200 + i, -2.0]] for i in range(1, prompt_len)],
            "generated_token_ids": [300 + i for i in range(generated)],
            "generated_logprobs": [-0.3] * generated,
            "generated_top": [[[300 + i, -0.3], [400, -1.5]] for i in range(generated)],
            "generated_text": "abcd"[:generated],
        })
    return {"format": "kvgate-probe", "version": 1,
            "settings": {"max_tokens": generated, "top_k": 2, "temperature": 0.0, "seed": 0, "ignore_eos": True},
            "engine": {}, "prompts": items}


def test_identical_records_agree_exactly() -> None:
    agreement = probe_agreement.compare(make_record(), make_record())
    assert agreement.as_record() == {
        "prompts": 2, "prompt_positions": 8, "mean_abs_logprob_diff": 0.0, "max_abs_logprob_diff": 0.0,
        "top1_agreement": 1.0, "generated_positions": 8, "greedy_token_match": 1.0, "greedy_prefix_match": 1.0,
        "decode_positions": 8, "decode_mean_abs_logprob_diff": 0.0, "decode_max_abs_logprob_diff": 0.0,
        "identical": True, "cached_context_prompts": 0, "cached_tokens": 0,
        "by_context_length": [{"bucket": "<=1k", "prompts": 2, "decode_positions": 8,
                               "decode_mean_abs_logprob_diff": 0.0, "greedy_prefix_match": 1.0}],
    }


def with_cached_context(record: dict, cached_tokens: int = 128, logprob: float = -0.3) -> dict:
    """The record plus one cached-context prompt (no prompt logprobs; 4 generated tokens)."""
    record["cached_context"] = [{
        "prompt": "shared prefix + question", "prompt_token_ids": list(range(1, 201)), "cached_tokens": cached_tokens,
        "generated_token_ids": [500, 501, 502, 503], "generated_logprobs": [logprob] * 4,
        "generated_top": [[[500 + i, logprob], [400, -1.5]] for i in range(4)], "generated_text": "wxyz"}]
    return record


def test_cached_context_prompts_count_as_decode_positions_and_say_what_the_cache_served() -> None:
    agreement = probe_agreement.compare(with_cached_context(make_record()),
                                        with_cached_context(make_record(), cached_tokens=192, logprob=-0.9))
    assert agreement.prompt_positions == 8  # no prompt logprobs on the cached-context prompt
    assert (agreement.generated_positions, agreement.decode_positions) == (12, 12)
    assert agreement.decode_max_abs_logprob_diff == pytest.approx(0.6)
    assert agreement.decode_mean_abs_logprob_diff == pytest.approx(0.6 * 4 / 12)
    assert (agreement.cached_context_prompts, agreement.cached_tokens) == (1, 192)
    assert agreement.identical is False


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r.pop("cached_context"), "1 cached-context prompts that differ from the 0 of the reference"),
    (lambda r: r["cached_context"][0].update(cached_tokens=201), "201 cached tokens for a prompt of 200 in "
                                                                 "cached_context[0].cached_tokens"),
    (lambda r: r["cached_context"][0].update(cached_tokens=True), "expected a whole number, got bool"),
    (lambda r: r.update(cached_context={}), "expected a list, got dict in 'cached_context'"),
    (lambda r: r["cached_context"][0]["generated_logprobs"].pop(), "3 positions for 4 generated tokens"),
])
def test_cached_context_that_cannot_be_compared_is_named(edit, message) -> None:
    from kvgate import InputError

    candidate = with_cached_context(make_record())
    edit(candidate)
    reference = with_cached_context(make_record()) if "reference" not in message else make_record()
    if "reference" in message:
        reference, candidate = candidate, with_cached_context(make_record())
    with pytest.raises(InputError, match=re.escape(message)):
        probe_agreement.compare(reference, candidate)


def test_decode_positions_are_judged_over_the_common_greedy_prefix_only() -> None:
    """Generated tokens before the first divergence saw the same context: their logprob difference is the
    cache's doing. After it the contexts differ, so the positions are not compared."""
    reference, candidate = make_record(), make_record()
    first = candidate["prompts"][0]
    first["generated_logprobs"] = [-0.30, -0.25, -0.90, -0.10]  # reference: -0.3 everywhere
    first["generated_token_ids"] = [300, 301, 999, 303]  # diverges at index 2
    agreement = probe_agreement.compare(reference, candidate)
    assert agreement.decode_positions == 2 + 4  # prompt 0: indices 0-1; prompt 1: all 4
    assert agreement.decode_max_abs_logprob_diff == pytest.approx(0.05)
    assert agreement.decode_mean_abs_logprob_diff == pytest.approx(0.05 / 6)
    assert agreement.greedy_prefix_match == 6 / 8
    assert agreement.identical is False


def test_logprob_differences_top1_and_greedy_match() -> None:
    reference, candidate = make_record(), make_record()
    for item in candidate["prompts"]:
        item["prompt_logprobs"] = [None] + [v - 0.1 for v in item["prompt_logprobs"][1:]]
    candidate["prompts"][0]["prompt_logprobs"][2] -= 0.4  # one position moves 0.5 in all
    candidate["prompts"][1]["prompt_top"][3] = [[999, -0.1], [103, -0.3]]  # 1 of 8 argmaxes differs
    candidate["prompts"][0]["generated_token_ids"] = [300, 301, 999, 303]  # diverges at index 2, rejoins
    candidate["prompts"][1]["generated_token_ids"] = [999, 301, 302, 303]  # diverges at once
    agreement = probe_agreement.compare(reference, candidate)
    assert agreement.mean_abs_logprob_diff == pytest.approx((7 * 0.1 + 0.5) / 8)
    assert agreement.max_abs_logprob_diff == pytest.approx(0.5)
    assert agreement.top1_agreement == 7 / 8
    assert agreement.greedy_token_match == 6 / 8
    assert agreement.greedy_prefix_match == 2 / 8


def test_a_shorter_generation_counts_missing_tokens_as_mismatches() -> None:
    reference, candidate = make_record(prompts=1), make_record(prompts=1)
    item = candidate["prompts"][0]
    for key in ("generated_token_ids", "generated_logprobs", "generated_top"):
        item[key] = item[key][:2]
    agreement = probe_agreement.compare(reference, candidate)
    assert (agreement.generated_positions, agreement.greedy_token_match, agreement.greedy_prefix_match) == (
        4, 0.5, 0.5)


def test_a_nan_logprob_is_an_infinite_difference() -> None:
    candidate = make_record()
    candidate["prompts"][1]["prompt_logprobs"][1] = "nan"
    agreement = probe_agreement.compare(make_record(), candidate)
    assert math.isinf(agreement.mean_abs_logprob_diff) and math.isinf(agreement.max_abs_logprob_diff)
    assert agreement.as_record()["max_abs_logprob_diff"] == "inf"


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r["prompts"].pop(),
     "<candidate>: 1 prompts, but the reference <reference> has 2 in 'prompts'. "
     "Probe both cells with the same kvgate version"),
    (lambda r: r["prompts"][1].update(prompt="other"),
     "<candidate>: prompt differs from the reference <reference> in prompts[1].prompt. "
     "Probe both cells with the same kvgate version"),
    (lambda r: r["prompts"][0]["prompt_token_ids"].__setitem__(3, 77),
     "<candidate>: prompt token ids differ from the reference <reference> in prompts[0].prompt_token_ids. "
     "Compare cells of the same model and tokenizer"),
    (lambda r: r["settings"].update(max_tokens=8),
     "<candidate>: max_tokens 8 differs from the reference's 4 in settings.max_tokens. "
     "Probe both cells with the same settings"),
])
def test_compare_refuses_records_of_different_prompts(change, message) -> None:
    candidate = make_record()
    change(candidate)
    with pytest.raises(InputError) as error:
        probe_agreement.compare(make_record(), candidate)
    assert str(error.value) == message


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    record = make_record()
    record["prompts"][0]["generated_logprobs"][1] = "-inf"
    path = probe_file.write(record, tmp_path / "probe")
    assert path == tmp_path / "probe" / "probe.json"
    assert [p.name for p in path.parent.iterdir()] == ["probe.json"]
    read = probe_file.read(path)
    assert read.source == str(path)
    assert read.prompts[0].generated_logprobs[1] == -math.inf
    assert read.prompts[1].prompt_top[2] == ((102, -0.2), (202, -2.0))
    assert probe_agreement.compare(read, probe_file.from_dict(record)).mean_abs_logprob_diff == 0.0


def malformed(change) -> dict:
    record = make_record()
    change(record)
    return record


@pytest.mark.parametrize(("text", "message"), [
    ('{"format": "kvgate-probe", ', "not valid JSON (Expecting property name enclosed in double quotes) in "
     "line 1 column 28. Was the probe interrupted while writing?"),
    ("[]", "expected a JSON object in the top level"),
    ('{"format": "lm-eval"}', "not a kvgate probe file (format 'lm-eval') in 'format'. "
     "Expected format 'kvgate-probe'"),
    (json.dumps(malformed(lambda r: r.update(version=2))),
     "probe format version 2 is newer than this kvgate reads (1) in 'version'. Upgrade kvgate"),
    # a header value is shown cut short: a format string of a megabyte was a megabyte-long ERROR line
    (json.dumps({"format": "x" * 1_000_000}), f"not a kvgate probe file (format '{'x' * 58}…) in 'format'. "
                                              "Expected format 'kvgate-probe'"),
    (json.dumps(malformed(lambda r: r.update(version="9" * 4000))),
     f"version must be a whole number, got '{'9' * 58}… in 'version'"),
    (json.dumps(malformed(lambda r: r.update(version=[1] * 100_000))),
     "version must be a whole number, got a list in 'version'"),
    (json.dumps(malformed(lambda r: r.pop("settings"))), "missing key 'settings' in the top level"),
    (json.dumps(malformed(lambda r: r.update(prompts=[]))), "expected at least 1 entry, got 0 in prompts"),
    (json.dumps(malformed(lambda r: r["prompts"][1].pop("prompt_top"))), "missing key 'prompt_top' in prompts[1]"),
    (json.dumps(malformed(lambda r: r["prompts"][0]["prompt_logprobs"].pop())),
     "4 positions for 5 prompt tokens in prompts[0].prompt_logprobs"),
    (json.dumps(malformed(lambda r: r["prompts"][0]["prompt_logprobs"].__setitem__(0, -1.0))),
     "expected null (the first prompt position has no logprob), got number -1.0 in prompts[0].prompt_logprobs[0]"),
    (json.dumps(malformed(lambda r: r["prompts"][0]["prompt_token_ids"].__setitem__(2, "x"))),
     "expected a token id (a whole number >= 0), got string 'x' in prompts[0].prompt_token_ids[2]"),
    (json.dumps(malformed(lambda r: r["prompts"][1]["generated_logprobs"].__setitem__(3, None))),
     'expected a logprob (a number, or "nan", "inf", "-inf"), got null in prompts[1].generated_logprobs[3]'),
    (json.dumps(malformed(lambda r: r["prompts"][1]["generated_top"].__setitem__(0, [[1, -0.1, 2]]))),
     "expected a [token id, logprob] pair, got a list in prompts[1].generated_top[0][0]"),
    (json.dumps(malformed(lambda r: r["prompts"][0]["generated_token_ids"].append(5))),
     "4 positions for 5 generated tokens in prompts[0].generated_logprobs"),
    (json.dumps(malformed(lambda r: r["prompts"][1]["generated_logprobs"].__setitem__(3, 7.0)))
     .replace("7.0", "-1e999"),
     'number -1e999 is out of range (it reads as -infinity) in prompts[1].generated_logprobs[3]. '
     'Write "inf" or "-inf"'),
    (json.dumps(malformed(lambda r: r["prompts"][0]["prompt_top"][1].__setitem__(0, [5, 7.0]))).replace("7.0", "NaN"),
     'NaN is not a number JSON allows in the file. Write "nan", "inf" or "-inf"'),
    (json.dumps(malformed(lambda r: r["prompts"][1]["generated_logprobs"].__setitem__(3, -10 ** 400))),
     "expected a logprob (a finite number), got a whole number past a float's range in "
     'prompts[1].generated_logprobs[3]. Write "inf" or "-inf"'),
    (json.dumps(malformed(lambda r: r["prompts"][0]["prompt_token_ids"].__setitem__(2, 10 ** 400))),
     "expected a token id (a whole number >= 0), got a whole number past a float's range in "
     "prompts[0].prompt_token_ids[2]"),
    (json.dumps(malformed(lambda r: r["prompts"][0]["prompt_top"][1].__setitem__(0, [10 ** 400, -0.5]))),
     "expected a whole number, got a whole number past a float's range in prompts[0].prompt_top[1][0][0]"),
    # past Python's 4,300-digit limit: its own message named sys.set_int_max_str_digits() as the fix
    (json.dumps(malformed(lambda r: r["prompts"][0]["prompt_token_ids"].__setitem__(2, 123456789))).replace(
        "123456789", "7" * 5000),
     "a whole number of over 4300 digits in the file. Write a token id, or a logprob as a number"),
])
def test_malformed_probe_files_are_refused_with_the_place(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "probe.json"
    path.write_text(text)
    with pytest.raises(InputError) as error:
        probe_file.read(path)
    assert str(error.value) == f"{path}: {message}"


H200_RUN = Path(__file__).parent / "fixtures" / "h200_run" / "run.tar.xz"


@pytest.mark.parametrize("cell", ["triton_attn-fp8-sm90", "flashmla-auto-sm90"])
def test_the_fast_reading_of_a_real_probe_file_is_the_entry_by_entry_one(tmp_path, monkeypatch, cell) -> None:
    """msgspec's parse and the reader's all-at-once checks give what json and the entry-by-entry checks give, on a
    real H200 probe file; cached-context prompts and a non-finite logprob included."""
    archives.extract(H200_RUN, tmp_path, members=[f"run/{cell}/probe/probe.json"])
    data = json.loads((tmp_path / "run" / cell / "probe" / "probe.json").read_text())
    data["cached_context"] = [{**data["prompts"][1], "cached_tokens": 3, "fresh_generated_token_ids": [5, 6],
                               "fresh_generated_logprobs": [-0.25, 0], "fresh_cached_tokens": 0}]
    data["prompts"][0]["generated_logprobs"][2] = "-inf"
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(data))
    fast = probe_file.read(path)
    monkeypatch.setattr(reading, "_msgspec_decode", lambda: None)
    monkeypatch.setattr(probe_file, "_types", lambda values: {object})  # no list passes all at once
    slow = probe_file.read(path)
    assert fast == slow
    assert len(fast.prompts) == 16 and fast.prompts[0].generated_logprobs[2] == -math.inf
    assert fast.cached_context[0].fresh_generated_logprobs == (-0.25, 0.0)
    assert sum(len(top) for prompt in fast.prompts for top in prompt.generated_top) > 4000


def test_a_missing_probe_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(InputError) as error:
        probe_file.read(tmp_path / "probe.json")
    assert str(error.value) == f"{tmp_path / 'probe.json'}: no probe file. Did the probe stage run for this cell?"


@pytest.mark.parametrize(("make", "what"), [
    (lambda path: path.symlink_to("/nonexistent/probe.json"), "cannot read: No such file or directory"),
    (lambda path: os.mkfifo(path), "not a regular file (a FIFO, socket or device). Write the file itself at this name"),
    (lambda path: path.symlink_to("/dev/zero"), "not a regular file (a FIFO, socket or device). "
                                                "Write the file itself at this name"),
], ids=["dangling", "fifo", "dev-zero"])
def test_a_probe_file_that_is_no_regular_file_is_refused_unopened(tmp_path: Path, make, what) -> None:
    """A dangling link is not "no probe file"; a FIFO (a hang) or /dev/zero (a MemoryError) is never opened."""
    make(tmp_path / "probe.json")
    with pytest.raises(InputError) as error:
        probe_file.read(tmp_path / "probe.json")
    assert str(error.value) == f"{tmp_path / 'probe.json'}: {what}"


def test_the_fixed_prompts_are_sixteen_distinct_texts() -> None:
    assert len(probe.PROMPTS) == 16 and len(set(probe.PROMPTS)) == 16


# One engine, two probes, in a process of its own with the environment kvgate gives CPU accuracy engines
# (process_env): the engine core inside that process, the compile cache kvgate's own runs fill (the model from the
# shared model folder, so its compiled graph is found), no AOT artifacts. A bare LLM in tmp_path compiled afresh in
# every run: the test took 73 s, now 31 s. (Inside pytest's process vLLM's Triton-override pass trips over a module pytest loaded.)
TWO_PROBES = """
import json, sys
from pathlib import Path
from vllm import LLM
from kvgate.runners.stages import probe
from kvgate.workloads.tiny_models import ensure_model
llm = LLM(model=str(ensure_model("tiny-llama")), kv_cache_dtype="auto", max_model_len=1024, seed=0)
first = probe.collect(llm)
# the second probe starts from the cache state the first found: a prefix served from the cache is computed along
# another path, which on an AVX2-only CPU differs in the last bits (decode logprobs up to 0.05 apart)
assert llm.reset_prefix_cache()
second = probe.collect(llm)
Path(sys.argv[1]).write_text(json.dumps([first, second]))
"""


@pytest.mark.engine
def test_auto_twice_in_one_real_engine_agrees_exactly(tmp_path: Path) -> None:
    """One real vLLM engine (tiny-llama, kv_cache_dtype auto): the probe is reproducible to the bit."""
    import os
    import subprocess
    import sys

    from kvgate.runners.environment.process_env import accuracy_engine_environment, engine_environment

    pytest.importorskip("vllm")
    env, _ = engine_environment(os.environ, arch="cpu", local_model=True, home=Path.home())
    done = subprocess.run([sys.executable, "-c", TWO_PROBES, str(tmp_path / "probes.json")],
                          env=accuracy_engine_environment(env, arch="cpu"), capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    first, second = json.loads((tmp_path / "probes.json").read_text())
    path = probe_file.write(first, tmp_path / "probe")
    read = probe_file.read(path)
    agreement = probe_agreement.compare(read, second)
    print(agreement.as_record(), first["engine"])
    assert len(read.prompts) == len(probe.PROMPTS)
    assert all(len(p.generated_token_ids) == 64 for p in read.prompts)
    assert all(len(top) == 5 for p in read.prompts for top in p.prompt_top[1:])
    assert first["engine"]["kv_cache_dtype"] == "auto"
    cached = probe.cached_context_prompts()
    assert [p.prompt for p in read.cached_context] == cached and len(cached) == 6
    # The first cached-context prompt computed the shared prefix; the others took it from the prefix cache (the
    # CPU's blocks are 128 tokens: every whole block of the prefix), in both probes.
    assert read.cached_context[0].cached_tokens == 0 and all(p.cached_tokens >= 256 for p in read.cached_context[1:])
    assert [p["cached_tokens"] for p in second["cached_context"]] == [p.cached_tokens for p in read.cached_context]
    assert agreement.as_record() == {
        "prompts": 16, "prompt_positions": sum(len(p.prompt_token_ids) - 1 for p in read.prompts),
        "mean_abs_logprob_diff": 0.0, "max_abs_logprob_diff": 0.0, "top1_agreement": 1.0,
        "generated_positions": 22 * 64, "greedy_token_match": 1.0, "greedy_prefix_match": 1.0,
        "decode_positions": 22 * 64, "decode_mean_abs_logprob_diff": 0.0, "decode_max_abs_logprob_diff": 0.0,
        "identical": True, "cached_context_prompts": 6, "cached_tokens": agreement.cached_tokens,
        # every prompt of tiny-llama's probe is under 1k tokens (its positions end at 1024): one bucket
        "by_context_length": [{"bucket": "<=1k", "prompts": 22, "decode_positions": 22 * 64,
                               "decode_mean_abs_logprob_diff": 0.0, "greedy_prefix_match": 1.0}],
    }
    assert agreement.cached_tokens >= 5 * 256
    # The tops are sorted, and greedy picked a most likely token (bf16 logits can tie).
    for p in read.prompts:
        for logprob, top in zip(p.generated_logprobs, p.generated_top, strict=True):
            assert logprob == top[0][1]
            assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)


def test_the_fresh_prefill_of_a_cached_context_prompt_is_read_and_checked() -> None:
    from kvgate import InputError
    from kvgate.results.probe_file import from_dict

    record = with_cached_context(make_record())
    entry = record["cached_context"][0]
    entry.update(fresh_cached_tokens=0, fresh_generated_token_ids=[500, 501, 9, 9],
                 fresh_generated_logprobs=[-0.3, -0.5, -1.0, -1.0])
    consistency = probe_agreement.cache_consistency(record)
    assert consistency.as_record() == {"prompts": 1, "generated_positions": 4, "greedy_prefix_match": 0.5,
                                       "decode_positions": 2, "decode_mean_abs_logprob_diff": pytest.approx(0.1)}
    assert probe_agreement.cache_consistency(make_record()) is None  # no cached-context prompts
    entry["fresh_generated_logprobs"] = [-0.3]
    with pytest.raises(InputError, match=re.escape("1 positions for 4 generated tokens in "
                                                   "cached_context[0].fresh_generated_logprobs")):
        from_dict(record)


def with_long_context(record: dict, lengths=(5000, 9000), logprob: float = -0.3, diverge_at: int | None = None) -> dict:
    """The record plus one long prompt per length (4 generated tokens each; diverge_at: the token that differs)."""
    entries = []
    for n in lengths:
        ids = [600, 601, 602, 603]
        if diverge_at is not None:
            ids[diverge_at] = 700
        entries.append({"prompt": f"passkey document of {n} tokens", "prompt_token_ids": [7] * n, "cached_tokens": 0,
                        "generated_token_ids": ids, "generated_logprobs": [logprob] * 4,
                        "generated_top": [[[i, logprob], [400, -1.5]] for i in ids], "generated_text": "1234"})
    record["long_context"] = entries
    return record


def test_decode_divergence_is_reported_by_context_length_and_long_prompts_leave_the_judged_figures_alone() -> None:
    short_only = probe_agreement.compare(make_record(), make_record())
    agreement = probe_agreement.compare(with_long_context(make_record()),
                                        with_long_context(make_record(), logprob=-0.8, diverge_at=2))
    buckets = {b["bucket"]: b for b in agreement.as_record()["by_context_length"]}
    assert list(buckets) == ["<=1k", "<=8k", "<=16k"]
    assert buckets["<=1k"]["decode_mean_abs_logprob_diff"] == 0.0
    for name in ("<=8k", "<=16k"):
        assert buckets[name]["prompts"] == 1 and buckets[name]["decode_positions"] == 2  # the common greedy prefix
        assert buckets[name]["decode_mean_abs_logprob_diff"] == pytest.approx(0.5)
        assert buckets[name]["greedy_prefix_match"] == 0.5
    # the thresholds' figures are those of the fixed prompts, as before the long prompts existed
    assert agreement.decode_mean_abs_logprob_diff == short_only.decode_mean_abs_logprob_diff
    assert agreement.greedy_prefix_match == short_only.greedy_prefix_match


def test_long_context_prompts_that_differ_cannot_be_compared() -> None:
    with pytest.raises(InputError, match="long-context probe prompts differ"):
        probe_agreement.compare(with_long_context(make_record()), with_long_context(make_record(), lengths=(5000,)))
    with pytest.raises(InputError, match="long-context probe prompts differ"):
        probe_agreement.compare(make_record(), with_long_context(make_record()))


def test_a_malformed_long_context_entry_is_refused_with_its_place() -> None:
    record = with_long_context(make_record())
    record["long_context"][1]["generated_logprobs"].pop()
    with pytest.raises(InputError, match=r"long_context\[1\]"):
        probe_file.from_dict(record, "run/x/probe/probe.json")
    with pytest.raises(InputError, match="expected a list, got dict in 'long_context'"):
        probe_file.from_dict({**make_record(), "long_context": {}}, "run/x/probe/probe.json")
