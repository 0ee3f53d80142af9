"""The matrix: cells of attention backend x kv_cache_dtype x arch (x model), from the TOML under matrix/.

Stdlib only, so the noxfile can import it before anything is installed. `load()` is the only
function that touches the disk; `parse()` turns already-read TOML documents into a `Matrix` (its records are
kvgate.matrix.declarations) and reports every problem it finds, each naming the file, the place and, where it
fits, the fix.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvgate import InputError, InputErrors, unknown_name_hint
from kvgate.matrix.declarations import (
    FP8_KV_SCALES,
    GSM8K_FILTERS,
    KV_CACHE_DTYPE_NAME,
    LOCAL_MODEL_PREFIX,
    MATCH_KEYS,
    PLAIN,
    Arch,
    Backend,
    Cell,
    Exclusion,
    ExpectedAccuracy,
    Feature,
    Match,
    Matrix,
    SelectionRules,
    Waiver,
    Workload,
    cell_id,
    glob_matches,
)
from kvgate.matrix.features import arch_gpus as _arch_gpus
from kvgate.matrix.features import feature_cells as _feature_cells
from kvgate.matrix.features import parse_features as _parse_features_with
from kvgate.matrix.host_requirements import parse_host_requirements
from kvgate.matrix.long_context import parse_long_context
from kvgate.matrix.toml_reading import TomlReader, describe_value, read_toml, shown_path

# The matrix's public names: the loader here, its records from kvgate.matrix.declarations.
__all__ = ["GSM8K_FILTERS", "LOCAL_MODEL_PREFIX", "MATRIX_DIR_ENV", "MATRIX_FILES", "Arch", "Backend", "Cell",
           "Exclusion", "ExpectedAccuracy", "Feature", "Match", "Matrix", "SelectionRules", "Waiver", "Workload", "cell_id",
           "default_matrix_dir", "glob_matches", "load", "parse", "parse_match"]

MATRIX_FILES = ("axes.toml", "backends.toml", "exclusions.toml", "waivers.toml", "workloads.toml")


MATRIX_DIR_ENV = "KVGATE_MATRIX_DIR"


def default_matrix_dir() -> Path:
    """$KVGATE_MATRIX_DIR, else the matrix/ of the checkout kvgate runs from, else the copy an installed kvgate
    ships (package data: kvgate/matrix/defaults, a link to the checkout's matrix/ in the repository). Never the
    current directory: a results folder or a PR's checkout that a command happens to run in must not bring its own
    matrix or policy (pass --matrix-dir to choose one)."""
    if os.environ.get(MATRIX_DIR_ENV):
        return Path(os.environ[MATRIX_DIR_ENV])
    checkout = Path(__file__).resolve().parents[3] / "matrix"
    if any((checkout / name).is_file() for name in MATRIX_FILES):
        return checkout
    return Path(__file__).resolve().parent / "defaults"


def load(folder: Path | None = None) -> Matrix:
    """Read matrix/*.toml and parse them; raises InputErrors naming every problem."""
    folder = folder or default_matrix_dir()
    if not any((folder / name).is_file() for name in MATRIX_FILES):
        raise InputError(shown_path(folder), f"no kvgate matrix here (it holds {', '.join(MATRIX_FILES)})",
                         hint=f"kvgate looks in --matrix-dir, then ${MATRIX_DIR_ENV}, then the checkout it runs from, "
                              f"then the copy it ships (never the current directory): pass --matrix-dir DIR or set {MATRIX_DIR_ENV} to a "
                              f"kvgate checkout's matrix/ folder")
    documents: dict[str, dict[str, Any]] = {}
    problems = []
    for name in MATRIX_FILES:
        try:
            documents[name] = read_toml(folder / name, missing_hint=f"kvgate reads {', '.join(MATRIX_FILES)}",
                                        invalid_hint="Strings need quotes, dates are YYYY-MM-DD, tables are "
                                                     "declared once")
        except InputError as error:
            problems.append(error)
    if problems:
        raise InputErrors(problems)
    return parse(documents, {name: shown_path(folder / name) for name in MATRIX_FILES})


def parse(documents: Mapping[str, Mapping[str, Any]], sources: Mapping[str, str] | None = None) -> Matrix:
    """Build the Matrix from the five parsed TOML documents (keyed by file name)."""
    sources = dict(sources or {})
    readers = {name: TomlReader(sources.get(name, f"matrix/{name}")) for name in MATRIX_FILES}
    axes = documents.get("axes.toml", {})
    kv_cache_dtypes, archs = _parse_axes(readers["axes.toml"], axes)
    backends, shared_sources = _parse_backends(readers["backends.toml"], documents.get("backends.toml", {}),
                                               kv_cache_dtypes, archs)
    selection = _parse_selection(readers["backends.toml"], documents.get("backends.toml", {}).get("selection", {}))
    workloads = _parse_workloads(readers["workloads.toml"], documents.get("workloads.toml", {}), archs)
    features = _parse_features_with(readers["axes.toml"], axes.get("features", {}), kv_cache_dtypes, archs, backends,
                                    parse_match, _globs)
    feature_names = [*features, PLAIN]
    exclusions = _parse_exclusions(readers["exclusions.toml"], documents.get("exclusions.toml", {}),
                                   kv_cache_dtypes, archs, backends, feature_names)
    waivers = _parse_waivers(readers["waivers.toml"], documents.get("waivers.toml", {}),
                             kv_cache_dtypes, archs, backends, feature_names)
    problems = [p for r in readers.values() for p in r.problems]
    if problems:
        raise InputErrors(problems)

    cells = _expand(backends, kv_cache_dtypes, archs, workloads, readers["workloads.toml"])
    cells += _feature_cells(cells, features, archs, readers["axes.toml"])
    excluded = set()
    for exclusion in exclusions:
        hits = {c.id for c in cells if exclusion.match.matches(c)}
        if not hits:
            readers["exclusions.toml"].error(
                "exclusion matches no cell (the backend's declared support already leaves it out, "
                "or the names are stale)", exclusion.where, "Delete it or fix its match")
        excluded |= hits
    for waiver in waivers:
        if not any(waiver.match.matches(c) for c in cells if c.id not in excluded):
            readers["waivers.toml"].error("waiver matches no cell", waiver.where, "Delete it or fix its match")
    problems = [p for r in readers.values() for p in r.problems]
    if problems:
        raise InputErrors(problems)
    return Matrix(
        kv_cache_dtypes=kv_cache_dtypes,
        archs=archs,
        backends=backends,
        workloads=workloads,
        exclusions=tuple(exclusions),
        waivers=tuple(waivers),
        shared_sources=shared_sources,
        cells=tuple(c for c in cells if c.id not in excluded),
        selection=selection,
        features=features,
    )


def _parse_axes(reader: TomlReader, doc: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, Arch]]:
    if not reader.keys(doc, "axes", ["kv_cache_dtypes", "archs"], ["features"]):
        return (), {}
    dtypes = doc["kv_cache_dtypes"]
    if not isinstance(dtypes, list) or not dtypes or not all(isinstance(d, str) for d in dtypes):
        reader.error(f"expected a list of dtype names, got {describe_value(dtypes)}", "kv_cache_dtypes")
        dtypes = []
    elif "auto" not in dtypes:
        reader.error("'auto' must be one of the kv_cache_dtypes: every FP8 cell is compared with it",
                     "kv_cache_dtypes")
    if len(set(dtypes)) != len(dtypes):
        reader.error("duplicate dtype", "kv_cache_dtypes")
    for index, dtype in enumerate(dtypes):  # a part of every cell id: a job name, a folder, a word of CI's shell
        if not KV_CACHE_DTYPE_NAME.fullmatch(dtype):
            reader.error(f"kv_cache_dtype {ascii(dtype)[:80]} is not a name vLLM's --kv-cache-dtype takes",
                         f"kv_cache_dtypes[{index}]", "Use lower case, digits and _ (e.g. fp8_e4m3)")
    archs: dict[str, Arch] = {}
    table = doc["archs"]
    if not isinstance(table, dict):
        reader.error(f"expected a table of archs, got {describe_value(table)}", "archs")
        return tuple(dtypes), archs
    for name, spec in table.items():
        where = f"archs.{name}"
        if not re.fullmatch(r"sm\d{2,3}|cpu", name):
            reader.error(f"bad arch name '{name}'", where, "Write smNN (e.g. sm90) or cpu")
            continue
        if not reader.keys(spec, where, ["description", "runner"], ["compute_capability", "gpus", "multi_gpu_runners"]):
            continue
        capability = spec.get("compute_capability")
        if name != "cpu" and not (isinstance(capability, str) and re.fullmatch(r"\d+\.\d+", capability)):
            reader.error(f"expected a compute capability like \"9.0\", got {describe_value(capability)}",
                         f"{where}.compute_capability")
        gpus, runners = _arch_gpus(reader, spec, where, name)
        archs[name] = Arch(name=name, description=reader.string(spec, "description", where),
                           runner=reader.label(spec, "runner", where, "runner label"), compute_capability=capability,
                           gpus=gpus, multi_gpu_runners=runners)
    return tuple(dtypes), archs


BACKEND_KEYS = ("mla", "kv_cache_dtypes", "archs")
BACKEND_OPTIONAL_KEYS = ("arch_kv_cache_dtypes", "block_sizes", "block_size_multiple", "sources", "notes",
                         "host_requirements")


def _parse_backends(reader: TomlReader, doc: Mapping[str, Any], dtypes: Sequence[str],
                    archs: Mapping[str, Arch]) -> tuple[dict[str, Backend], tuple[str, ...]]:
    backends: dict[str, Backend] = {}
    if not reader.keys(doc, "backends.toml", ["backends"], ["shared", "selection"]):
        return backends, ()
    if not reader.named_tables(doc["backends"], "backends", "FLASH_ATTN"):
        return backends, ()
    for name, spec in doc["backends"].items():
        where = f"backends.{name}"
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            reader.error(f"bad backend name '{name}'", where, "Use vLLM's AttentionBackendEnum name, e.g. FLASHINFER_MLA")
            continue
        if not reader.keys(spec, where, BACKEND_KEYS, BACKEND_OPTIONAL_KEYS):
            continue
        backend_archs = reader.names(spec["archs"], f"{where}.archs", archs, "arch")
        backend_dtypes = reader.names(spec["kv_cache_dtypes"], f"{where}.kv_cache_dtypes", dtypes, "kv_cache_dtype")
        per_arch: dict[str, tuple[str, ...]] = {}
        overrides = spec.get("arch_kv_cache_dtypes", {})
        if not isinstance(overrides, dict):
            reader.error(f"expected a table of arch = [dtypes], got {describe_value(overrides)}", f"{where}.arch_kv_cache_dtypes")
            overrides = {}
        for arch, allowed in overrides.items():
            sub = f"{where}.arch_kv_cache_dtypes.{arch}"
            if arch not in archs:
                reader.error(f"unknown arch '{arch}'", sub, unknown_name_hint(arch, archs))
                continue
            if arch not in backend_archs:
                reader.error(f"{name} does not support arch '{arch}' (not in its archs)", sub,
                             f"Add it to {where}.archs or delete this line")
                continue
            names = reader.names(allowed, sub, dtypes, "kv_cache_dtype")
            for dtype in names:
                if dtype not in backend_dtypes:
                    reader.error(f"{name} does not support kv_cache_dtype '{dtype}' (not in its kv_cache_dtypes)", sub)
            per_arch[arch] = names
        blocks = spec.get("block_sizes", [])
        if not isinstance(blocks, list) or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in blocks):
            reader.error(f"expected a list of positive integers, got {describe_value(blocks)}", f"{where}.block_sizes")
            blocks = []
        multiple = spec.get("block_size_multiple")
        if multiple is not None and (not isinstance(multiple, int) or isinstance(multiple, bool) or multiple <= 0):
            reader.error(f"expected a positive integer, got {describe_value(multiple)}", f"{where}.block_size_multiple")
            multiple = None
        if not blocks and multiple is None:
            reader.error("declare block_sizes or block_size_multiple", where)
        backends[name] = Backend(
            name=name, mla=reader.boolean(spec, "mla", where), kv_cache_dtypes=backend_dtypes,
            archs=backend_archs, arch_kv_cache_dtypes=per_arch, block_sizes=tuple(blocks),
            block_size_multiple=multiple, sources=_compiled_globs(reader, spec.get("sources", []), f"{where}.sources"),
            notes=spec.get("notes", ""),
            host_requirements=parse_host_requirements(reader, spec["host_requirements"], f"{where}.host_requirements",
                                                      backend_dtypes, name) if "host_requirements" in spec else (),
        )
    shared = doc.get("shared", {})
    shared_sources: tuple[str, ...] = ()
    if reader.keys(shared, "shared", [], ["sources"]):
        shared_sources = _globs(reader, shared.get("sources", []), "shared.sources")
    return backends, shared_sources


SELECTION_KEYS = ("attention_registry", "model_registry", "engine_roots", "arch_roots", "inert")
ARCH_KINDS = ("cpu", "gpu")
_MODULE = re.compile(r"vllm(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _parse_selection(reader: TomlReader, table: Any) -> SelectionRules:
    """backends.toml [selection]: the import-graph selection's roots, registries and inert paths."""
    if not reader.keys(table, "selection", [], SELECTION_KEYS):
        return SelectionRules()
    values: dict[str, Any] = {}
    for key in ("attention_registry", "model_registry"):
        if key in table:
            value = table[key]
            if not isinstance(value, str) or not _MODULE.fullmatch(value):
                reader.error(f"expected a dotted vLLM module (vllm.a.b), got {describe_value(value)}", f"selection.{key}")
                continue
            values[key] = value
    values["engine_roots"] = _modules(reader, table.get("engine_roots", []), "selection.engine_roots")
    arch_roots = table.get("arch_roots", {})
    if not isinstance(arch_roots, dict):
        reader.error(f"expected a table of {' / '.join(ARCH_KINDS)} = [modules], got {describe_value(arch_roots)}",
                     "selection.arch_roots")
        arch_roots = {}
    for kind in arch_roots:
        if kind not in ARCH_KINDS:
            reader.error(f"unknown arch kind '{kind}'", "selection.arch_roots", unknown_name_hint(kind, ARCH_KINDS))
    values["arch_roots"] = {kind: _modules(reader, arch_roots[kind], f"selection.arch_roots.{kind}")
                            for kind in ARCH_KINDS if kind in arch_roots}
    values["inert"] = _globs(reader, table.get("inert", []), "selection.inert")
    return SelectionRules(**values)


def _compiled_globs(reader: TomlReader, value: Any, where: str) -> tuple[str, ...]:
    """A backend's `sources`: what vLLM's import graph cannot see; Python modules are the graph's to select."""
    globs = _globs(reader, value, where)
    for index, pattern in enumerate(globs):
        if pattern.endswith(".py"):
            reader.error(f"'{pattern}' names Python files, which vLLM's import graph selects", f"{where}[{index}]",
                         "Delete it: sources are for compiled and build paths (csrc/, CMake)")
    return globs


def _modules(reader: TomlReader, value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and _MODULE.fullmatch(v) for v in value):
        reader.error(f"expected a list of dotted vLLM modules (vllm.a.b), got {describe_value(value)}", where)
        return ()
    return tuple(value)


def _globs(reader: TomlReader, value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        reader.error(f"expected a list of path globs, got {describe_value(value)}", where)
        return ()
    return tuple(value)


GSM8K_KEYS = ("task", "num_fewshot", "limit", "batch_size")
GSM8K_OPTIONAL_KEYS = ("add_bos_token", "max_gen_toks")
# add_bos_token: lm-eval's vllm model argument (absent: the tokenizer's own default); max_gen_toks: lm-eval's
# generation cap per answer (absent: the task's, 256 for gsm8k), passed as --gen_kwargs
THROUGHPUT_KEYS = ("dataset_name", "random_input_len", "random_output_len", "num_prompts", "repeats")
THROUGHPUT_OPTIONAL_KEYS = ("engines", "warmup_output_len", "weights", "engine_args",
                            "warmups")  # warmups: refused with its replacement named
# weights: "real" (the model's own) or "dummy" (its architecture from the config kvgate ships, load_format "dummy";
# kvgate.workloads.dummy_weights); engine_args: engine arguments of the throughput stage only, over model_args
THROUGHPUT_WEIGHTS = ("real", "dummy")
ENGINE_ARGS_SET_BY_KVGATE = ("pretrained", "kv_cache_dtype", "attention_backend", "calculate_kv_scales",
                             "load_format", "model")
TIMEOUT_KEYS = ("accuracy", "throughput")  # seconds per stage of one cell; the kernels stage is not the model's


def _parse_workloads(reader: TomlReader, doc: Mapping[str, Any], archs: Mapping[str, Arch]) -> dict[str, Workload]:
    workloads: dict[str, Workload] = {}
    if not reader.keys(doc, "workloads.toml", ["defaults", "workloads"]):
        return workloads
    defaults = doc["defaults"]
    if not reader.keys(defaults, "defaults", ["gsm8k", "throughput"], ["timeouts"]):
        return workloads
    gsm8k_defaults = _settings(reader, defaults["gsm8k"], "defaults.gsm8k", GSM8K_KEYS, required=True,
                               optional=GSM8K_OPTIONAL_KEYS)
    throughput_defaults = _settings(reader, defaults["throughput"], "defaults.throughput", THROUGHPUT_KEYS, required=True,
                                    optional=THROUGHPUT_OPTIONAL_KEYS)
    timeout_defaults = _settings(reader, defaults.get("timeouts", {}), "defaults.timeouts", TIMEOUT_KEYS)
    if not reader.named_tables(doc["workloads"], "workloads", "tiny-llama"):
        return workloads
    for name, spec in doc["workloads"].items():
        where = f"workloads.{name}"
        if not reader.keys(spec, where, ["model", "mla", "archs"],
                           ["model_args", "gsm8k", "throughput", "timeouts", "calculate_kv_scales", "expected_accuracy",
                            "architectures", "fp8_kv_scales", "measured_minutes", "long_context"]):
            continue
        model_args = spec.get("model_args", {})
        if not isinstance(model_args, dict):
            reader.error(f"expected a table, got {describe_value(model_args)}", f"{where}.model_args")
            model_args = {}
        for reserved in ("pretrained", "kv_cache_dtype", "attention_backend"):
            if reserved in model_args:
                reader.error(f"'{reserved}' is set by kvgate from the cell", f"{where}.model_args.{reserved}",
                             "Delete it")
        if "calculate_kv_scales" in model_args:
            reader.error("'calculate_kv_scales' is set by kvgate for the FP8 cells only",
                         f"{where}.model_args.calculate_kv_scales", f"Write it as {where}.calculate_kv_scales")
        length = model_args.get("max_model_len", 1)  # kvgate reads it: the passkey lengths that fit the engine
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            reader.error(f"expected a whole number of tokens >= 1, got {describe_value(length)}",
                         f"{where}.model_args.max_model_len", "Write e.g. max_model_len = 4096")
            model_args = {k: v for k, v in model_args.items() if k != "max_model_len"}
        if "trust_remote_code" in model_args:  # read with bool(): "false" would be True
            reader.boolean(model_args, "trust_remote_code", f"{where}.model_args")
        workloads[name] = Workload(
            name=name, model=reader.string(spec, "model", where), mla=reader.boolean(spec, "mla", where),
            archs=reader.names(spec["archs"], f"{where}.archs", archs, "arch"), model_args=dict(model_args),
            gsm8k={**gsm8k_defaults, **_settings(reader, spec.get("gsm8k", {}), f"{where}.gsm8k",
                                                 (*GSM8K_KEYS, *GSM8K_OPTIONAL_KEYS))},
            throughput={**throughput_defaults,
                        **_settings(reader, spec.get("throughput", {}), f"{where}.throughput",
                                          (*THROUGHPUT_KEYS, *THROUGHPUT_OPTIONAL_KEYS))},
            timeouts={**timeout_defaults,
                      **_settings(reader, spec.get("timeouts", {}), f"{where}.timeouts", TIMEOUT_KEYS)},
            calculate_kv_scales=reader.boolean(spec, "calculate_kv_scales", where)
            if "calculate_kv_scales" in spec else False,
            expected_accuracy=_expected_accuracy(reader, spec["expected_accuracy"], f"{where}.expected_accuracy")
            if "expected_accuracy" in spec else None,
            architectures=_architectures(reader, spec.get("architectures", []), f"{where}.architectures"),
            fp8_kv_scales=_fp8_kv_scales(reader, spec, where),
            measured_minutes=_measured_minutes(reader, spec.get("measured_minutes", {}), f"{where}.measured_minutes",
                                               spec.get("archs", [])),
            long_context=parse_long_context(reader, spec["long_context"], f"{where}.long_context")
            if "long_context" in spec else None,
        )
    return workloads


def _measured_minutes(reader: TomlReader, table: Any, where: str, archs: Any) -> dict[str, dict[str, float]]:
    """{ <arch> = { <stage> = minutes a side, ... } }: what a stage took where it was measured."""
    if not isinstance(table, dict):
        reader.error(f"expected a table of archs, got {describe_value(table)}", where)
        return {}
    out: dict[str, dict[str, float]] = {}
    for arch, stages in table.items():
        if not isinstance(archs, list) or arch not in archs:
            reader.error(f"'{arch}' is not one of this workload's archs", f"{where}.{arch}",
                         unknown_name_hint(str(arch), [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []))
            continue
        if not reader.keys(stages, f"{where}.{arch}", [], TIMEOUT_KEYS):
            continue
        for stage, minutes in stages.items():
            if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 0 < minutes < 10_000:
                reader.error(f"expected minutes > 0, got {describe_value(minutes)}", f"{where}.{arch}.{stage}")
                continue
            out.setdefault(arch, {})[stage] = float(minutes)
    return out


def _fp8_kv_scales(reader: TomlReader, spec: Mapping[str, Any], where: str) -> str:
    value = spec.get("fp8_kv_scales", "none")
    if value not in FP8_KV_SCALES:
        reader.error(f"expected one of {', '.join(map(repr, FP8_KV_SCALES))}, got {describe_value(value)}",
                     f"{where}.fp8_kv_scales", "Write \"checkpoint\" (the FP8 cells load k/v scales shipped with the "
                     "model) or \"none\"")
        return "none"
    if value == "checkpoint":
        if not str(spec.get("model", "")).startswith(LOCAL_MODEL_PREFIX):
            reader.error("kvgate ships FP8 KV scales for its own models only", f"{where}.fp8_kv_scales",
                         "Name an FP8 checkpoint as the model of a workload of its own, or drop fp8_kv_scales")
        if spec.get("calculate_kv_scales") is True:
            reader.error("the scales come from the checkpoint or from the data, not both", f"{where}.fp8_kv_scales",
                         "Drop fp8_kv_scales or calculate_kv_scales")
    return value


def _architectures(reader: TomlReader, value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.isidentifier() for v in value):
        reader.error(f"expected a list of model architectures (config.json's, e.g. LlamaForCausalLM), got "
                     f"{describe_value(value)}", where)
        return ()
    return tuple(value)


def _expected_accuracy(reader: TomlReader, table: Any, where: str) -> ExpectedAccuracy | None:
    """{ <filter> = fraction, ..., rtol = fraction, source = "..." }: at least one filter."""
    if not reader.keys(table, where, ["rtol", "source"], GSM8K_FILTERS):
        return None
    values = {}
    for name in GSM8K_FILTERS:
        if name in table:
            value = table[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                reader.error(f"expected an accuracy as a fraction in (0, 1), got {describe_value(value)}",
                             f"{where}.{name}")
                continue
            values[name] = float(value)
    if not any(name in table for name in GSM8K_FILTERS):
        reader.error("no expected accuracy", where, f"Give at least one of {', '.join(GSM8K_FILTERS)}")
    rtol = table["rtol"]
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not 0 < rtol < 1:
        reader.error(f"expected a relative tolerance in (0, 1), got {describe_value(rtol)}", f"{where}.rtol",
                     "vLLM's CI uses 0.08")
        rtol = 0.0
    source = reader.string(table, "source", where)
    return ExpectedAccuracy(values=values, rtol=float(rtol), source=source)


def _settings(reader: TomlReader, table: Any, where: str, keys: Sequence[str], required: bool = False,
              optional: Sequence[str] = ()) -> dict[str, Any]:
    if not reader.keys(table, where, keys if required else [], [*optional] if required else [*keys, *optional]):
        return {}
    out = {}
    for key, value in table.items():
        if key == "add_bos_token":
            if not isinstance(value, bool):
                reader.error(f"expected true or false, got {describe_value(value)}", f"{where}.{key}")
                continue
        elif key in ("task", "dataset_name"):
            if not isinstance(value, str) or not value:
                reader.error(f"expected a name, got {describe_value(value)}", f"{where}.{key}")
                continue
        elif key == "weights":
            if value not in THROUGHPUT_WEIGHTS:
                reader.error(f"expected one of {', '.join(map(repr, THROUGHPUT_WEIGHTS))}, got {describe_value(value)}",
                             f"{where}.{key}", "\"dummy\" times the model's architecture with random weights "
                             "(kvgate ships its config); \"real\" loads the model")
                continue
        elif key == "engine_args":
            if not isinstance(value, dict):
                reader.error(f"expected a table of engine arguments, got {describe_value(value)}", f"{where}.{key}")
                continue
            reserved = [name for name in value if name in ENGINE_ARGS_SET_BY_KVGATE]
            if reserved:
                reader.error(f"'{reserved[0]}' is set by kvgate", f"{where}.{key}.{reserved[0]}",
                             "Delete it (load_format comes from throughput.weights)")
                continue
        elif key == "warmups":
            reader.error("'warmups' is gone: each engine now opens with a warm-up of the workload's prompts",
                         f"{where}.{key}", "Write warmup_output_len = <tokens a warm-up prompt generates> (0: none)")
            continue
        elif key == "batch_size":
            if not (value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0)):
                reader.error(f"expected \"auto\" or a positive integer, got {describe_value(value)}", f"{where}.{key}")
                continue
        else:
            minimum = 0 if key in ("limit", "num_fewshot", "warmup_output_len") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                reader.error(f"expected an integer >= {minimum}, got {describe_value(value)}", f"{where}.{key}")
                continue
        out[key] = value
    return out


def parse_match(reader: TomlReader, value: Any, where: str, dtypes: Sequence[str], archs: Mapping[str, Arch],
                 backends: Mapping[str, Backend], features: Sequence[str] | None = None) -> Match | None:
    """A match table; `features`: the feature names it may name ("plain": the cells without one)."""
    if not reader.keys(value, where, [], MATCH_KEYS):
        return None
    if not value:
        reader.error("empty match would select every cell", where, "Name a backend, kv_cache_dtype, arch or feature")
        return None
    for key, names in value.items():
        if isinstance(names, list) and not names:  # [] would match any value of the key, not none
            reader.error(f"empty list in a match would match every {key}", f"{where}.{key}",
                         f"Name at least one {key}, or leave the key out")
            return None
    match = Match(
        backend=reader.names(value.get("backend", []), f"{where}.backend", backends, "backend", allow_one=True),
        kv_cache_dtype=reader.names(value.get("kv_cache_dtype", []), f"{where}.kv_cache_dtype", dtypes,
                                    "kv_cache_dtype", allow_one=True),
        arch=reader.names(value.get("arch", []), f"{where}.arch", archs, "arch", allow_one=True),
        feature=reader.names(value.get("feature", []), f"{where}.feature", features if features is not None else (),
                             "feature", allow_one=True) if "feature" in value else (),
    )
    for backend_name in match.backend:
        backend = backends[backend_name]
        for arch in match.arch:
            if arch not in backend.archs:
                reader.error(f"{backend_name} does not support arch '{arch}' (backends.toml: archs = "
                             f"{', '.join(backend.archs)})", f"{where}.arch")
        for dtype in match.kv_cache_dtype:
            if dtype not in backend.kv_cache_dtypes:
                reader.error(f"{backend_name} does not support kv_cache_dtype '{dtype}' (backends.toml: "
                             f"kv_cache_dtypes = {', '.join(backend.kv_cache_dtypes)})", f"{where}.kv_cache_dtype")
    return match


def _link(reader: TomlReader, table: Mapping[str, Any], key: str, where: str) -> str:
    value = reader.string(table, key, where)
    if value and not re.match(r"https?://\S+$", value):
        reader.error(f"expected a URL, got {value!r}", f"{where}.{key}")
    return value


def _parse_exclusions(reader: TomlReader, doc: Mapping[str, Any], dtypes: Sequence[str], archs: Mapping[str, Arch],
                      backends: Mapping[str, Backend], features: Sequence[str] = ()) -> list[Exclusion]:
    out: list[Exclusion] = []
    if not reader.keys(doc, "exclusions.toml", [], ["exclude"]):
        return out
    entries = doc.get("exclude", [])
    if not isinstance(entries, list):
        reader.error("expected [[exclude]] tables", "exclude")
        return out
    for index, entry in enumerate(entries):
        where = f"exclude[{index}]"
        if not reader.keys(entry, where, ["match", "reason", "link"]):
            continue
        match = parse_match(reader, entry["match"], f"{where}.match", dtypes, archs, backends, features)
        reason, link = reader.string(entry, "reason", where), _link(reader, entry, "link", where)
        if match is not None:
            out.append(Exclusion(match=match, reason=reason, link=link, where=where))
    return out


def _parse_waivers(reader: TomlReader, doc: Mapping[str, Any], dtypes: Sequence[str], archs: Mapping[str, Arch],
                   backends: Mapping[str, Backend], features: Sequence[str] = ()) -> list[Waiver]:
    out: list[Waiver] = []
    if not reader.keys(doc, "waivers.toml", [], ["waiver"]):
        return out
    entries = doc.get("waiver", [])
    if not isinstance(entries, list):
        reader.error("expected [[waiver]] tables", "waiver")
        return out
    for index, entry in enumerate(entries):
        where = f"waiver[{index}]"
        if not reader.keys(entry, where, ["match", "checks", "reason", "issue", "expires"]):
            continue
        match = parse_match(reader, entry["match"], f"{where}.match", dtypes, archs, backends, features)
        checks = entry["checks"]
        if not isinstance(checks, list) or not checks or not all(isinstance(c, str) and c for c in checks):
            reader.error(f"expected a list of check names (or [\"*\"]), got {describe_value(checks)}", f"{where}.checks")
            checks = []
        expires = _date(reader, entry["expires"], f"{where}.expires")
        reason, issue = reader.string(entry, "reason", where), _link(reader, entry, "issue", where)
        if match is not None and expires is not None:
            out.append(Waiver(match=match, checks=tuple(checks), reason=reason, issue=issue, expires=expires, where=where))
    return out


def _date(reader: TomlReader, value: Any, where: str) -> dt.date | None:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    reader.error(f"bad date {describe_value(value)}", where, "Write YYYY-MM-DD, e.g. 2027-03-31")
    return None


def _expand(backends: Mapping[str, Backend], dtypes: Sequence[str], archs: Mapping[str, Arch],
            workloads: Mapping[str, Workload], reader: TomlReader) -> list[Cell]:
    cells = []
    for backend in backends.values():
        for arch in archs:
            if arch not in backend.archs:
                continue
            candidates = [w for w in workloads.values() if arch in w.archs and w.mla == backend.mla]
            if len(candidates) != 1:
                kind = "MLA" if backend.mla else "non-MLA"
                what = "no workload" if not candidates else f"{len(candidates)} workloads ({', '.join(w.name for w in candidates)})"
                reader.error(f"{what} for {kind} backends on {arch} ({backend.name} needs exactly one)", "workloads",
                             f"Give one workload with mla = {str(backend.mla).lower()} and '{arch}' in its archs")
                continue
            for dtype in dtypes:
                if backend.supports(arch, dtype):
                    cells.append(Cell(backend=backend.name, kv_cache_dtype=dtype, arch=arch,
                                      workload=candidates[0], mla=backend.mla,
                                      host_requirements=tuple(r for r in backend.host_requirements
                                                              if r.applies_to(dtype))))
    if reader.problems:
        raise InputErrors(reader.problems)
    return cells
