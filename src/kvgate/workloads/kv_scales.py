"""The k/v scales an FP8 checkpoint ships, for kvgate's tiny Llama: the workload that reaches vLLM's scale loaders.

FP8 checkpoints made by llm-compressor declare their KV cache in `config.json` (compressed-tensors
`quantization_config.kv_cache_scheme`: 8-bit float, one scale per tensor, static) and store one `k_scale` and one
`v_scale` per attention layer (`model.layers.N.self_attn.k_scale`). vLLM loads them
(model_executor/layers/quantization/compressed_tensors, weight_utils' scale-name remapping, the KV-cache quant
method) and every FP8 cache write and read uses them; without such a checkpoint the scales are 1.0 and those
loaders never run. A workload with `fp8_kv_scales = "checkpoint"` (matrix/workloads.toml) runs its FP8 cells on
this variant of its model: the same weights, plus the scales; its auto cell runs the model without them (a checkpoint
that declares a kv_cache_scheme makes vLLM's `auto` an FP8 cache), so FP8 vs auto still compares the same weights.

The scales are calibrated once, as llm-compressor does in spirit: the largest |K| and |V| each layer writes on
training problems (never test questions), over FP8 e4m3's largest value (448). K is cached after the rotary
embedding, which mixes the two halves of each head; the rotation keeps each pair's norm, so the pair norm of the
projection bounds |K| at every position. They are shipped (`workloads/models/<name>/kv_scales.json`) so that every
host builds the same bytes; `python -m kvgate.workloads.kv_scales tiny-llama` calibrates them again (torch and
transformers, about 5 s) and tests/test_kv_scales.py checks the shipped ones are what it gives.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

SCALES_FILE = "kv_scales.json"  # shipped beside a trained model's weights
WEIGHTS_FILE = "kv_scales.safetensors"  # written into the variant; vLLM loads every *.safetensors of the folder
FP8_E4M3_MAX = 448.0
KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
QUANTIZATION_CONFIG = {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {}, "ignore": [],
                       "kv_cache_scheme": KV_CACHE_SCHEME}
CALIBRATION_PROBLEMS = 64
CALIBRATION_SEED = 20261202  # training problems drawn for calibration only


def shipped_scales(model_folder: Path) -> dict[str, float] | None:
    """The per-layer scales shipped in `model_folder` (name -> value), or None when it ships none."""
    path = model_folder / SCALES_FILE
    if not path.is_file():
        return None
    document = json.loads(path.read_text(encoding="utf-8"))
    return {str(name): float(value) for name, value in document["scales"].items()}


def calibration_texts(count: int = CALIBRATION_PROBLEMS, seed: int = CALIBRATION_SEED) -> list[str]:
    """Training problems with their worked answers, in the task's prompt format."""
    from kvgate.workloads.training_problems import generate_training

    return [f"Question: {p.question}\nAnswer: {p.answer}" for p in generate_training(count, seed=seed)]


def calibrate(model_folder: Path, texts: list[str]) -> dict[str, float]:
    """Per-layer k_scale and v_scale of a Llama-style model: max |K| (rotary pair norm) and max |V| over `texts`,
    divided by FP8 e4m3's largest value."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32)
    head_dim = model.config.head_dim
    largest: dict[str, float] = {}

    def observe(name: str, rotary: bool):
        def hook(module, inputs, output):
            heads = output.detach().float().reshape(*output.shape[:-1], -1, head_dim)
            if rotary:  # rotate_half pairs element i with i + head_dim/2
                half = head_dim // 2
                heads = torch.sqrt(heads[..., :half] ** 2 + heads[..., half:] ** 2)
            largest[name] = max(largest.get(name, 0.0), float(heads.abs().max()))
        return hook

    handles = []
    for index, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{index}.self_attn"
        handles.append(layer.self_attn.k_proj.register_forward_hook(observe(f"{prefix}.k_scale", True)))
        handles.append(layer.self_attn.v_proj.register_forward_hook(observe(f"{prefix}.v_scale", False)))
    with torch.no_grad():
        for text in texts:
            model(**tokenizer(text, return_tensors="pt"))
    for handle in handles:
        handle.remove()
    return {name: float(f"{value / FP8_E4M3_MAX:.6g}") for name, value in sorted(largest.items())}


def write_variant(source: Path, target: Path, scales: Mapping[str, float]) -> None:
    """Copy the model in `source` into the (existing, empty) `target` as an FP8 checkpoint would ship it: its
    config declares the KV cache scheme, and `kv_scales.safetensors` holds one float32 scale per layer and
    tensor. The marker file (if any) is left to the caller."""
    import torch
    from safetensors.torch import save_file

    for path in sorted(source.iterdir()):
        if path.is_file() and path.name not in ("config.json", "kvgate-model.json"):
            shutil.copyfile(path, target / path.name)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config["quantization_config"] = QUANTIZATION_CONFIG
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tensors = {name: torch.tensor(value, dtype=torch.float32) for name, value in sorted(scales.items())}
    save_file(tensors, str(target / WEIGHTS_FILE), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    """`python -m kvgate.workloads.kv_scales NAME`: calibrate NAME's shipped scales again and write them."""
    from kvgate.workloads import tiny_models

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kvgate.workloads.kv_scales TINY_MODEL_NAME", file=sys.stderr)
        return 2
    model = tiny_models.MODELS[args[0]]
    assert model.shipped is not None, f"{model.name} ships no trained weights"
    scales = calibrate(tiny_models.ensure_model(model.name), calibration_texts())
    document = {
        "about": ("FP8 e4m3 per-tensor KV scales of this model (compressed-tensors kv_cache_scheme), calibrated by "
                  "kvgate.workloads.kv_scales: max |K| (rotary pair norm) and max |V| per layer over "
                  f"{CALIBRATION_PROBLEMS} training problems (seed {CALIBRATION_SEED}) / {FP8_E4M3_MAX:g}"),
        "kv_cache_scheme": KV_CACHE_SCHEME,
        "scales": scales,
    }
    (model.shipped / SCALES_FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(scales, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
