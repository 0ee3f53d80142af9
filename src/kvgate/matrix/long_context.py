"""The passkey task a workload declares (matrix/workloads.toml `long_context`; kvgate.workloads.passkey asks it)."""

from __future__ import annotations

from typing import Any

from kvgate.matrix.declarations import LONG_CONTEXT_SEED, LongContext
from kvgate.matrix.toml_reading import TomlReader, describe_value


def _listed(value: Any) -> str:
    """A list as it was written (shortened), anything else described."""
    if isinstance(value, list) and all(isinstance(v, (int, float, str, bool)) for v in value):
        text = "[" + ", ".join(repr(v) for v in value) + "]"
        return text if len(text) <= 80 else text[:77] + "..."
    return describe_value(value)


def parse_long_context(reader: TomlReader, table: Any, where: str) -> LongContext | None:
    """{ lengths = [tokens, ...], depths = [fractions], keys_per_depth = N, seed = S, model = M, max_model_len = L }:
    the passkey task (model and max_model_len together: the model that answers it in an engine of its own)."""
    if not reader.keys(table, where, ["lengths", "depths"], ["keys_per_depth", "seed", "model", "max_model_len"]):
        return None
    lengths, depths = table["lengths"], table["depths"]
    keys, seed = table.get("keys_per_depth", 1), table.get("seed", LONG_CONTEXT_SEED)
    ok = True
    if (not isinstance(lengths, list) or not lengths or len(set(map(repr, lengths))) != len(lengths)
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 256 for n in lengths)):
        reader.error(f"expected distinct whole numbers of tokens >= 256, got {_listed(lengths)}",
                     f"{where}.lengths", "Write e.g. lengths = [4096, 8192, 16384, 32768]")
        ok = False
    if (not isinstance(depths, list) or not depths
            or not all(isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1 for d in depths)):
        reader.error(f"expected fractions in [0, 1], got {_listed(depths)}", f"{where}.depths",
                     "Write e.g. depths = [0.1, 0.3, 0.5, 0.7, 0.9]")
        ok = False
    for name, value, least in (("keys_per_depth", keys, 1), ("seed", seed, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            reader.error(f"expected a whole number >= {least}, got {describe_value(value)}", f"{where}.{name}",
                         f"Write e.g. {name} = 5")
            ok = False
    model, max_model_len = table.get("model"), table.get("max_model_len")
    if (model is None) != (max_model_len is None):
        given, missing = ("model", "max_model_len") if model is not None else ("max_model_len", "model")
        reader.error(f"{given} is set without {missing}", f"{where}.{missing}",
                     "Set both (the model that answers the passkey task and its engine's max_model_len), or neither "
                     "(the gsm8k model answers it)")
        ok = False
    if model is not None and (not isinstance(model, str) or not model.strip() or model != model.strip()):
        reader.error(f"expected a model id, path or kvgate:<name>, got {describe_value(model)}", f"{where}.model",
                     'Write e.g. model = "kvgate:tiny-llama-long"')
        ok = False
    if max_model_len is not None and (not isinstance(max_model_len, int) or isinstance(max_model_len, bool)
                                      or max_model_len < 272):
        reader.error(f"expected a whole number of tokens >= 272, got {describe_value(max_model_len)}",
                     f"{where}.max_model_len", "Write e.g. max_model_len = 8208 (the longest length + 16)")
        ok = False
    if not ok:
        return None
    return LongContext(lengths=tuple(sorted(lengths)), depths=tuple(float(d) for d in depths), keys_per_depth=keys,
                       seed=seed, model=model, max_model_len=max_model_len)
