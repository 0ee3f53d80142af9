"""kvgate's kernel timing file, ``<run dir>/<cell id>/kernels/timings.json`` (format version 1).

    {
      "format": "kvgate-kernel-timings",
      "version": 1,
      "cell_id": "triton_mla-fp8-sm90",          # null when written outside a cell (plain pytest)
      "device": {"name": "NVIDIA H200", "capability": "9.0",
                 "copy_bandwidth_gbps": 4280.1},   # measured device-to-device copy, read + write bytes
      "method": {"cuda_graph": true, "l2_flush_bytes": 268435456, "repeats": 30,
                 "statistic": "median of repeats; each repeat flushes L2, then replays one launch"},
      "entries": [
        {"family": "vllm_triton_mla", "kv_cache_dtype": "fp8", "spec": "b32-h128-kv8192",
         "batch": 32, "num_heads": 128, "kv_len": 8192, "page_size": 64,
         "median_us": 458.1, "min_us": 455.0, "max_us": 470.2, "repeats": 30,
         "bytes": 155189248, "achieved_gbps": 338.8, "fraction_of_copy": 0.079,
         "cuda_graph": true, "provenance": "flashinfer 0.7.2.post1 ..."}
      ]
    }

An entry's key is (family, kv_cache_dtype, spec); `compare` pairs a run's entries with a baseline's
by that key. ``bytes`` is the least HBM traffic of one decode (cached rows once + query + output), so
``achieved_gbps = bytes / median`` is a lower bound on the kernel's real traffic. Readers refuse a
newer major version (`read` raises ValueError naming the file).

Repeatability and the timing tolerance (issue 12 item 3). `spread` pairs the entries of several runs of
the same tests on the same machine (each a whole pytest process) by key: per entry the min, median and
max of the runs' medians and the spread ``(max - min) / median``. `spread_report` prints that table.
A current/baseline ratio (`compare`) then counts as slower only above ``1 + tolerance`` with

    tolerance = max(TOLERANCE_FLOOR, TOLERANCE_FACTOR x the worst entry's run-to-run spread), rounded up
                to a whole percent                                              (`tolerance_from_spreads`)

a floor of 5 % (below that, clock and L2 state differences between machines of one kind dominate) and a
factor of 3 (three runs see only part of the run-to-run distribution; 3x their worst spread leaves
room for the runs not seen). `KERNEL_TIME_TOLERANCE` holds the value derived from the H200's three runs:
17 % (benchmarks/h200_engine/spread.md). A kernel timing compared with a baseline of the same GPU kind counts
as slower only above 1.17x; a single slower entry within it is run-to-run noise on that machine.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FORMAT = "kvgate-kernel-timings"
VERSION = 1
TOLERANCE_FLOOR = 0.05
TOLERANCE_FACTOR = 3.0
# From the H200's three speed-only runs (2026-12-01, benchmarks/h200_engine/spread.md, tests/test_h200_timings.py):
# 31 entries, worst spread 5.4 % (FLASH_ATTN_MLA b128-h16-kv4096; every other entry within 1.3 %) -> 3 x 5.4 % = 17 %.
KERNEL_TIME_TOLERANCE: float | None = 0.17


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingEntry:
    family: str
    kv_cache_dtype: str
    spec: str
    batch: int
    num_heads: int
    kv_len: int
    page_size: int
    median_us: float
    min_us: float
    max_us: float
    repeats: int
    bytes: int
    achieved_gbps: float
    fraction_of_copy: float | None
    cuda_graph: bool
    provenance: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.family, self.kv_cache_dtype, self.spec)


def document(entries: Iterable[TimingEntry], *, cell_id: str | None, device: Mapping[str, Any],
             method: Mapping[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "cell_id": cell_id, "device": dict(device),
            "method": dict(method), "entries": [asdict(e) for e in sorted(entries, key=lambda e: e.key)]}


def parse(data: Any, source: str) -> list[TimingEntry]:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{source}: not a {FORMAT} file")
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise ValueError(f"{source}: format version {version!r} is newer than this kvgate reads ({VERSION})")
    entries = []
    for index, raw in enumerate(data.get("entries", [])):
        try:
            entries.append(TimingEntry(**raw))
        except TypeError as error:
            raise ValueError(f"{source}: bad entry in entries[{index}]: {error}") from None
    return entries


def read(path: Path) -> list[TimingEntry]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read timings ({error})") from None
    return parse(data, str(path))


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingComparison:
    key: tuple[str, str, str]
    current_us: float
    baseline_us: float

    @property
    def ratio(self) -> float:
        """current / baseline: above 1 is slower."""
        return self.current_us / self.baseline_us


def compare(current: Iterable[TimingEntry], baseline: Iterable[TimingEntry]) -> list[TimingComparison]:
    """One comparison per key present in both; keys in only one side are left out."""
    base = {e.key: e for e in baseline}
    return [TimingComparison(key=e.key, current_us=e.median_us, baseline_us=base[e.key].median_us)
            for e in current if e.key in base]


def regressions(comparisons: Iterable[TimingComparison], tolerance: float) -> list[TimingComparison]:
    """The comparisons slower than the baseline by more than `tolerance` (ratio > 1 + tolerance)."""
    if not 0 <= tolerance < 10:
        raise ValueError(f"a timing tolerance is a fraction such as 0.05, got {tolerance}")
    return [c for c in comparisons if c.ratio > 1 + tolerance]


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingSpread:
    """One entry across runs: the runs' medians (us), in run order."""

    key: tuple[str, str, str]
    medians_us: tuple[float, ...]

    @property
    def min_us(self) -> float:
        return min(self.medians_us)

    @property
    def max_us(self) -> float:
        return max(self.medians_us)

    @property
    def median_us(self) -> float:
        return statistics.median(self.medians_us)

    @property
    def spread(self) -> float:
        """(max - min) / median of the runs' medians, a fraction."""
        return (self.max_us - self.min_us) / self.median_us


def spread(runs: Sequence[Iterable[TimingEntry]]) -> tuple[list[TimingSpread], list[tuple[str, str, str]]]:
    """(the spread of every key present in all runs, sorted by key; the keys missing from some run)."""
    if len(runs) < 2:
        raise ValueError(f"a spread needs at least two runs, got {len(runs)}")
    by_run = []
    for index, run in enumerate(runs):
        keyed: dict[tuple[str, str, str], TimingEntry] = {}
        for entry in run:
            if entry.key in keyed:
                raise ValueError(f"run {index + 1}: two entries for {entry.key}")
            keyed[entry.key] = entry
        by_run.append(keyed)
    every = set().union(*by_run)
    common = sorted(k for k in every if all(k in keyed for keyed in by_run))
    spreads = [TimingSpread(key=k, medians_us=tuple(keyed[k].median_us for keyed in by_run)) for k in common]
    return spreads, sorted(every - set(common))


def tolerance_from_spreads(spreads: Sequence[TimingSpread], *, floor: float = TOLERANCE_FLOOR,
                           factor: float = TOLERANCE_FACTOR) -> float:
    """max(floor, factor x the worst spread), rounded up to a whole percent."""
    if not spreads:
        raise ValueError("no timing entry is common to all runs")
    worst = max(s.spread for s in spreads)
    return max(floor, math.ceil(factor * worst * 100 - 1e-9) / 100)


def spread_table(spreads: Sequence[TimingSpread]) -> str:
    """Markdown: one row per entry, the runs' medians and their spread."""
    lines = ["| family | kv | spec | runs (median us) | min us | median us | max us | spread |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for s in spreads:
        family, kv, spec = s.key
        runs = ", ".join(f"{m:.1f}" for m in s.medians_us)
        lines.append(f"| {family} | {kv} | {spec} | {runs} | {s.min_us:.1f} | {s.median_us:.1f} | {s.max_us:.1f} "
                     f"| {100 * s.spread:.1f} % |")
    return "\n".join(lines)


def spread_report(paths: Sequence[Path | str]) -> str:
    """The spread table of timings.json files from repeated runs, the worst entries and the derived tolerance."""
    spreads, missing = spread([read(Path(p)) for p in paths])
    lines = [f"Timing spread over {len(paths)} runs ({', '.join(str(p) for p in paths)}):", "", spread_table(spreads), ""]
    if missing:
        lines.append(f"Entries missing from some run (left out): {', '.join('/'.join(k) for k in missing)}")
    if spreads:
        worst = sorted(spreads, key=lambda s: s.spread, reverse=True)[:3]
        lines.append("Worst spreads: " + "; ".join(f"{'/'.join(s.key)} {100 * s.spread:.1f} %" for s in worst))
        tolerance = tolerance_from_spreads(spreads)
        lines.append(f"Derived timing tolerance: max({100 * TOLERANCE_FLOOR:.0f} %, {TOLERANCE_FACTOR:g} x "
                     f"{100 * worst[0].spread:.1f} %) = {100 * tolerance:.0f} % (a ratio above {1 + tolerance:.2f} "
                     "vs the baseline is slower)")
    return "\n".join(lines)


def merge_fragments(folder: Path) -> list[TimingEntry]:
    """Entries from the per-worker fragment files (*.entries.json) the tests write under one folder."""
    entries: list[TimingEntry] = []
    for path in sorted(Path(folder).glob("*.entries.json")):
        entries.extend(TimingEntry(**raw) for raw in json.loads(path.read_text(encoding="utf-8")))
    return entries


def write_fragment(folder: Path, worker: str, entry: TimingEntry) -> None:
    """Append one entry to this worker's fragment file (each xdist worker writes its own)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{worker}.entries.json"
    existing = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
    existing.append(asdict(entry))
    path.write_text(json.dumps(existing, indent=1), encoding="utf-8")


def write_device_fragment(folder: Path, worker: str, device: Mapping[str, Any], method: Mapping[str, Any]) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{worker}.device.json").write_text(json.dumps({"device": dict(device), "method": dict(method)}),
                                                  encoding="utf-8")


def read_device_fragment(folder: Path) -> dict[str, Any]:
    """The first worker's device + method record ({} when no benchmark ran)."""
    for path in sorted(Path(folder).glob("*.device.json")):
        return json.loads(path.read_text(encoding="utf-8"))
    return {}
