"""Decode-kernel microbenchmark: CUDA-graph replay, L2 flushed before each launch, median of repeats.

One repeat: write a buffer twice the L2 size (so no cached KV survives), record a start event, replay a
CUDA graph holding one launch, record an end event. The figure is the median of `repeats` such times
(graph launch overhead, a few us, included). Where capture fails the launch is timed eagerly and the
entry says ``cuda_graph: false``. Bandwidth is `cases.bytes_moved` over the median, set against the
device's own device-to-device copy bandwidth measured in the same process (read + write bytes / time;
4.28 TB/s on the lent H200). Knobs: ``KVGATE_BENCH_REPEATS`` (default 30).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

DEFAULT_REPEATS = 30
L2_FLUSH_FACTOR = 2
COPY_BYTES = 1 << 30


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelTime:
    median_us: float
    min_us: float
    max_us: float
    repeats: int
    cuda_graph: bool


def repeats_from_env() -> int:
    return int(os.environ.get("KVGATE_BENCH_REPEATS", DEFAULT_REPEATS))


def l2_flush_bytes(device: torch.device) -> int:
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    return max(l2, 8 << 20) * L2_FLUSH_FACTOR


def time_launch(launch: Callable[[], object], device: torch.device, repeats: int) -> KernelTime:
    flush = torch.empty(l2_flush_bytes(device), dtype=torch.uint8, device=device)
    launch()  # compile / JIT / autotune outside the timing
    torch.cuda.synchronize(device)
    replay, graphed = _graphed(launch, device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        start.record()
        replay()
        end.record()
    torch.cuda.synchronize(device)
    times = [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends, strict=True)]
    return KernelTime(median_us=statistics.median(times), min_us=min(times), max_us=max(times),
                      repeats=repeats, cuda_graph=graphed)


def _graphed(launch: Callable[[], object], device: torch.device) -> tuple[Callable[[], object], bool]:
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(stream):
            launch()  # warm-up on the side stream, as torch.cuda.graphs recommends
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch()
        torch.cuda.synchronize(device)
    except Exception:
        torch.cuda.synchronize(device)
        return launch, False
    return graph.replay, True


_COPY_BW: dict[torch.device, float] = {}


def copy_bandwidth_gbps(device: torch.device, repeats: int = 10) -> float:
    """Device-to-device copy of 1 GiB: (read + write bytes) / median time, in GB/s."""
    if device not in _COPY_BW:
        src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1000.0)
        _COPY_BW[device] = 2 * COPY_BYTES / statistics.median(times) / 1e9
        del src, dst
    return _COPY_BW[device]
