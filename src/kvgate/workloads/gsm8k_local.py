"""kvgate's local copy of lm-eval's gsm8k task, for runs that cannot reach the Hugging Face hub.

`write_task(folder)` writes a task YAML that `include`s lm-eval's own installed `gsm8k.yaml` (so the prompt,
the 5-shot format, the exact_match metric and the strict-match / flexible-extract filters are lm-eval's,
for whatever lm-eval version is installed) and only swaps the data: kvgate's generated problems
(`kvgate.workloads.gsm8k_problems`), copied next to the YAML as `train.jsonl` / `test.jsonl` in gsm8k's format.
Run it with `lm_eval ... --include_path <folder> --tasks kvgate_gsm8k_local`.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from kvgate import InputError

TASK_NAME = "kvgate_gsm8k_local"
DATA_DIR = Path(__file__).resolve().parent / "data" / "gsm8k_local"
SPLITS = ("train", "test")
YAML_NAME = f"{TASK_NAME}.yaml"


def data_files() -> dict[str, Path]:
    """The shipped split files: split -> path."""
    return {split: DATA_DIR / f"{split}.jsonl" for split in SPLITS}


def load(split: str) -> list[dict[str, str]]:
    """The problems of one split, as gsm8k records {"question", "answer"}."""
    path = data_files()[split]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def lm_eval_gsm8k_yaml() -> Path:
    """The gsm8k task file of the installed lm-eval (found without importing lm-eval)."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("lm-eval", "not installed", hint="Install lm-eval==0.4.13 (without the [vllm] extra)")
    path = Path(next(iter(spec.submodule_search_locations))) / "tasks" / "gsm8k" / "gsm8k.yaml"
    if not path.is_file():
        raise InputError(str(path), "lm-eval's gsm8k task file is missing",
                         hint="Reinstall lm-eval==0.4.13; kvgate's local task includes it")
    return path


def task_yaml(include: Path, train: Path, test: Path, *, task: str = TASK_NAME,
              over: str = "kvgate's generated grade-school problems", written_by: str = __name__,
              task_class: str | None = None) -> str:
    """The task YAML text: lm-eval's gsm8k with the data swapped for local JSON files (and, given `task_class`, its
    task class for one of kvgate's, e.g. the pool's few-shot sampling)."""
    return (
        f"# Written by {written_by}: lm-eval's own gsm8k task (prompt, few-shot format, metric and\n"
        f"# filters come from the included file) over {over}.\n"
        f"include: {json.dumps(str(include))}\n"
        f"task: {task}\n"
        "tag: []\n"
        + (f"class: !function {task_class}\n" if task_class else "")
        + "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    train: {json.dumps(str(train))}\n"
        f"    test: {json.dumps(str(test))}\n"
    )


def write_task(folder: Path, *, questions: int = 0) -> str:
    """Write the task YAML and its data into `folder`; returns the task name for `lm_eval --tasks`. Its test split
    is the first max(questions, 240) problems of the held-out pool (kvgate.workloads.heldout_pool), whose first 240
    are the shipped test split."""
    from kvgate.workloads import heldout_pool

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    copies = {}
    for split, source in data_files().items():
        copies[split] = folder / f"{TASK_NAME}_{split}.jsonl"
        shutil.copyfile(source, copies[split])
    if questions > len(load("test")):
        problems = heldout_pool.draw(questions)
        if len(problems) < questions:
            raise InputError(str(heldout_pool.POOL_FILE), f"the held-out pool holds {len(problems)} questions, the "
                             f"plan asks {questions}", hint="Lower the policy's questions or grow the pool")
        copies["test"].write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in problems),
                                  encoding="utf-8")
    text = task_yaml(lm_eval_gsm8k_yaml(), copies["train"], copies["test"])
    (folder / YAML_NAME).write_text(text, encoding="utf-8")
    return TASK_NAME


def test_questions(folder: Path) -> int:
    """How many test questions the task written into `folder` holds (0 when there is none)."""
    try:
        with open(Path(folder) / f"{TASK_NAME}_test.jsonl", encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())
    except OSError:
        return 0
