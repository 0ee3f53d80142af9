"""A hub model's architecture with no weights, for the throughput stage (matrix/workloads.toml `throughput.weights =
"dummy"`): the model's config.json, shipped under workloads/architectures/<hub id>/, beside a tokenizer of the
model's vocabulary size that kvgate generates, in a folder vLLM loads with `load_format = "dummy"` (random weights).

Throughput with `ignore_eos` does not depend on the weights' values: every request generates exactly its output
length, through the same kernels at the same shapes. So a runner needs neither the weights (31.4 GB for
DeepSeek-V2-Lite-Chat) nor a hub token to time the model's real architecture.

The tokenizer maps id i to the word `t<i>` (a `tokenizers` WordLevel model split on whitespace), adds the model's
BOS like the real one and marks the config's BOS and EOS ids special: `vllm bench throughput`'s random prompts then
draw from the whole vocabulary, and decoding and encoding them again gives back the same ids, so every prompt keeps
its exact length.

The folder lives in the model cache (kvgate.workloads.tiny_models.default_cache_dir), named after the hub id and a
hash of what decides its bytes, and is written once (a staging folder renamed into place).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kvgate import InputError

ARCHITECTURES_DIR = Path(__file__).resolve().parent / "architectures"
RECIPE_VERSION = 1  # bump when the tokenizer's construction changes
MARKER = "tokenizer_config.json"  # written last


def shipped_config_path(model_id: str) -> Path:
    """Where kvgate ships `model_id`'s config.json (it may not exist)."""
    return ARCHITECTURES_DIR / model_id / "config.json"


def shipped_config(model_id: str) -> dict:
    """The shipped config.json of a hub model id; InputError naming the fix when kvgate ships none."""
    path = shipped_config_path(model_id)
    if ".." in Path(model_id).parts or Path(model_id).is_absolute() or not path.is_file():
        shipped = sorted(str(p.parent.relative_to(ARCHITECTURES_DIR)) for p in ARCHITECTURES_DIR.glob("*/*/config.json"))
        raise InputError(model_id, "kvgate ships no config.json for this model, so its throughput cannot run with "
                                   "dummy weights",
                         hint=f"add src/kvgate/workloads/architectures/{model_id}/config.json (the hub repository's), "
                              f"or set the workload's throughput.weights = \"real\"; shipped: {', '.join(shipped)}")
    config = json.loads(path.read_text(encoding="utf-8"))
    vocab = config.get("vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 16:
        raise InputError(str(path), f"vocab_size must be an integer >= 16, got {vocab!r}", "vocab_size")
    return config


def _special_ids(config: dict) -> tuple[int, list[int]]:
    """(BOS id, EOS ids) from the config, within the vocabulary."""
    vocab = config["vocab_size"]
    bos = config.get("bos_token_id")
    eos = config.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else [eos]
    bos = bos if isinstance(bos, int) and 0 <= bos < vocab else 0
    eos_ids = [e for e in eos_ids if isinstance(e, int) and 0 <= e < vocab and e != bos] or [1 if bos != 1 else 2]
    return bos, eos_ids


def model_dir(model_id: str, cache_dir: Path | None = None) -> Path:
    from kvgate.workloads.tiny_models import default_cache_dir

    config = shipped_config(model_id)
    recipe = json.dumps({"recipe_version": RECIPE_VERSION, "config": config}, sort_keys=True)
    key = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    return (cache_dir or default_cache_dir()) / f"dummy-weights-{model_id.replace('/', '--')}-{key}"


def ensure_model(model_id: str, cache_dir: Path | None = None) -> Path:
    """The folder vLLM loads `model_id`'s architecture from with load_format "dummy", written first if needed."""
    from kvgate.workloads.tiny_models import build_once

    config = shipped_config(model_id)
    return build_once(model_dir(model_id, cache_dir), MARKER, lambda staging: write_model_folder(config, staging))


def word(token_id: int) -> str:
    return f"t{token_id}"


def write_model_folder(config: dict, folder: Path) -> None:
    """config.json, tokenizer.json, special_tokens_map.json and (last) tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab_size = config["vocab_size"]
    bos, eos_ids = _special_ids(config)
    tokenizer = Tokenizer(models.WordLevel({word(i): i for i in range(vocab_size)}, unk_token=word(0)))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{word(bos)} $A", pair=f"{word(bos)} $A {word(bos)} $B", special_tokens=[(word(bos), bos)])
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken(word(i), special=True) for i in (bos, *eos_ids)])
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"bos_token": word(bos), "eos_token": word(eos_ids[0]), "unk_token": word(0)}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", **special,
        "model_max_length": int(config.get("max_position_embeddings", 1 << 20)),
        "clean_up_tokenization_spaces": False, "add_bos_token": True, "add_eos_token": False,
    }
    (folder / MARKER).write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
