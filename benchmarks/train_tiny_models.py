"""Seeded recipe that trains kvgate's two tiny models to solve its gsm8k-format problems 0-shot.

What it does, in order (everything seeded; see SEED_* below):
1. generates training problems with `training_problems.py` (disjoint from kvgate's 240 TEST problems:
   other names, other wordings, other number tuples; the check runs and its result is printed);
2. trains one byte-level BPE tokenizer on the training text (digits split into single tokens; `<s>`,
   `</s>`, `<unk>`, `<pad>` = ids 0..3; the post-processor prepends `<s>`), shared by both models;
3. trains `tiny-llama` (transformers' LlamaForCausalLM) and `tiny-deepseek-v2` (transformers'
   DeepseekV2ForCausalLM: MLA with kv_lora_rank 512, rope 64, nope 128, v 128, q_lora_rank null; layer 0
   dense, the others MoE with 4 routed + 1 shared experts) on "Question: ...\\nAnswer:" -> " <worked
   answer>\\n#### N</s>", loss on the answer tokens only;
4. writes both Hugging Face folders (config.json, model.safetensors in bf16, tokenizer files,
   generation_config.json) under --out, and a `training_log.json` per model;
5. prints wall time, tokens/s and the machine (CPU model, cores, torch threads, or the CUDA device).

Device: CUDA if available, else CPU (same seeds; the numbers differ across devices, the recipe does not).
On CPU it trains in float32 (this machine's CPU has no AVX512-BF16, so bf16 autocast is not faster here);
on CUDA it uses bf16 autocast. Weights are saved in bf16.

Usage:  python train_tiny_models.py [--out out] [--models tiny-llama,tiny-deepseek-v2] [--steps N]
Run on a shared machine with `nice -n 10`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
from kvgate.workloads import training_problems as TP  # noqa: E402

SEED_DATA = 20261210        # training problems
SEED_TOKENIZER_SAMPLE = 7   # which problems train the tokenizer (BPE itself is deterministic)
SEED_MODEL = {"tiny-llama": 11, "tiny-deepseek-v2": 12}  # init + batch order

SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]
BOS_ID, EOS_ID, UNK_ID, PAD_ID = 0, 1, 2, 3
VOCAB_SIZE = 640
MAX_POSITIONS = 1024

STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-eval gsm8k strict-match, first match


# ---- tokenizer ---------------------------------------------------------------------------------------

def build_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    return tok


def write_tokenizer(tok, folder: Path) -> None:
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": MAX_POSITIONS,
           "clean_up_tokenization_spaces": False, "add_bos_token": True, "add_eos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")


def prompt_of(question: str) -> str:
    return f"Question: {question}\nAnswer:"  # lm-eval gsm8k doc_to_text


# ---- model configs -----------------------------------------------------------------------------------

def common_config(hidden: int, layers: int, heads: int, intermediate: int) -> dict:
    return dict(vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=intermediate,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                hidden_act="silu", max_position_embeddings=MAX_POSITIONS, initializer_range=0.02,
                rms_norm_eps=1e-6, use_cache=True, tie_word_embeddings=False, attention_bias=False,
                attention_dropout=0.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)


CALIBRATION_STEPS = 40
MODEL_SPECS = {
    "tiny-llama": dict(arch="llama", hidden=128, layers=4, heads=2, intermediate=512, steps=3000, lr=5e-3),
    "tiny-deepseek-v2": dict(arch="deepseek_v2", hidden=128, layers=3, heads=2, intermediate=512,
                             moe_intermediate=128, steps=2400, lr=5e-3),
}


def make_model(name: str, spec: dict, seed: int):
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    common = common_config(spec["hidden"], spec["layers"], spec["heads"], spec["intermediate"])
    if spec["arch"] == "llama":
        cfg = LlamaConfig(**common, head_dim=64, mlp_bias=False)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = DeepseekV2Config(
            **common, q_lora_rank=None, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
            v_head_dim=128, first_k_dense_replace=1, moe_layer_freq=1,
            moe_intermediate_size=spec["moe_intermediate"], n_routed_experts=4, n_shared_experts=1,
            num_experts_per_tok=2, n_group=1, topk_group=1, topk_method="greedy", scoring_func="softmax",
            norm_topk_prob=False, routed_scaling_factor=1.0, aux_loss_alpha=0.0, seq_aux=False)
        model = DeepseekV2ForCausalLM(cfg)
    return model


# ---- data --------------------------------------------------------------------------------------------

def encode_examples(tok, problems) -> list[tuple[list[int], list[int]]]:
    """(token ids, labels) per problem: <s> prompt, ' ' answer, </s>; labels only on the answer + </s>."""
    prompts = tok.encode_batch([prompt_of(p.question) for p in problems])
    answers = tok.encode_batch([" " + p.answer for p in problems], add_special_tokens=False)
    out = []
    for pe, ae in zip(prompts, answers, strict=True):
        ids = pe.ids + ae.ids + [EOS_ID]
        out.append((ids, [-100] * len(pe.ids) + ae.ids + [EOS_ID]))
    return out


def encode_drills(tok, lines, rows: int, seed: int, row_tokens: int = 110) -> list[tuple[list[int], list[int]]]:
    """Arithmetic drill rows: <s> then 'a op b = c' lines (steps of training problems) up to ~row_tokens;
    labels only on the right-hand sides and their newlines."""
    rng = random.Random(seed)
    lhs_ids = tok.encode_batch([left for left, _ in lines], add_special_tokens=False)
    rhs_ids = tok.encode_batch([r + "\n" for _, r in lines], add_special_tokens=False)
    out = []
    for _ in range(rows):
        ids, lab = [BOS_ID], [-100]
        while True:
            i = rng.randrange(len(lines))
            a, b = lhs_ids[i].ids, rhs_ids[i].ids
            if len(ids) + len(a) + len(b) > row_tokens:
                break
            ids += a + b
            lab += [-100] * len(a) + b
        out.append((ids, lab))
    return out


def make_batches(examples, tokens_per_batch: int, seed: int) -> list[list[int]]:
    """Length-bucketed batches of about tokens_per_batch (padded) tokens, in a seeded random order."""
    rng = random.Random(seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    batches = []
    chunk = 64 * max(1, tokens_per_batch // 200)
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: len(examples[i][0]))
        cur: list[int] = []
        longest = 0
        for i in part:
            n = len(examples[i][0])
            if cur and max(longest, n) * (len(cur) + 1) > tokens_per_batch:
                batches.append(cur)
                cur, longest = [], 0
            cur.append(i)
            longest = max(longest, n)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(examples, idx: list[int]):
    longest = max(len(examples[i][0]) for i in idx)
    ids = torch.full((len(idx), longest), PAD_ID, dtype=torch.long)
    labels = torch.full((len(idx), longest), -100, dtype=torch.long)
    mask = torch.zeros((len(idx), longest), dtype=torch.long)
    for row, i in enumerate(idx):
        seq, lab = examples[i]
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, :len(seq)] = torch.tensor(lab)
        mask[row, :len(seq)] = 1
    return ids, labels, mask


# ---- training ----------------------------------------------------------------------------------------

def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_model(name, model, examples, *, steps, tokens_per_batch, lr, warmup, seed, device, log_every=50,
                time_limit=None, monitor=None, monitor_every=0, time_budget=None):
    """time_budget (seconds): after CALIBRATION_STEPS steps, the step count is fixed from the measured speed so
    that training (and its cosine schedule) ends within the budget; the count is printed, so a rebuild can pass
    it as --steps and follow the same recipe on any device."""
    torch.manual_seed(seed)
    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    batches = []
    epoch = 0
    # with a time budget the step count is only known after calibration: build the batches for that first
    while len(batches) < (min(steps, CALIBRATION_STEPS + 1) if time_budget else steps):
        batches += make_batches(examples, tokens_per_batch, seed * 1000 + epoch)
        epoch += 1
    use_amp = device.type == "cuda"
    log = []
    t0 = time.time()
    c0 = time.process_time()
    seen_tokens = 0
    loss_acc, n_acc = 0.0, 0
    monitor_s = 0.0
    step = 0
    while step < steps:
        if time_budget and step == CALIBRATION_STEPS // 4:
            t_warm = time.time()  # the first steps carry one-off costs (CUDA context, kernel selection)
        if time_budget and step == CALIBRATION_STEPS:
            per_step = (time.time() - t_warm) / (CALIBRATION_STEPS - CALIBRATION_STEPS // 4)
            left = time_budget - (time.time() - t0)
            steps = max(CALIBRATION_STEPS + 1, min(steps, CALIBRATION_STEPS + int(left / per_step)))
            warmup = min(warmup, max(1, steps // 10))
            print(f"[{name}] {per_step * 1000:.1f} ms a step: {steps} steps fit the {time_budget:.0f} s budget",
                  flush=True)
            while len(batches) < steps:
                batches += make_batches(examples, tokens_per_batch, seed * 1000 + epoch)
                epoch += 1
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        ids, labels, mask = (t.to(device) for t in collate(examples, batches[step]))
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        seen_tokens += int(mask.sum())
        loss_acc += float(loss.detach())
        n_acc += 1
        if (step + 1) % log_every == 0 or step == steps - 1:
            el = time.time() - t0 - monitor_s
            entry = {"step": step + 1, "loss": round(loss_acc / n_acc, 4), "lr": round(lr_at(step, steps, lr, warmup), 6),
                     "elapsed_s": round(el, 1), "cpu_s": round(time.process_time() - c0, 1), "tokens": seen_tokens,
                     "tokens_per_s": round(seen_tokens / el)}
            if monitor and monitor_every and ((step + 1) % monitor_every == 0 or step == steps - 1):
                tm = time.time()
                entry["dev_strict_match"] = monitor(model)
                monitor_s += time.time() - tm
                model.train()
            log.append(entry)
            print(f"[{name}] " + json.dumps(entry), flush=True)
            loss_acc, n_acc = 0.0, 0
        if time_limit and time.time() - t0 > time_limit:
            print(f"[{name}] time limit reached at step {step + 1}", flush=True)
            break
        step += 1
    return log, time.time() - t0 - monitor_s, seen_tokens


# ---- evaluation (HF greedy, 0-shot, lm-eval's strict-match regex) -------------------------------------

@torch.no_grad()
def hf_greedy(model, tok, questions: list[str], max_new_tokens=256, batch_size=64, device=None):
    device = device or next(model.parameters()).device
    model.eval()
    outs = []
    for start in range(0, len(questions), batch_size):
        enc = [tok.encode(prompt_of(q)).ids for q in questions[start:start + batch_size]]
        longest = max(map(len, enc))
        ids = torch.full((len(enc), longest), PAD_ID, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, e in enumerate(enc):  # left padding
            ids[r, longest - len(e):] = torch.tensor(e)
            mask[r, longest - len(e):] = 1
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
        for r in range(len(enc)):
            toks = gen[r, longest:].tolist()
            if EOS_ID in toks:
                toks = toks[:toks.index(EOS_ID)]
            outs.append(tok.decode(toks).split("Question:")[0])
    return outs


def strict_match(text: str):
    m = STRICT_RE.search(text)
    if not m:
        return None
    return m.group(1).replace(",", "").replace("$", "").rstrip(".")


def score(completions, problems) -> dict:
    per = {}
    correct = []
    for c, p in zip(completions, problems, strict=True):
        ok = strict_match(c) == str(p.result)
        correct.append(ok)
        per.setdefault(p.template, []).append(ok)
    return {"strict_match": sum(correct) / len(correct), "correct": correct,
            "per_template": {t: round(sum(v) / len(v), 3) for t, v in per.items()}}


def load_test():
    """kvgate's 240 TEST problems (questions, and results from the generator)."""
    return TP.G.generate_split("test")


# ---- saving ------------------------------------------------------------------------------------------

def save_folder(model, tok, folder: Path, info: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu").to(torch.bfloat16)
    model.config.use_cache = True
    model.save_pretrained(str(folder), safe_serialization=True)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg["dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    write_tokenizer(tok, folder)
    (folder / "training_log.json").write_text(json.dumps(info, indent=1) + "\n")


def machine() -> str:
    if torch.cuda.is_available():
        return f"CUDA {torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu}, {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}"


def train_one(name: str, spec: dict, args, examples, tok_json: str, dev, threads: int, disjoint: dict) -> dict:
    """Train, save and HF-evaluate one model (runs in its own process on CPU)."""
    from tokenizers import Tokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(threads)
    tok = Tokenizer.from_str(tok_json)
    model = make_model(name, spec, SEED_MODEL[name])
    n_params = sum(p.numel() for p in model.parameters())
    steps = args.steps or spec["steps"]
    lr = args.lr or spec["lr"]
    print(f"[{name}] params {n_params}; steps {steps}; lr {lr}; threads {torch.get_num_threads()}; "
          f"spec {json.dumps(spec)}", flush=True)

    def monitor(m):
        comps = hf_greedy(m, tok, [p.question for p in dev], max_new_tokens=120, device=device)
        return round(score(comps, dev)["strict_match"], 3)

    log, secs, tokens = train_model(name, model, examples, steps=steps, tokens_per_batch=args.tokens_per_batch,
                                    lr=lr, warmup=min(100, steps // 10), seed=SEED_MODEL[name], device=device,
                                    time_limit=args.time_limit, monitor=monitor if dev else None,
                                    monitor_every=args.monitor_every, time_budget=args.time_budget)
    steps = log[-1]["step"] if log else steps  # the calibrated count, when a time budget fixed it
    info = {"name": name, "params": n_params, "spec": spec, "steps": steps, "lr": lr,
            "tokens_per_batch": args.tokens_per_batch, "train_seconds": round(secs, 1), "train_tokens": tokens,
            "tokens_per_s": round(tokens / secs), "machine": machine(), "torch": torch.__version__,
            "seeds": {"data": SEED_DATA, "model": SEED_MODEL[name]}, "problems": args.problems,
            "drill_rows": args.drill_rows, "style": args.style, "disjointness": disjoint, "log": log}
    folder = Path(args.out) / name
    from transformers import PreTrainedTokenizerFast  # noqa: F401  (folder must load as this class)

    save_folder(model, tok, folder, info)
    size = (folder / "model.safetensors").stat().st_size
    print(f"[{name}] trained {secs:.0f} s, {tokens} tokens, {tokens / secs:.0f} tokens/s; saved {folder} "
          f"({size / 1e6:.2f} MB)", flush=True)
    result = {"params": n_params, "train_seconds": round(secs), "tokens_per_s": round(tokens / secs),
              "safetensors_bytes": size}
    if args.eval:
        from transformers import AutoModelForCausalLM

        test = load_test()[:args.eval]
        m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).to(device)
        t0 = time.time()
        comps = hf_greedy(m, tok, [p.question for p in test], device=device)
        sc = score(comps, test)
        print(f"[{name}] HF greedy (bf16 weights) strict-match {sc['strict_match']:.3f} on {len(test)} test "
              f"problems ({time.time() - t0:.0f} s); per template {json.dumps(sc['per_template'])}", flush=True)
        result["hf_test_strict_match"] = sc["strict_match"]
        (folder / "hf_eval.json").write_text(json.dumps(
            {"strict_match": sc["strict_match"], "per_template": sc["per_template"], "correct": sc["correct"],
             "completions": comps}, indent=1) + "\n")
    return result


def _worker(queue, *a):
    try:
        queue.put((a[0], train_one(*a)))
    except BaseException as e:  # report, do not hang the parent
        import traceback

        traceback.print_exc()
        queue.put((a[0], {"error": repr(e)}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="reports/trained-models")
    ap.add_argument("--models", default="tiny-llama,tiny-deepseek-v2")
    ap.add_argument("--problems", type=int, default=72000, help="training word problems")
    ap.add_argument("--drill-rows", type=int, default=36000, help="arithmetic drill rows (0: none)")
    ap.add_argument("--steps", type=int, default=None, help="override the per-model step count")
    ap.add_argument("--lr", type=float, default=None, help="override the per-model peak learning rate")
    ap.add_argument("--style", default="partial", help="worked-step number format: rev (default) or partial")
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--time-limit", type=float, default=None, help="stop a model after this many seconds")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="fit the step count (and the LR schedule) to this many seconds of training")
    ap.add_argument("--eval", type=int, default=240, help="HF greedy eval on this many test problems (0: none)")
    ap.add_argument("--dev", type=int, default=160, help="test-like dev problems for monitoring (0: none)")
    ap.add_argument("--monitor-every", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads per model (default: cores / models trained at once)")
    ap.add_argument("--sequential", action="store_true", help="on CPU, train the models one after the other")
    ap.add_argument("--spec", default=None, help="JSON overriding MODEL_SPECS entries (experiments)")
    args = ap.parse_args(argv)

    t_start = time.time()
    cuda = torch.cuda.is_available()
    names = args.models.split(",")
    parallel = not cuda and not args.sequential and len(names) > 1 and (os.cpu_count() or 1) >= len(names)
    threads = max(1, (os.cpu_count() or 1) // len(names)) if parallel else (os.cpu_count() or 1)
    threads = args.threads or threads
    random.seed(0)
    torch.manual_seed(0)
    print(f"machine: {machine()}; torch {torch.__version__}; device {'cuda' if cuda else 'cpu'}; "
          f"{'parallel, ' + str(threads) + ' thread(s) per model' if parallel else 'sequential'}", flush=True)

    # 1. data + disjointness check
    TP.check_reimplementation()
    problems = TP.generate_training(args.problems, seed=SEED_DATA, style=args.style)
    disjoint = TP.check_disjoint(problems)
    print("disjointness check passed:", json.dumps(disjoint), flush=True)
    # 2. tokenizer (shared)
    rng = random.Random(SEED_TOKENIZER_SAMPLE)
    sample = rng.sample(problems, min(8000, len(problems)))
    tok = build_tokenizer([prompt_of(p.question) + " " + p.answer for p in sample])
    examples = encode_examples(tok, problems)
    if args.drill_rows:
        drill_src = TP.generate_training(max(1, args.drill_rows // 2), seed=SEED_DATA + 1, style=args.style)
        examples += encode_drills(tok, TP.drill_lines(drill_src), args.drill_rows, seed=SEED_DATA + 2)
    lengths = sorted(len(e[0]) for e in examples[:len(problems)])
    ans_lengths = sorted(sum(x != -100 for x in e[1]) for e in examples[:len(problems)])
    print(f"tokenizer: vocab {tok.get_vocab_size()}; {len(problems)} problems + {args.drill_rows} drill rows; "
          f"problem tokens median {lengths[len(lengths) // 2]} max {lengths[-1]}; answer tokens (incl. </s>) "
          f"max {ans_lengths[-1]}; data ready after {time.time() - t_start:.0f} s", flush=True)
    dev = TP.dev_problems(args.dev, seed=SEED_DATA + 3) if args.dev else []

    specs = {k: dict(v) for k, v in MODEL_SPECS.items()}
    if args.spec:
        for k, v in json.loads(args.spec).items():
            specs[k] = {**specs[k], **v}
    tok_json = tok.to_str()
    results = {}
    if parallel:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(queue, n, specs[n], args, examples, tok_json, dev, threads,
                                                    disjoint)) for n in names]
        for p in procs:
            p.start()
        for _ in procs:
            n, r = queue.get()
            results[n] = r
        for p in procs:
            p.join()
    else:
        for n in names:
            results[n] = train_one(n, specs[n], args, examples, tok_json, dev, threads, disjoint)
    total = time.time() - t_start
    summary = {"total_wall_seconds": round(total), "machine": machine(), "parallel": parallel,
               "threads_per_model": threads, "results": results}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "run_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"total wall time {total:.0f} s ({total / 60:.1f} min) on {machine()}; {json.dumps(results)}", flush=True)


if __name__ == "__main__":
    main()
