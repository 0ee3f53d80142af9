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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FORMAT = "kvgate-kernel-timings"
VERSION = 1


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
