"""lm-eval parsers on real lm-eval 0.4.13 outputs (tests/fixtures/lm_eval, see its README) and on variants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate import InputError
from kvgate.results.parsers import lm_eval
from kvgate.results.parsers.reading import read_text

FIXTURES = Path(__file__).parent / "fixtures" / "lm_eval"


def _results(dtype: str) -> Path:
    return next((FIXTURES / dtype).glob("*/results_*.json"))


def _samples(dtype: str) -> Path:
    return next((FIXTURES / dtype).glob("*/samples_gsm8k_*.jsonl"))


def test_results_file_of_lm_eval_0_4_13():
    path = _results("auto")
    result = lm_eval.parse_results(read_text(path), str(path), task="gsm8k")
    print(result)
    assert set(result.scores) == {"strict-match", "flexible-extract"}
    assert result.scores["strict-match"].mean == 0.0  # a random tiny model answers nothing right
    assert result.scores["strict-match"].stderr == 0.0
    assert result.n == 10
    assert result.lm_eval_version == "0.4.13"
    assert result.limit == 10.0 and result.num_fewshot == 5
    assert "kv_cache_dtype=auto" in result.model_args


def test_samples_file_of_lm_eval_0_4_13_joins_with_its_results():
    results = lm_eval.parse_results(read_text(_results("fp8")), "r", task="gsm8k")
    samples = lm_eval.parse_samples(read_text(_samples("fp8")), "s")
    assert {name: s.n for name, s in samples.items()} == {"strict-match": 10, "flexible-extract": 10}
    key, (correct, prompt_hash) = next(iter(samples["strict-match"].outcomes.items()))
    assert len(key) == 64 and len(prompt_hash) == 64 and correct is False  # doc_hash and prompt_hash are sha256
    joined = lm_eval.with_samples(results, samples, "s")
    assert joined.samples is not None and joined.samples_file == "s"


def test_auto_and_fp8_runs_of_the_same_task_share_documents_and_prompts():
    auto = lm_eval.parse_samples(read_text(_samples("auto")), "a")["strict-match"].outcomes
    fp8 = lm_eval.parse_samples(read_text(_samples("fp8")), "f")["strict-match"].outcomes
    assert auto.keys() == fp8.keys()
    assert all(auto[k][1] == fp8[k][1] for k in auto)


def test_samples_file_name_gives_the_task_even_with_underscores():
    assert lm_eval.samples_task("samples_gsm8k_2026-11-30T04-04-17.526722.jsonl") == "gsm8k"
    assert lm_eval.samples_task("samples_kvgate_gsm8k_local_2026-11-30T04-04-17.526722.jsonl") == "kvgate_gsm8k_local"
    assert lm_eval.samples_task("results_2026.json") is None


def test_stderr_written_as_na_reads_as_none():
    data = json.loads(read_text(_results("auto")))
    data["results"]["gsm8k"]["exact_match_stderr,strict-match"] = "N/A"
    result = lm_eval.parse_results(json.dumps(data), "r", task="gsm8k")
    assert result.scores["strict-match"].stderr is None


def test_missing_task_names_the_tasks_found():
    with pytest.raises(InputError) as error:
        lm_eval.parse_results(read_text(_results("auto")), "r.json", task="gsm8k_cot")
    assert str(error.value) == "r.json: no results for task 'gsm8k_cot' in results. Tasks found: gsm8k"


def test_the_names_a_file_holds_are_listed_short():
    """Tasks, metrics and filters a file names are listed in an error cut short: a results file naming a task of 300,000
    characters made an ERROR line of that length, carried into verdict.json and the reports."""
    data = json.loads(read_text(_results("auto")))
    data["results"].update({"Q" * 300_000: {}, **{f"task_{i:02}": {} for i in range(10)}})
    with pytest.raises(InputError) as error:
        lm_eval.parse_results(json.dumps(data), "r.json", task="gsm8k_cot")
    assert str(error.value) == (f"r.json: no results for task 'gsm8k_cot' in results. Tasks found: {'Q' * 59}…, gsm8k, "
                                "task_00, task_01, task_02, task_03, task_04, task_05 (+4 more)")
    data["results"]["gsm8k"] = {f"{'m' * 100_000}{i},none": 0.5 for i in range(3)}
    with pytest.raises(InputError) as error:
        lm_eval.parse_results(json.dumps(data), "r.json", task="gsm8k")
    assert str(error.value) == (f"r.json: no 'exact_match' figures for task 'gsm8k' in results.gsm8k. Metrics found: "
                                f"{'m' * 59}…, {'m' * 59}…, {'m' * 59}…")
    results = lm_eval.parse_results(read_text(_results("auto")), "r.json", task="gsm8k")
    lines = [json.dumps({"doc_id": i, "filter": "F" * 300_000, "exact_match": 1.0}) for i in range(10)]
    with pytest.raises(InputError) as error:
        lm_eval.with_samples(results, lm_eval.parse_samples("\n".join(lines), "s"), "s")
    assert str(error.value) == f"s: no sample records for filter 'strict-match' in the file. Filters found: {'F' * 59}…"


def test_samples_without_doc_hash_join_on_doc_id():
    lines = [json.dumps({"doc_id": i, "filter": "strict-match", "exact_match": float(i % 2)}) for i in range(4)]
    samples = lm_eval.parse_samples("\n".join(lines), "s")
    assert sorted(samples["strict-match"].outcomes) == ["doc_id:0", "doc_id:1", "doc_id:2", "doc_id:3"]
    assert samples["strict-match"].mean == 0.5


@pytest.mark.parametrize(("line", "message"), [
    ("garbage", "s.jsonl: not a JSON object (Expecting value at column 1) in line 2. Each line must be one sample "
                "record as lm-eval --log_samples writes it"),
    ('{"doc_id": 1, "filter": "strict-match"}', "s.jsonl: missing key 'exact_match' in line 2. lm-eval sample "
                                                "records carry doc_id, filter and the metric's value"),
    ('{"doc_id": "one", "filter": "strict-match", "exact_match": 1}',
     "s.jsonl: expected an integer, got string 'one' in line 2.doc_id"),
    ('{"doc_id": 1, "filter": "strict-match", "exact_match": 0.5}',
     "s.jsonl: expected 0 or 1, got 0.5 in line 2.exact_match. The paired test needs a right/wrong outcome per question"),
    ('{"doc_id": 1, "filter": "strict-match", "exact_match": NaN}', "s.jsonl: NaN is not a number JSON allows in line 2"),
    ('{"doc_id": 0, "filter": "strict-match", "exact_match": 1}',
     "s.jsonl: duplicate record for document doc_id:0 and filter 'strict-match' in line 2. One samples file must hold one run"),
    # a document's key cut short: a doc_hash of 300,000 characters made an ERROR line of that length
    ("\n".join(json.dumps({"doc_id": i, "doc_hash": "H" * 300_000, "filter": "strict-match", "exact_match": 1.0})
               for i in (1, 2)),
     f"s.jsonl: duplicate record for document {'H' * 59}… and filter 'strict-match' in line 3. One samples file must "
     "hold one run"),
    ("[1, 2]", "s.jsonl: expected a JSON object, got a list in line 2"),
    ("[" * 100_000 + "]" * 100_000, "s.jsonl: JSON nested too deeply in line 2"),
])
def test_bad_sample_lines_name_the_file_and_line(line, message):
    first = json.dumps({"doc_id": 0, "filter": "strict-match", "exact_match": 1.0})
    with pytest.raises(InputError) as error:
        lm_eval.parse_samples(f"{first}\n{line}\n", "s.jsonl")
    assert str(error.value) == message


def test_samples_that_disagree_with_the_results_file_are_refused():
    results = lm_eval.parse_results(read_text(_results("auto")), "r.json", task="gsm8k")
    lines = read_text(_samples("auto")).splitlines()
    with pytest.raises(InputError) as error:
        lm_eval.with_samples(results, lm_eval.parse_samples("\n".join(lines[:-2]), "s"), "s")
    assert str(error.value) == ("s: 8 documents for filter 'flexible-extract', but r.json says n-samples effective 10 in "
                                "the file. The samples and results files come from different runs")


def test_the_fast_and_the_stdlib_sample_readers_agree(monkeypatch):
    pytest.importorskip("msgspec")
    data = _samples("fp8").read_bytes()
    fast = lm_eval._fast_samples(data, "exact_match")
    assert fast is not None
    monkeypatch.setitem(lm_eval._FAST_DECODERS, "exact_match", None)
    assert lm_eval._fast_samples(data, "exact_match") is None
    assert lm_eval.parse_samples(data, "s") == fast
