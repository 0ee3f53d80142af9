"""The hub models' question pool: gsm8k's test split followed by its train split, as one lm-eval task.

lm-eval's `gsm8k` task holds 1,319 questions (the test split); the policy's power target asks about 3,000 of a hub
model (matrix/policy.toml [accuracy]). `write_task(folder)` loads the dataset lm-eval's installed gsm8k.yaml names
(its `dataset_path` and `dataset_name`: openai/gsm8k, main) with the `datasets` library, from the Hugging Face cache
`kvgate prefetch` filled (the runners run with the hub offline), and writes

    kvgate_gsm8k_test_train_test.jsonl   the test split in its order, then the train split in its order (8,792):
                                         the first 1,319 questions are exactly lm-eval gsm8k's
    kvgate_gsm8k_test_train_train.jsonl  the train split, the few-shot source (gsm8k.yaml's `fewshot_split: train`)

and a task YAML that `include`s lm-eval's gsm8k.yaml (prompt, few-shot format, metric and filters are lm-eval's) and
swaps only the data, as kvgate.workloads.gsm8k_local does for kvgate's own models.

Train questions may be contaminated for real models (they may have trained on them); the paired comparisons the
gate makes (FP8 vs auto, head vs base) stay valid, since both sides answer the same questions with the same shots.

The task's class (`PoolTask`) draws each question's few-shot examples in a way of its own, for two reasons. lm-eval
0.4.13 draws them for one question after another from one random stream (api/samplers.py ContextSampler), so a
question's shots depend on which questions were asked before it in the same call; a candidate cell that answers in
looks (kvgate.runners.stages.looks: one lm-eval call per look) would then see other prompts than its reference cell,
which answers in one call, and the gate's pairing refuses prompts that differ. And lm-eval drops a question from its
own shots only when the shots come from the test split (api/task.py `fewshot_context` passes `eval_doc` only then),
which is not so here: train questions are in both. So PoolTask draws a question's shots from the few-shot split
without the question itself, with a random generator seeded by lm-eval's few-shot seed and the question's text: the
same shots whichever call asks it, never itself. (So the pool's prompts are not lm-eval gsm8k's, whose first 1,319
questions it asks: the same questions with other, equally random, shots.)
Run it with `lm_eval ... --include_path <folder> --tasks kvgate_gsm8k_test_train`.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

from kvgate import InputError

TASK_NAME = "kvgate_gsm8k_test_train"
YAML_NAME = f"{TASK_NAME}.yaml"
SPLITS = ("test", "train")  # the pool's order: the test split first
PREFETCH_HINT = ("Fill the Hugging Face cache with `kvgate prefetch` (on a machine with network access, the same "
                 "HF_HOME), then copy it to this runner (README: \"Offline operation\")")


def lm_eval_dataset() -> tuple[str, str | None]:
    """The dataset lm-eval's installed gsm8k task reads: (dataset_path, dataset_name)."""
    import yaml

    from kvgate.workloads.gsm8k_local import lm_eval_gsm8k_yaml

    config = yaml.safe_load(lm_eval_gsm8k_yaml().read_text(encoding="utf-8"))
    return str(config["dataset_path"]), config.get("dataset_name")


def load_splits(source: str | None = None) -> dict[str, list[dict[str, str]]]:
    """gsm8k's test and train splits as {"question", "answer"} records, each in its order. `source` is the dataset's
    place for `datasets.load_dataset` (default: lm-eval's dataset_path, read from the cache when the hub is offline);
    a dataset that cannot be loaded is an InputError naming `kvgate prefetch`."""
    import datasets

    path, name = lm_eval_dataset()
    place = source or path
    try:
        loaded = datasets.load_dataset(place, name)
        splits = {split: [{"question": str(row["question"]), "answer": str(row["answer"])} for row in loaded[split]]
                  for split in SPLITS}
    except Exception as error:  # datasets raises many kinds (offline, missing config, missing split, bad files)
        detail = str(error).strip().splitlines()[0].rstrip(". ") if str(error).strip() else ""
        raise InputError(place, f"gsm8k ({name}) could not be loaded: {type(error).__name__}"
                         + (f": {detail}" if detail else ""), hint=PREFETCH_HINT) from None
    empty = [split for split in SPLITS if not splits[split]]
    if empty:
        raise InputError(place, f"gsm8k ({name}) has no questions in its {' and '.join(empty)} split",
                         hint=PREFETCH_HINT)
    return splits


def data_file(folder: Path, split: str) -> Path:
    return Path(folder) / f"{TASK_NAME}_{split}.jsonl"


def task_yaml(include: Path, train: Path, test: Path) -> str:
    """The task YAML text: lm-eval's gsm8k over the pool, its few-shot examples drawn by PoolTask."""
    from kvgate.workloads import gsm8k_local

    return gsm8k_local.task_yaml(include, train, test, task=TASK_NAME, written_by=__name__,
                                 over="gsm8k's test split followed by its train split",
                                 task_class=f"{__name__}.PoolTask")


def write_task(folder: Path, *, source: str | None = None) -> str:
    """Write the pool's data and task YAML into `folder`; returns the task name for `lm_eval --tasks`."""
    from kvgate.workloads.gsm8k_local import lm_eval_gsm8k_yaml

    include = lm_eval_gsm8k_yaml()
    splits = load_splits(source)
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    pool = splits["test"] + splits["train"]
    for split, records in (("test", pool), ("train", splits["train"])):
        data_file(folder, split).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                            encoding="utf-8")
    (folder / YAML_NAME).write_text(task_yaml(include, data_file(folder, "train"), data_file(folder, "test")),
                                    encoding="utf-8")
    return TASK_NAME


def test_questions(folder: Path) -> int:
    """How many questions the pool written into `folder` holds (0 when there is none)."""
    try:
        with open(data_file(folder, "test"), encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())
    except OSError:
        return 0


@functools.cache
def _pool_task_class() -> type:
    import random

    from lm_eval.api.samplers import ContextSampler
    from lm_eval.api.task import ConfigurableTask

    class PerQuestionShots(ContextSampler):
        """Shots for one question at a time, drawn by its own text and the few-shot seed, the question left out."""

        question: str | None = None
        seed: int | None = None

        def set_rnd(self, rnd: int | None) -> ContextSampler:
            self.seed = rnd
            return super().set_rnd(rnd)

        def sample(self, n: int, eval_doc: dict[str, Any] | None = None, df: Any = None, **kwargs: Any) -> list:
            if df:
                self.df = df
            if self.question is None:
                return list(super().sample(n, eval_doc=eval_doc, **kwargs))
            others = [doc for doc in self.fewshot_docs() if doc.get("question") != self.question]
            return random.Random(f"{self.seed}:{self.question}").sample(others, n)

    class PoolTask(ConfigurableTask):
        """lm-eval's gsm8k task over the pool, each question's shots its own (PerQuestionShots)."""

        def __init__(self, config: dict | None = None, **kwargs: Any) -> None:  # lm-eval passes `config` by name
            # lm-eval 0.4.13 hands a `class:` task its whole YAML, the `class` key included, which TaskConfig refuses
            config = {key: value for key, value in (config or {}).items() if key != "class"}
            super().__init__(config=config, **kwargs)
            if hasattr(self, "sampler"):
                self.sampler = PerQuestionShots(self.sampler.df, rnd=None)

        def fewshot_context(self, doc: dict, num_fewshot: int, *args: Any, **kwargs: Any) -> Any:
            if hasattr(self, "sampler"):
                self.sampler.question = doc.get("question")
            return super().fewshot_context(doc, num_fewshot, *args, **kwargs)

    return PoolTask


def __getattr__(name: str) -> Any:
    """`PoolTask`, the task class the YAML names; built on first use, since it imports lm-eval."""
    if name == "PoolTask":
        return _pool_task_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.workloads.gsm8k_pool", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the task YAML and its data are written")
    parser.add_argument("--source", help="the dataset's place for datasets.load_dataset (default: lm-eval's)")
    args = parser.parse_args(argv)
    try:
        write_task(args.folder, source=args.source)
    except InputError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    print(f"{TASK_NAME}: {test_questions(args.folder)} questions in {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
