"""kvgate's held-out question pool: regenerated it is the shipped file, it continues the test split, and none of its
problems is one the shipped models trained on (checked by the arithmetic of the worked answers, independently of
the generator's own bookkeeping)."""

from __future__ import annotations

import functools
import hashlib
import json
import re

import pytest

from kvgate import InputError
from kvgate.workloads import gsm8k_local, heldout_pool, training_problems


@functools.lru_cache(maxsize=1)
def trained() -> list[training_problems.TrainProblem]:
    recipe = heldout_pool.training_recipe()
    return training_problems.generate_training(recipe["count"], seed=recipe["seed"], style=recipe["style"])


def arithmetic(answer: str) -> tuple[int, ...]:
    """The integers of a worked answer in order (gsm8k's <<calculator>> annotations dropped): two problems with the
    same chain are the same problem whatever their wording."""
    return tuple(int(x) for x in re.findall(r"\d+", re.sub(r"<<[^>]*>>", "", answer)))


def test_regenerated_pool_is_the_shipped_file():
    problems = heldout_pool.generate()
    text = "".join(json.dumps(p.as_record(), ensure_ascii=False) + "\n" for p in problems)
    assert text == heldout_pool.POOL_FILE.read_text(encoding="utf-8")
    assert heldout_pool.manifest(problems) == json.loads(heldout_pool.MANIFEST_FILE.read_text(encoding="utf-8"))


def test_pool_continues_the_test_split_and_has_no_repeats():
    pool = heldout_pool.pool()
    assert len(pool) == heldout_pool.SIZE == 4000
    assert pool[:240] == gsm8k_local.load("test")
    assert len({p["question"] for p in pool}) == len(pool)
    assert all(p["answer"].rsplit("####", 1)[1].strip().lstrip("-").isdigit() for p in pool)


def test_no_pool_problem_was_trained_on():
    seen = {arithmetic(p.answer) for p in trained()}
    questions = {p.question for p in trained()}
    pool = heldout_pool.pool()
    assert [p["question"] for p in pool if p["question"] in questions] == []
    assert [i for i, p in enumerate(pool) if arithmetic(p["answer"]) in seen] == []


def test_the_arithmetic_check_sees_a_trained_problem_in_gsm8k_format():
    """The control: kvgate's few-shot train split was drawn from the training problems, so the same check finds
    them across the two answer formats (without this the test above could pass by never matching)."""
    seen = {arithmetic(p.answer) for p in trained()}
    assert sum(arithmetic(p["answer"]) in seen for p in gsm8k_local.load("train")) >= 5


def test_draw_takes_the_first_n_in_order():
    assert heldout_pool.draw(300) == heldout_pool.pool()[:300]
    with pytest.raises(ValueError):
        heldout_pool.draw(0)


def test_a_changed_pool_file_is_refused(tmp_path, monkeypatch):
    copy = tmp_path / "heldout.jsonl"
    copy.write_bytes(heldout_pool.POOL_FILE.read_bytes().replace(b"Priya", b"Pryia", 1))
    monkeypatch.setattr(heldout_pool, "POOL_FILE", copy)
    with pytest.raises(InputError, match="does not match its manifest"):
        heldout_pool.pool()
    assert hashlib.sha256(copy.read_bytes()).hexdigest() != \
        json.loads(heldout_pool.MANIFEST_FILE.read_text(encoding="utf-8"))["sha256"]
