"""kvgate's held-out question pool: the gsm8k-format problems its tiny models are judged on, none of which they
trained on, in one fixed order, versioned.

A comparison needs the number of questions the policy's power asks (hundreds to thousands, matrix/policy.toml),
where the test split has 240. The pool continues it: problems drawn in order from kvgate.workloads.gsm8k_problems
(the test wording, the test names, the test split's seed), round-robin over its 16 templates as the test split
cycles them, passing over a question already drawn and every candidate whose (template, numbers) tuple any training problem has: the 100,000 the shipped models were trained on (their training_log.json: count,
seed, style; kvgate.workloads.training_problems). Training wordings never repeat a whole test question, and its
names are other names, so a kept problem shares nothing with training but the templates' arithmetic. The first
240 are the test split itself (training passed over their tuples when it was drawn), so the pool extends what
kvgate always asked.

Shipped as data/gsm8k_local/heldout.jsonl with heldout.json (version, size, seeds, sha256); `pool()` checks the
file against its manifest. `python -m kvgate.workloads.heldout_pool` regenerates both (about 6 s: the training
problems are regenerated to know their tuples); tests/test_heldout_pool.py regenerates and compares them.
Passing over trained tuples keeps the rarer tuples of each template, and templates with few numbers to draw run
out: five keep about 30 problems each, so past the first ~450 questions the pool leans towards the other
templates. Both sides of every comparison answer the same questions, so the paired tests stay valid; an accuracy
floor is measured on the questions it is judged on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kvgate import InputError
from kvgate.workloads import gsm8k_problems

VERSION = "kvgate-gsm8k-heldout/1"  # any change to the problems or their order: bump it
SIZE = 4000
DATA_DIR = gsm8k_problems.DATA_DIR
POOL_FILE = DATA_DIR / "heldout.jsonl"
MANIFEST_FILE = DATA_DIR / "heldout.json"
MODELS_DIR = Path(__file__).resolve().parent / "models"
TRAINED_BY = "tiny-llama"  # both shipped models trained on the same problems (tests/test_tiny_models.py)


def training_recipe() -> dict:
    """count, seed and style of the problems the shipped models trained on (their training log)."""
    log = json.loads((MODELS_DIR / TRAINED_BY / "training_log.json").read_text(encoding="utf-8"))
    return {"count": log["problems"], "seed": log["seeds"]["data"], "style": log["style"]}


def generate(size: int = SIZE) -> list[gsm8k_problems.Problem]:
    """The pool, regenerated (slow: the training problems are regenerated to know their tuples). Round-robin over
    the templates, each one's kept candidates in draw order, as the test split cycles them; a template whose tuples
    training nearly used up (reading_days keeps about 30) drops out of the rotation when it runs out."""
    from kvgate.workloads import training_problems as training

    recipe = training_recipe()
    trained = {p.key for p in training.generate_training(recipe["count"], seed=recipe["seed"], style=recipe["style"])}
    _, seed = gsm8k_problems.SPLITS["test"]
    templates = [t.__name__ for t in gsm8k_problems.TEMPLATES]
    batch = size * 4
    while True:
        problems = gsm8k_problems.generate(batch, seed)
        slots = training.draw_slots(batch, seed, training.TEST_NAMES, training.SHOP_ITEMS, training.COUNTED)
        kept: dict[str, list[gsm8k_problems.Problem]] = {t: [] for t in templates}
        asked: set[str] = set()  # a question drawn twice (same template, numbers and name) is asked once
        for problem, drawn in zip(problems, slots, strict=True):
            if drawn.key() not in trained and problem.question not in asked:
                asked.add(problem.question)
                kept[problem.template].append(problem)
        rounds = max(len(v) for v in kept.values())
        pool = [kept[t][r] for r in range(rounds) for t in templates if r < len(kept[t])]
        if len(pool) >= size:
            return pool[:size]
        batch *= 2


def manifest(problems: list[gsm8k_problems.Problem]) -> dict:
    text = gsm8k_problems.to_jsonl(problems)
    _, seed = gsm8k_problems.SPLITS["test"]
    return {"version": VERSION, "size": len(problems), "seed": seed, "training": training_recipe(),
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def write(folder: Path = DATA_DIR) -> tuple[Path, Path]:
    problems = generate()
    (folder / POOL_FILE.name).write_text(gsm8k_problems.to_jsonl(problems), encoding="utf-8")
    (folder / MANIFEST_FILE.name).write_text(json.dumps(manifest(problems), indent=1) + "\n", encoding="utf-8")
    return folder / POOL_FILE.name, folder / MANIFEST_FILE.name


def pool() -> list[dict[str, str]]:
    """The shipped pool, in order, as gsm8k records; InputError when the file is not what its manifest says."""
    try:
        data = POOL_FILE.read_bytes()
        expected = json.loads(MANIFEST_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InputError(str(POOL_FILE), f"cannot read the held-out pool ({error})",
                         hint="Reinstall kvgate, or regenerate it: python -m kvgate.workloads.heldout_pool") from None
    if hashlib.sha256(data).hexdigest() != expected.get("sha256") or expected.get("version") != VERSION:
        raise InputError(str(POOL_FILE), f"the held-out pool does not match its manifest ({MANIFEST_FILE.name})",
                         hint="Regenerate it: python -m kvgate.workloads.heldout_pool")
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def draw(count: int) -> list[dict[str, str]]:
    """The first `count` problems of the pool (all of it when count exceeds it)."""
    if count < 1:
        raise ValueError(f"draw at least one question, not {count}")
    return pool()[:count]


if __name__ == "__main__":
    for path in write():
        print(path)
