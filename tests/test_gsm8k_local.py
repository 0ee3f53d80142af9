"""kvgate's generated gsm8k problems and its local copy of lm-eval's gsm8k task."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvgate.workloads import gsm8k_local, gsm8k_problems
from kvgate.workloads.gsm8k_problems import calc, evaluate, generate_split, to_jsonl

# lm-eval 0.4.13 tasks/gsm8k/gsm8k.yaml: the strict-match filter and the metric's regexes_to_ignore.
STRICT_MATCH = r"#### (\-?[0-9\.\,]+)"
FLEXIBLE_EXTRACT = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
IGNORED_IN_TARGET = [",", "\\$", "(?s).*#### ", "\\.$"]
ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>(\S+?)(?=[\s.,]|$)")

SHIPPED = {split: gsm8k_local.load(split) for split in gsm8k_local.SPLITS}


def all_records() -> list[tuple[str, int, dict]]:
    return [(split, i, record) for split, records in SHIPPED.items() for i, record in enumerate(records)]


def test_splits_are_big_enough_and_disjoint() -> None:
    assert len(SHIPPED["test"]) >= 200
    assert len(SHIPPED["train"]) >= 20
    test_questions = {r["question"] for r in SHIPPED["test"]}
    train_questions = {r["question"] for r in SHIPPED["train"]}
    assert len(test_questions) == len(SHIPPED["test"]), "duplicate test questions"
    assert not test_questions & train_questions, "a train question is also a test question"


def test_records_have_exactly_gsm8ks_fields() -> None:
    for split, i, record in all_records():
        assert sorted(record) == ["answer", "question"], f"{split}[{i}]"
        assert all(isinstance(v, str) and v.strip() for v in record.values()), f"{split}[{i}]"


def test_every_template_is_used_in_the_test_split() -> None:
    used = {p.template for p in generate_split("test")}
    assert used == {t.__name__ for t in gsm8k_problems.TEMPLATES}


def test_every_calculator_annotation_is_right() -> None:
    checked = 0
    for split, i, record in all_records():
        annotations = ANNOTATION.findall(record["answer"])
        assert len(annotations) >= 2, f"{split}[{i}] has too few steps: {record['answer']!r}"
        for expression, value, shown in annotations:
            assert evaluate(expression) == int(value) == int(shown), f"{split}[{i}]: <<{expression}={value}>>{shown}"
            checked += 1
    assert checked > 3 * len(all_records())


def test_final_line_parses_with_lm_evals_strict_match_and_equals_the_generators_result() -> None:
    problems = {split: generate_split(split) for split in gsm8k_local.SPLITS}
    for split, i, record in all_records():
        last_line = record["answer"].splitlines()[-1]
        assert re.fullmatch(r"#### -?\d+", last_line), f"{split}[{i}]: {last_line!r}"
        strict = re.findall(STRICT_MATCH, record["answer"])
        assert strict == [str(problems[split][i].result)], f"{split}[{i}]"
        last_step_value = int(ANNOTATION.findall(record["answer"])[-1][1])
        assert last_step_value == problems[split][i].result, f"{split}[{i}]"
        # flexible-extract (the last number) reads the same answer off a worked solution
        flexible = [a or b for a, b in re.findall(FLEXIBLE_EXTRACT, record["answer"])][-1]
        assert flexible == str(problems[split][i].result)


def test_the_metric_reduces_the_target_to_the_number() -> None:
    for split, i, record in all_records():
        target = record["answer"]
        for pattern in IGNORED_IN_TARGET:
            target = re.sub(pattern, "", target)
        assert target == record["answer"].rsplit("#### ", 1)[1], f"{split}[{i}]"


def test_answers_are_positive_whole_numbers_of_varied_size() -> None:
    results = [p.result for p in generate_split("test")]
    assert min(results) > 0
    assert len(set(results)) > len(results) // 3, "too many repeated answers"


def test_regenerating_gives_the_shipped_files(tmp_path: Path) -> None:
    written = gsm8k_problems.write_files(tmp_path)
    for split, path in written.items():
        assert path.read_bytes() == gsm8k_local.data_files()[split].read_bytes(), (
            f"{split}.jsonl is stale: run `python -m kvgate.workloads.gsm8k_problems`")
        assert to_jsonl(generate_split(split)) == path.read_text(encoding="utf-8")


def test_calc_refuses_a_fraction() -> None:
    with pytest.raises(ValueError, match="7/2 = 7/2 is not a whole number"):
        calc("7/2")
    assert calc("48/2") == ("48/2 = <<48/2=24>>24", 24)
    with pytest.raises(ValueError, match="not a calculator expression"):
        evaluate("__import__('os')")


def installed_lm_eval_gsm8k() -> dict:
    yaml = pytest.importorskip("yaml")
    try:
        path = gsm8k_local.lm_eval_gsm8k_yaml()
    except Exception as error:  # InputError when lm-eval is missing
        pytest.skip(f"lm-eval is not installed here: {error}")
    return yaml.safe_load(path.read_text())


def test_our_regexes_are_the_installed_lm_evals() -> None:
    config = installed_lm_eval_gsm8k()
    filters = {f["name"]: f["filter"][0]["regex_pattern"] for f in config["filter_list"]}
    assert filters == {"strict-match": STRICT_MATCH, "flexible-extract": FLEXIBLE_EXTRACT}
    assert config["metric_list"][0]["regexes_to_ignore"] == IGNORED_IN_TARGET
    assert config["doc_to_text"] == "Question: {{question}}\nAnswer:"


def test_write_task_includes_lm_evals_gsm8k_and_swaps_only_the_data(tmp_path: Path) -> None:
    installed_lm_eval_gsm8k()
    import yaml

    assert gsm8k_local.write_task(tmp_path / "task") == "kvgate_gsm8k_local"
    task = yaml.safe_load((tmp_path / "task" / "kvgate_gsm8k_local.yaml").read_text())
    assert task == {
        "include": str(gsm8k_local.lm_eval_gsm8k_yaml()),
        "task": "kvgate_gsm8k_local",
        "tag": [],
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {
            "train": str(tmp_path / "task" / "kvgate_gsm8k_local_train.jsonl"),
            "test": str(tmp_path / "task" / "kvgate_gsm8k_local_test.jsonl"),
        }},
    }
    assert Path(task["include"]).is_absolute()
    for split, path in task["dataset_kwargs"]["data_files"].items():
        assert Path(path).read_bytes() == gsm8k_local.data_files()[split].read_bytes()
    assert sorted(p.name for p in (tmp_path / "task").iterdir() if p.suffix == ".yaml") == ["kvgate_gsm8k_local.yaml"]


@pytest.mark.slow
def test_lm_eval_builds_gsm8ks_five_shot_prompt_from_the_local_task(tmp_path: Path, monkeypatch) -> None:
    """lm-eval's own task loader reads the YAML (no engine): gsm8k's prompt, metric and filters, local data."""
    installed_lm_eval_gsm8k()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    from lm_eval.tasks import TaskManager, get_task_dict

    gsm8k_local.write_task(tmp_path / "task")
    # indexed as kvgate's accuracy stage indexes it: the task's folder alone (eval_process.own_task_manager)
    task = get_task_dict(["kvgate_gsm8k_local"], TaskManager(include_path=str(tmp_path / "task"),
                                                             include_defaults=False))["kvgate_gsm8k_local"]
    config = task.config
    print({"filters": [f["name"] for f in config.filter_list], "metrics": config.metric_list})
    assert [f["name"] for f in config.filter_list] == ["strict-match", "flexible-extract"]
    assert [m["metric"] for m in config.metric_list] == ["exact_match"]
    assert config.num_fewshot == 5
    assert config.generation_kwargs["until"] == ["Question:", "</s>", "<|im_end|>"]
    test_docs = list(task.test_docs())
    assert [dict(d) for d in test_docs] == SHIPPED["test"]
    assert [dict(d) for d in task.training_docs()] == SHIPPED["train"]
    prompt = task.fewshot_context(test_docs[0], num_fewshot=5)
    print(prompt)
    assert prompt.count("Question: ") == 6 and prompt.count("#### ") == 5
    assert prompt.endswith(f"Question: {SHIPPED['test'][0]['question']}\nAnswer:")


def test_the_accuracy_stage_indexes_only_its_own_tasks_folder(tmp_path: Path) -> None:
    """kvgate's own task (a name its include path declares) is loaded from that folder alone, the name resolved as
    lm-eval resolves it; anything else (a hub task, a glob, no include path) is left to lm-eval's whole index."""
    from types import SimpleNamespace

    installed_lm_eval_gsm8k()
    from kvgate.runners.stages.eval_process import own_task_manager

    gsm8k_local.write_task(tmp_path / "task")
    cfg = SimpleNamespace(tasks="kvgate_gsm8k_local", include_path=str(tmp_path / "task"), metadata=None)
    manager = own_task_manager(cfg)
    assert manager is not None and manager.all_tasks == ["kvgate_gsm8k_local"]
    assert cfg.tasks == ["kvgate_gsm8k_local"]
    for tasks, include_path in (("gsm8k", str(tmp_path / "task")), ("kvgate_gsm8k_local,gsm8k", str(tmp_path / "task")),
                                ("kvgate_*", str(tmp_path / "task")), ("kvgate_gsm8k_local", None)):
        cfg = SimpleNamespace(tasks=tasks, include_path=include_path, metadata=None)
        assert own_task_manager(cfg) is None and cfg.tasks == tasks, tasks


def test_shipped_data_is_plain_jsonl() -> None:
    for split, path in gsm8k_local.data_files().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        assert len(lines) == len(SHIPPED[split])
        assert all(json.loads(line) for line in lines)
