"""The hub models' question pool (kvgate.workloads.gsm8k_pool): gsm8k's test split then its train split.

No network here: each test builds a real Hugging Face dataset folder laid out as openai/gsm8k is on the hub
(main/test-00000-of-00001.parquet, main/train-00000-of-00001.parquet, a README.md whose `configs:` name them),
written with the `datasets` library from kvgate's gsm8k-format problems, and loads it with `datasets` and lm-eval's
own TaskManager (nothing of either is mocked).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate import InputError, InputErrors
from kvgate.matrix.toml_reading import read_toml
from kvgate.workloads import gsm8k_local, gsm8k_pool

pytest.importorskip("datasets")
pytest.importorskip("lm_eval")

TEST_SIZE, TRAIN_SIZE = 12, len(gsm8k_local.load("train"))  # 12 of its 240 test problems, all 24 train ones
README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
---
"""


def hub_layout_dataset(folder: Path, splits: dict[str, list[dict[str, str]]]) -> Path:
    """A dataset folder laid out as openai/gsm8k's hub repository, written by `datasets` itself."""
    import datasets

    for split, records in splits.items():
        path = folder / "main" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_list(records).to_parquet(str(path))
    (folder / "README.md").write_text(README, encoding="utf-8")
    return folder


@pytest.fixture
def splits() -> dict[str, list[dict[str, str]]]:
    """gsm8k-format problems: as many test and train questions as the tests need, the two disjoint."""
    return {"test": gsm8k_local.load("test")[:TEST_SIZE], "train": gsm8k_local.load("train")[:TRAIN_SIZE]}


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    return tmp_path / "datasets"


def read_jsonl(path: Path) -> list[dict[str, str]]:
    import json

    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_dataset_is_the_one_lm_evals_gsm8k_names() -> None:
    import yaml

    config = yaml.safe_load(gsm8k_local.lm_eval_gsm8k_yaml().read_text())
    assert gsm8k_pool.lm_eval_dataset() == (config["dataset_path"], config["dataset_name"]) == ("openai/gsm8k", "main")
    assert (config["test_split"], config["fewshot_split"]) == ("test", "train")


def test_pool_is_the_test_split_then_the_train_split_in_order(tmp_path: Path, splits, isolated_cache) -> None:
    source = hub_layout_dataset(tmp_path / "gsm8k", splits)
    assert gsm8k_pool.write_task(tmp_path / "task", source=str(source)) == "kvgate_gsm8k_test_train"
    pool = read_jsonl(gsm8k_pool.data_file(tmp_path / "task", "test"))
    fewshot = read_jsonl(gsm8k_pool.data_file(tmp_path / "task", "train"))
    assert len(pool) == gsm8k_pool.test_questions(tmp_path / "task") == TEST_SIZE + TRAIN_SIZE
    assert pool[:TEST_SIZE] == splits["test"]
    assert pool[TEST_SIZE:] == splits["train"]
    assert fewshot == splits["train"]


@pytest.mark.slow
def test_lm_eval_loads_the_pool_and_each_question_gets_its_own_shots(tmp_path: Path, splits, isolated_cache) -> None:
    """Through lm-eval's TaskManager over the task's folder, as kvgate's accuracy stage loads it. Plain lm-eval (the same YAML without
    PoolTask) puts some train questions among their own shots (it drops a question from them only when the shots
    come from the test split) and gives a question other shots when a later call (a look) asks it; the pool's task
    does neither."""
    from lm_eval.tasks import TaskManager, get_task_dict

    gsm8k_pool.write_task(tmp_path / "task", source=str(hub_layout_dataset(tmp_path / "gsm8k", splits)))
    text = (tmp_path / "task" / gsm8k_pool.YAML_NAME).read_text(encoding="utf-8")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "plain_pool.yaml").write_text(
        "\n".join(line for line in text.splitlines() if not line.startswith("class:"))
        .replace(f"task: {gsm8k_pool.TASK_NAME}", "task: plain_pool"), encoding="utf-8")
    total, later = TEST_SIZE + TRAIN_SIZE, TEST_SIZE + 5  # a second look starting among the train questions
    # the two folders alone, as kvgate's accuracy stage indexes its task's (eval_process.own_task_manager)
    manager = TaskManager(include_path=[str(tmp_path / "task"), str(plain)], include_defaults=False)

    def prompts(task_name: str, samples: list[int]) -> tuple[object, list[str]]:
        task = get_task_dict([task_name], manager)[task_name]
        task.set_fewshot_seed(seed=1234)  # what lm-eval's evaluator does (its default fewshot_random_seed)
        task.build_all_requests(samples=samples)  # as kvgate.runners.stages.eval_process asks for the plan's questions
        return task, [instance.args[0] for instance in sorted(task.instances, key=lambda i: i.doc_id)]

    task, pooled = prompts(gsm8k_pool.TASK_NAME, list(range(total)))
    _, pooled_later = prompts(gsm8k_pool.TASK_NAME, list(range(later, total)))
    _, plains = prompts("plain_pool", list(range(total)))
    _, plains_later = prompts("plain_pool", list(range(later, total)))
    assert type(task).__name__ == "PoolTask"
    assert task.config.num_fewshot == 5
    assert len(task.test_docs()) == total
    questions = [d["question"] for d in splits["test"] + splits["train"]]

    def own_in_shots(prompt: str, question: str) -> bool:
        return prompt.count(f"Question: {question}\n") > 1

    plain_own = [i for i, (p, q) in enumerate(zip(plains, questions, strict=True)) if own_in_shots(p, q)]
    pooled_own = [i for i, (p, q) in enumerate(zip(pooled, questions, strict=True)) if own_in_shots(p, q)]
    plain_moved = sum(a != b for a, b in zip(plains[later:], plains_later, strict=True))
    pooled_moved = sum(a != b for a, b in zip(pooled[later:], pooled_later, strict=True))
    print({"own question among the shots": {"plain lm-eval": plain_own, "pool task": pooled_own},
           f"other shots when asked from question {later} on": {"plain lm-eval": plain_moved,
                                                                 "pool task": pooled_moved}})
    assert plain_own and all(i >= TEST_SIZE for i in plain_own)
    assert pooled_own == []
    assert plain_moved > 0
    assert pooled_moved == 0
    assert all(p.count("#### ") == 5 and p.endswith(f"Question: {q}\nAnswer:")
               for p, q in zip(pooled, questions, strict=True))
    assert len(set(pooled)) == total


def test_a_missing_dataset_is_one_error_naming_kvgate_prefetch(tmp_path: Path, isolated_cache) -> None:
    with pytest.raises(InputError) as raised:
        gsm8k_pool.write_task(tmp_path / "task", source=str(tmp_path / "no-such-dataset"))
    message = str(raised.value)
    print(message)
    assert message.startswith(f"{tmp_path / 'no-such-dataset'}: gsm8k (main) could not be loaded: ")
    assert "`kvgate prefetch`" in message and "\n" not in message
    assert not (tmp_path / "task" / gsm8k_pool.YAML_NAME).exists()


def test_an_unreadable_dataset_is_one_error_naming_kvgate_prefetch_from_the_command(tmp_path: Path) -> None:
    source = tmp_path / "gsm8k"
    (source / "main").mkdir(parents=True)
    (source / "README.md").write_text(README, encoding="utf-8")
    for split in ("test", "train"):
        (source / "main" / f"{split}-00000-of-00001.parquet").write_bytes(b"not parquet")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([sys.executable, "-m", "kvgate.workloads.gsm8k_pool", str(tmp_path / "task"),
                           "--source", str(source)], env=env, capture_output=True, text=True, timeout=300)
    print(done.stderr)
    assert done.returncode == 2
    [line] = [line for line in done.stderr.splitlines() if line.startswith("ERROR ")]
    assert line.startswith(f"ERROR {source}: gsm8k (main) could not be loaded: ")
    assert "`kvgate prefetch`" in line


def test_a_hub_cell_compared_with_a_baseline_draws_the_policys_n_from_the_pool() -> None:
    """The plan `kvgate run --powered` / an A/B run hands the runner, and the gate judges by under
    --require-baseline: more than gsm8k's test split, with the pool and its caveat said."""
    from kvgate.gate import policy as policy_module
    from kvgate.gate import question_plan
    from kvgate.matrix import cells as matrix_module
    from kvgate.runners.environment.hub_cache import HUB_TASK_DATASETS, is_hub_model
    from kvgate.runners.stages.commands import HUB_POOL_GSM8K_TASK

    matrix = matrix_module.load()
    policy = policy_module.load(matrix=matrix)
    hub_cells = [cell for cell in matrix.cells if is_hub_model(cell.model)]
    assert hub_cells and {str(cell.workload.gsm8k["task"]) for cell in hub_cells} == {gsm8k_pool.TASK_NAME}
    assert policy.accuracy.pool_questions[gsm8k_pool.TASK_NAME] == 1319 + 7473
    assert HUB_TASK_DATASETS[gsm8k_pool.TASK_NAME] == HUB_TASK_DATASETS["gsm8k"]  # `kvgate prefetch` fetches it
    assert HUB_POOL_GSM8K_TASK == gsm8k_pool.TASK_NAME  # the runner writes the pool for the cells that name it
    for cell in hub_cells:
        plan = question_plan.plan(policy, arch=cell.arch, task=gsm8k_pool.TASK_NAME, model=cell.model, ab=True)
        print(cell.id, plan.questions, plan.looks, plan.reason)
        assert 1319 < plan.questions <= 1319 + 7473
        assert plan.questions >= plan.fixed_questions
        assert "train questions may be contaminated for real models" in plan.reason
        assert "all the" not in plan.reason  # not capped by the pool


def test_a_pool_note_that_is_not_text_is_an_input_error() -> None:
    from kvgate.gate import policy as policy_module

    doc = copy.deepcopy(read_toml(Path(__file__).resolve().parents[1] / "matrix" / "policy.toml",
                                  missing_hint="Restore matrix/policy.toml"))
    doc["accuracy"]["pool_notes"] = {gsm8k_pool.TASK_NAME: 8792}
    with pytest.raises(InputErrors) as caught:
        policy_module.parse(doc, "matrix/policy.toml")
    assert [str(e) for e in caught.value.errors] == [
        "matrix/policy.toml: expected a non-empty string, got the number 8792 in "
        "accuracy.pool_notes.kvgate_gsm8k_test_train"]


def test_the_runner_says_a_pool_it_cannot_write_is_a_setup_error_naming_kvgate_prefetch(tmp_path: Path) -> None:
    """The runner writes the pool in a process with the engines' environment: here the hub offline and an empty
    Hugging Face cache, as on a runner nobody ran `kvgate prefetch` for."""
    from kvgate.runners import matrix_run

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_DATASETS_CACHE", None)
    folder, error = matrix_run._pool_task_folder(tmp_path, env)
    print(error)
    assert folder is None
    assert error.startswith("setup failed: the gsm8k test+train pool could not be written (exit 2): openai/gsm8k: "
                            "gsm8k (main) could not be loaded: ")
    assert "`kvgate prefetch`" in error

