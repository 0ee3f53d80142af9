"""The tiny models of the embedded CPU default, shipped or built locally; nothing is downloaded.

A model named `kvgate:<name>` in the matrix is a Hugging Face folder that vLLM loads. Two kinds:
- trained (shipped): the folder under `workloads/models/<name>/` holds weights trained to solve kvgate's
  gsm8k-format problems 0-shot (recipe: benchmarks/train_tiny_models.py; its `training_log.json` says how,
  where and how long), with their own tokenizer (digits as single tokens). `tiny-llama` is trained;
  `tiny-llama-long` is trained on kvgate's passkey task alone (benchmarks/train_long_passkey.py), the model of the
  CPU default's long-context task (matrix/workloads.toml long_context.model).
- random (built): `config.json`, fixed-seed random weights in `model.safetensors`, a byte-level BPE tokenizer
  (512 tokens) trained with the `tokenizers` library on text kvgate ships (`data/tokenizer_corpus.txt`), and
  `generation_config.json`. `tiny-deepseek-v2` is random until its trained weights land (issue 10): it runs
  the MLA path, but scores ~0 on gsm8k.

Two architectures cover the two attention families on CPU: a Llama (CPU_ATTN; head size 64, so fp8 KV
works) and a DeepSeek-V2 with MLA (CPU_MLA; kv_lora_rank 512 + rope 64 = head size 576).

Builds are deterministic (same bytes for the same recipe and library versions) and cached under
`cache_dir`, else $KVGATE_MODEL_DIR, else ~/.cache/kvgate/models, in a folder named after the model and a
hash of its recipe, so any change of recipe builds a fresh folder. A build happens in a temporary folder
that is renamed into place at the end, so a crashed or concurrent build never leaves a half model behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvgate import InputError, unknown_name_hint

PREFIX = "kvgate:"
RECIPE_VERSION = 1  # bump when the build code changes in a way the spec below does not capture
CORPUS_PATH = Path(__file__).resolve().parent / "data" / "tokenizer_corpus.txt"
MARKER = "kvgate-model.json"  # written last inside the build folder; its presence means a complete model
SHIPPED_DIR = Path(__file__).resolve().parent / "models"
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
                 "tokenizer.json", "tokenizer_config.json", "training_log.json")

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]  # ids 0..3
BOS, EOS, UNK, PAD = SPECIAL_TOKENS
MAX_POSITIONS = 4096


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyModel:
    name: str
    description: str
    config: dict
    seed: int
    extra: dict = field(default_factory=dict)

    @property
    def shipped(self) -> Path | None:
        """The folder of trained weights kvgate ships for this model; None for a model it builds (no such folder).
        A shipped folder without its weights is an incomplete checkout: refused, never replaced by the random recipe
        (an untrained model of the same name, whose answers would be blamed on the vLLM under test)."""
        folder = SHIPPED_DIR / self.name
        if not folder.is_dir():
            return None
        weights = folder / "model.safetensors"
        if not weights.is_file():
            raise InputError(str(weights), "missing: kvgate ships this model's trained weights, and without them a run "
                             "would build an untrained model of the same name",
                             hint="Restore the file from the repository (git checkout -- "
                                  f"src/kvgate/workloads/models/{self.name}/model.safetensors)")
        return folder


def _shipped_config(name: str) -> dict:
    return json.loads((SHIPPED_DIR / name / "config.json").read_text(encoding="utf-8"))


MODELS: dict[str, TinyModel] = {
    "tiny-llama": TinyModel(
        name="tiny-llama",
        description=("Llama trained on kvgate's gsm8k-format problems: hidden 256, 6 layers, 4 heads of 64, "
                     "5.4 M parameters, vocab 640 (CPU_ATTN; fp8 KV needs head size % 32 == 0)"),
        seed=11,
        config=_shipped_config("tiny-llama"),
    ),
    "tiny-llama-long": TinyModel(
        name="tiny-llama-long",
        description=("Llama with long positions trained only on kvgate's passkey task (the long-context model of the "
                     "workloads' long_context): hidden 128, 2 layers, 2 heads of 64, rope_theta 1e7, 33,792 "
                     "positions, 0.59 M parameters, tiny-llama's tokenizer (recipe: benchmarks/train_long_passkey.py)"),
        seed=31,
        config=_shipped_config("tiny-llama-long"),
    ),
    "tiny-deepseek-v2": TinyModel(
        name="tiny-deepseek-v2",
        description=("DeepSeek-V2 with MLA trained on kvgate's gsm8k-format problems: hidden 256, 6 layers (1 dense, "
                     "5 MoE of 4 routed + 1 shared experts), 2 heads, kv_lora_rank 512, rope 64, nope 128, v 128 "
                     "(DeepSeek's MLA dimensions: every GPU MLA backend and CPU_MLA take it), 9.3 M parameters"),
        seed=12,
        config=_shipped_config("tiny-deepseek-v2"),
    ),
}


def default_cache_dir() -> Path:
    configured = os.environ.get("KVGATE_MODEL_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "kvgate" / "models"


def recipe_key(model: TinyModel) -> str:
    """A short hash of everything that decides the built bytes (for a shipped model: the shipped files)."""
    if model.shipped is not None:
        digest = hashlib.sha256()
        for name in SHIPPED_FILES:
            digest.update(name.encode() + b"\0" + (model.shipped / name).read_bytes())
        return digest.hexdigest()[:12]
    recipe = {
        "recipe_version": RECIPE_VERSION,
        "name": model.name,
        "config": model.config,
        "seed": model.seed,
        "vocab_size": VOCAB_SIZE,
        "special_tokens": SPECIAL_TOKENS,
        "corpus_sha256": hashlib.sha256(CORPUS_PATH.read_bytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def _lookup(name: str) -> TinyModel:
    if name not in MODELS:
        raise InputError(f"{PREFIX}{name}", "unknown tiny model", hint=unknown_name_hint(name, MODELS))
    return MODELS[name]


def model_dir(name: str, cache_dir: Path | None = None, *, kv_scales: bool = False) -> Path:
    """Where `ensure_model(name, cache_dir, kv_scales=...)` keeps (or will keep) the model."""
    model = _lookup(name)
    folder = (cache_dir or default_cache_dir()) / f"{model.name}-{recipe_key(model)}"
    if not kv_scales:
        return folder
    scales = _shipped_kv_scales(model)
    digest = hashlib.sha256(json.dumps(scales, sort_keys=True).encode()).hexdigest()[:8]
    return folder.with_name(f"{folder.name}-kv-scales-{digest}")


def _shipped_kv_scales(model: TinyModel) -> dict[str, float]:
    from kvgate.workloads.kv_scales import SCALES_FILE, shipped_scales

    scales = shipped_scales(model.shipped) if model.shipped is not None else None
    if not scales:
        raise InputError(f"{PREFIX}{model.name}", "ships no FP8 KV scales",
                         hint=f"its workload cannot say fp8_kv_scales = \"checkpoint\" without "
                              f"workloads/models/{model.name}/{SCALES_FILE} (python -m kvgate.workloads.kv_scales "
                              f"{model.name})")
    return scales


def ensure_model(name: str, cache_dir: Path | None = None, *, kv_scales: bool = False) -> Path:
    """The folder of tiny model `name`, built first if it is not in the cache yet. kv_scales: the variant an FP8
    checkpoint would be (the same weights, its shipped k/v scales and the compressed-tensors KV cache scheme)."""
    model = _lookup(name)
    target = model_dir(name, cache_dir, kv_scales=kv_scales)
    if (target / MARKER).is_file():
        return target
    source = ensure_model(name, cache_dir) if kv_scales else None
    if source is not None:
        return build_once(target, MARKER, lambda staging: _build_kv_scales_variant(model, source, staging))
    return build_once(target, MARKER, lambda staging: build(model, staging))


def build_once(target: Path, marker: str, build_into: Callable[[Path], None]) -> Path:
    """`target`, built by build_into(a staging folder beside it) and renamed into place unless it is there already
    (its `marker` file, written last, says it is whole); processes building the same folder at once each finish."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build_into(staging)
        for path in [staging, *staging.iterdir()]:  # mkdtemp and safetensors create owner-only modes
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            staging.rename(target)
        except OSError:
            # Another process finished the same build first (or a stale, incomplete folder is in the way).
            if not (target / marker).is_file():
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model(model: str, cache_dir: Path | None = None, *, kv_scales: bool = False) -> str:
    """`kvgate:<name>` -> the built folder (as a string; kv_scales: its FP8-checkpoint variant); any other model id
    or path unchanged."""
    if model.startswith(PREFIX):
        return str(ensure_model(model[len(PREFIX):], cache_dir, kv_scales=kv_scales))
    if kv_scales:
        raise InputError(model, "kvgate ships FP8 KV scales only for its own models",
                         hint="give the FP8 checkpoint as the workload's model, or drop fp8_kv_scales")
    return model


# ---- the build ---------------------------------------------------------------------------------------


def build(model: TinyModel, folder: Path) -> None:
    """Write the complete model into the (existing, empty) `folder`; the marker file comes last."""
    if model.shipped is not None:
        copy_shipped(model, folder)
        return
    write_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(model.config, indent=2, sort_keys=True) + "\n")
    generation = {
        "bos_token_id": model.config["bos_token_id"],
        "eos_token_id": model.config["eos_token_id"],
        "pad_token_id": model.config["pad_token_id"],
        "do_sample": False,
    }
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    write_weights(model, folder / "model.safetensors")
    parameters = sum(_numel(shape) for _, shape, _ in weight_specs(model.config))
    marker = {
        "name": model.name,
        "recipe": recipe_key(model),
        "recipe_version": RECIPE_VERSION,
        "description": model.description,
        "parameters": parameters,
        "built_by": "kvgate.workloads.tiny_models",
    }
    (folder / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def _build_kv_scales_variant(model: TinyModel, source: Path, folder: Path) -> None:
    from kvgate.workloads.kv_scales import write_variant

    scales = _shipped_kv_scales(model)
    write_variant(source, folder, scales)
    marker = json.loads((source / MARKER).read_text(encoding="utf-8"))
    marker.update(name=f"{model.name} (FP8 KV scales)", kv_scales=scales,
                  built_by="kvgate.workloads.kv_scales (the model, its shipped k/v scales, the KV cache scheme)")
    (folder / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def copy_shipped(model: TinyModel, folder: Path) -> None:
    """Copy a trained model's shipped files into `folder` (a few MB), then the marker."""
    assert model.shipped is not None
    for name in SHIPPED_FILES:
        shutil.copyfile(model.shipped / name, folder / name)
    parameters = sum(_numel(shape) for _, shape, _ in weight_specs(model.config))
    marker = {
        "name": model.name,
        "recipe": recipe_key(model),
        "description": model.description,
        "parameters": parameters,
        "built_by": "kvgate.workloads.tiny_models (copied from the shipped trained weights)",
    }
    (folder / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def train_tokenizer():
    """A byte-level BPE with VOCAB_SIZE tokens trained on kvgate's corpus; adds <s> in front of a text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS_PATH.read_text(encoding="utf-8").splitlines(keepends=True), trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def write_tokenizer(folder: Path) -> None:
    tokenizer = train_tokenizer()
    tokenizer.save(str(folder / "tokenizer.json"), pretty=True)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": True,
        "add_eos_token": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def weight_specs(config: dict) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(checkpoint name, shape, init) for every weight, in the checkpoint naming vLLM loads.

    init is "embedding" (standard normal), "linear" (normal with std 1/sqrt(fan in)) or "norm" (ones).
    """
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    yield "model.embed_tokens.weight", (vocab, hidden), "embedding"
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        yield f"{prefix}.input_layernorm.weight", (hidden,), "norm"
        yield f"{prefix}.post_attention_layernorm.weight", (hidden,), "norm"
        if config["model_type"] == "llama":
            head_dim, kv_heads = config["head_dim"], config["num_key_value_heads"]
            yield f"{prefix}.self_attn.q_proj.weight", (heads * head_dim, hidden), "linear"
            yield f"{prefix}.self_attn.k_proj.weight", (kv_heads * head_dim, hidden), "linear"
            yield f"{prefix}.self_attn.v_proj.weight", (kv_heads * head_dim, hidden), "linear"
            yield f"{prefix}.self_attn.o_proj.weight", (hidden, heads * head_dim), "linear"
            yield from _mlp(f"{prefix}.mlp", hidden, config["intermediate_size"])
        elif config["model_type"] == "deepseek_v2":
            rope, nope, v = config["qk_rope_head_dim"], config["qk_nope_head_dim"], config["v_head_dim"]
            rank = config["kv_lora_rank"]
            yield f"{prefix}.self_attn.q_proj.weight", (heads * (nope + rope), hidden), "linear"
            yield f"{prefix}.self_attn.kv_a_proj_with_mqa.weight", (rank + rope, hidden), "linear"
            yield f"{prefix}.self_attn.kv_a_layernorm.weight", (rank,), "norm"
            yield f"{prefix}.self_attn.kv_b_proj.weight", (heads * (nope + v), rank), "linear"
            yield f"{prefix}.self_attn.o_proj.weight", (hidden, heads * v), "linear"
            if layer < config["first_k_dense_replace"]:
                yield from _mlp(f"{prefix}.mlp", hidden, config["intermediate_size"])
            else:
                experts, expert_size = config["n_routed_experts"], config["moe_intermediate_size"]
                yield f"{prefix}.mlp.gate.weight", (experts, hidden), "linear"
                for expert in range(experts):
                    yield from _mlp(f"{prefix}.mlp.experts.{expert}", hidden, expert_size)
                shared_size = expert_size * config["n_shared_experts"]
                yield from _mlp(f"{prefix}.mlp.shared_experts", hidden, shared_size)
        else:
            raise ValueError(f"no weight layout for model_type {config['model_type']!r}")
    yield "model.norm.weight", (hidden,), "norm"
    yield "lm_head.weight", (vocab, hidden), "linear"


def _mlp(prefix: str, hidden: int, intermediate: int) -> Iterator[tuple[str, tuple[int, ...], str]]:
    yield f"{prefix}.gate_proj.weight", (intermediate, hidden), "linear"
    yield f"{prefix}.up_proj.weight", (intermediate, hidden), "linear"
    yield f"{prefix}.down_proj.weight", (hidden, intermediate), "linear"


def write_weights(model: TinyModel, path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator(device="cpu").manual_seed(model.seed)
    tensors = {}
    for name, shape, init in weight_specs(model.config):
        if init == "norm":
            values = torch.ones(shape, dtype=torch.float32)
        else:
            std = 1.0 if init == "embedding" else shape[-1] ** -0.5
            values = torch.randn(shape, generator=generator, dtype=torch.float32) * std
        tensors[name] = values.to(torch.bfloat16).contiguous()
    # One metadata key only: safetensors writes the metadata map in hash order, so several keys would
    # make the bytes differ from build to build.
    save_file(tensors, str(path), metadata={"format": "pt"})
