"""`vllm bench throughput` outputs: the --output-json file and the captured stdout.

JSON keys (vllm/benchmarks/throughput.py): elapsed_time, num_requests, total_num_tokens,
requests_per_second, tokens_per_second (+ model_id). Output tokens/s is only printed:
`Throughput: X requests/s, Y total tokens/s, Z output tokens/s` (older vLLM: `Y tokens/s`, no output figure).
"""

from __future__ import annotations

import math
import re

from kvgate import InputError
from kvgate.results.parsers.reading import expect_int, expect_number, expect_object, loads
from kvgate.results.records import ThroughputRepeat

REQUIRED_KEYS = ("requests_per_second", "tokens_per_second", "elapsed_time", "num_requests", "total_num_tokens")
_NUMBER = r"([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
THROUGHPUT_LINE = re.compile(
    rf"^Throughput:\s*{_NUMBER}\s*requests/s,\s*{_NUMBER}\s*(?:total\s+)?tokens/s"
    rf"(?:,\s*{_NUMBER}\s*output tokens/s)?", re.MULTILINE)
OUTPUT_TOKENS_LINE = re.compile(r"^Total num output tokens:\s*([0-9]+)", re.MULTILINE)


def is_pytorch_format(file_name: str) -> bool:
    """vLLM also writes `<name>.pytorch.json` (PyTorch benchmark database format): not a repeat."""
    return file_name.endswith(".pytorch.json")


def parse_output_json(text: str, source: str) -> ThroughputRepeat:
    data = expect_object(loads(text, source), source, "")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise InputError(source, f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
                         "the top level", "Expected the file `vllm bench throughput --output-json` writes")
    return ThroughputRepeat(
        source=source,
        requests_per_second=expect_number(data["requests_per_second"], source, "requests_per_second", positive=True),
        tokens_per_second=expect_number(data["tokens_per_second"], source, "tokens_per_second", positive=True),
        elapsed_time=expect_number(data["elapsed_time"], source, "elapsed_time", positive=True),
        num_requests=expect_int(data["num_requests"], source, "num_requests", minimum=1),
        total_num_tokens=expect_int(data["total_num_tokens"], source, "total_num_tokens", minimum=1),
    )


def parse_log(text: str, source: str) -> tuple[float, float, float | None] | None:
    """The last `Throughput:` line of a captured stdout: (requests/s, total tokens/s, output tokens/s or None).

    None when the log has no such line (the run died before printing it)."""
    matches = list(THROUGHPUT_LINE.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    figures = [float(g) if g is not None else None for g in last.groups()]
    for value, name in zip(figures, ("requests/s", "total tokens/s", "output tokens/s"), strict=True):
        if value is not None and (value <= 0 or math.isinf(value)):  # 1e999 reads as infinity
            line = text.count("\n", 0, last.start()) + 1
            bound = "> 0" if value <= 0 else "finite"
            raise InputError(source, f"{name} must be {bound}, got {value:g}", f"line {line}")
    return figures[0], figures[1], figures[2]


def with_log(repeat: ThroughputRepeat, log_text: str, log_source: str) -> ThroughputRepeat:
    """Add the output tokens/s a repeat's log printed (or derive it from its output token count)."""
    figures = parse_log(log_text, log_source)
    output_tps = figures[2] if figures else None
    if output_tps is None:
        counts = OUTPUT_TOKENS_LINE.findall(log_text)
        if counts:
            count = counts[-1]
            if len(count) > 300:  # past a float's range (and Python's 4,300-digit limit): no throughput
                line = log_text.count("\n", 0, log_text.rfind("Total num output tokens:")) + 1
                raise InputError(log_source, f"output token count of {len(count)} digits is out of range",
                                 f"line {line}")
            output_tps = int(count) / repeat.elapsed_time
            if math.isinf(output_tps):
                line = log_text.count("\n", 0, log_text.rfind("Total num output tokens:")) + 1
                raise InputError(log_source, "output tokens/s must be finite", f"line {line}")
    return ThroughputRepeat(
        source=repeat.source, requests_per_second=repeat.requests_per_second,
        tokens_per_second=repeat.tokens_per_second, elapsed_time=repeat.elapsed_time,
        num_requests=repeat.num_requests, total_num_tokens=repeat.total_num_tokens,
        output_tokens_per_second=output_tps,
    )
