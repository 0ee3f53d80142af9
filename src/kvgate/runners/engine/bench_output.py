"""The figures `vllm bench throughput` prints (output tokens/s is printed, not in its --output-json).

    Throughput: 12.34 requests/s, 1975.04 total tokens/s, 394.80 output tokens/s
    Total num prompt tokens:  2560
    Total num output tokens:  640
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_THROUGHPUT = re.compile(
    r"Throughput: (?P<rps>[0-9.]+) requests/s, (?P<total>[0-9.]+) total tokens/s, "
    r"(?P<output>[0-9.]+) output tokens/s"
)
_PROMPT_TOKENS = re.compile(r"Total num prompt tokens:\s+(?P<n>\d+)")
_OUTPUT_TOKENS = re.compile(r"Total num output tokens:\s+(?P<n>\d+)")


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchFigures:
    requests_per_second: float
    total_tokens_per_second: float
    output_tokens_per_second: float
    prompt_tokens: int | None = None
    output_tokens: int | None = None


def read_bench_figures(log_text: str) -> BenchFigures | None:
    """The last `Throughput:` line of a run and the token counts after it; None when absent."""
    matches = list(_THROUGHPUT.finditer(log_text))
    if not matches:
        return None
    last = matches[-1]
    rest = log_text[last.end():]
    prompt = _PROMPT_TOKENS.search(rest)
    output = _OUTPUT_TOKENS.search(rest)
    return BenchFigures(
        requests_per_second=float(last["rps"]),
        total_tokens_per_second=float(last["total"]),
        output_tokens_per_second=float(last["output"]),
        prompt_tokens=int(prompt["n"]) if prompt else None,
        output_tokens=int(output["n"]) if output else None,
    )
