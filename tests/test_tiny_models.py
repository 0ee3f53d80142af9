"""The tiny models: shapes, deterministic builds, the cache, and that transformers reads what is built.
(Loading them in the real vLLM engine is covered by tests/test_probe.py's engine test and the runners.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvgate import InputError
from kvgate.workloads import tiny_models
from kvgate.workloads.tiny_models import MODELS, ensure_model, model_dir, resolve_model, weight_specs

needs_builder = pytest.mark.usefixtures("builder_libraries")


@pytest.fixture(scope="session")
def builder_libraries() -> None:
    for module in ("torch", "tokenizers", "safetensors"):
        pytest.importorskip(module, reason=f"building a tiny model needs {module} (the cpu extra)")


def parameters(name: str) -> int:
    total = 0
    for _, shape, _ in weight_specs(MODELS[name].config):
        count = 1
        for size in shape:
            count *= size
        total += count
    return total


def test_parameter_counts() -> None:
    assert parameters("tiny-llama") == 5_442_816
    assert parameters("tiny-deepseek-v2") == 9_284_864


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseek-v2"])
def test_the_trained_models_ship_with_their_training_record(name: str) -> None:
    shipped = MODELS[name].shipped
    assert shipped is not None, f"{name}'s trained weights are missing from the package"
    log = json.loads((shipped / "training_log.json").read_text())
    assert log["params"] == parameters(name)
    assert log["disjointness"]["number_tuple_matches"] == 0 and log["disjointness"]["exact_masked_matches"] == 0
    # bf16: 2 bytes a parameter, plus the safetensors header
    assert (shipped / "model.safetensors").stat().st_size < 2 * parameters(name) + 100_000


def test_the_long_position_model_ships_with_its_training_record() -> None:
    """kvgate:tiny-llama-long (the passkey task's model of the CPU default): its record says the recipe, the
    parameters its config gives, and what it retrieves at each length in Hugging Face."""
    shipped = MODELS["tiny-llama-long"].shipped
    assert shipped is not None
    log = json.loads((shipped / "training_log.json").read_text())
    assert log["parameters"] == parameters("tiny-llama-long") == 590_464
    assert log["recipe"]["train_tokens"] == 16384 and log["steps_done"] == log["recipe"]["steps"] == 2000
    accuracy = {int(n): a for n, a in log["hf_greedy_accuracy"].items()}
    assert accuracy[4096] >= 0.9 and accuracy[8192] >= 0.9  # the CPU default's lengths
    config = json.loads((shipped / "config.json").read_text())
    assert config["max_position_embeddings"] == log["recipe"]["max_positions"] == 33792
    assert (shipped / "model.safetensors").stat().st_size < 2 * parameters("tiny-llama-long") + 100_000


def test_both_models_trained_on_the_same_problems() -> None:
    """One disjointness check covers both: the same generator, seed, count and style."""
    keys = ("problems", "drill_rows", "style")
    logs = [json.loads((MODELS[name].shipped / "training_log.json").read_text())
            for name in ("tiny-llama", "tiny-deepseek-v2")]  # the gsm8k models (tiny-llama-long knows no gsm8k)
    assert len({json.dumps([log[k] for k in keys] + [log["seeds"]["data"]]) for log in logs}) == 1
    assert logs[0]["disjointness"] == logs[1]["disjointness"]


def test_the_shipped_training_data_was_disjoint_from_the_test_problems() -> None:
    """Regenerates exactly the training problems the shipped Llama saw (count and seed from its training log)
    and checks them against kvgate's 240 test problems: no shared number tuple, masked wording or name."""
    from kvgate.workloads import training_problems

    log = json.loads((MODELS["tiny-llama"].shipped / "training_log.json").read_text())
    training_problems.check_reimplementation()
    train = training_problems.generate_training(log["problems"], seed=log["seeds"]["data"], style=log["style"])
    stats = training_problems.check_disjoint(train)
    assert stats == log["disjointness"]


def test_the_disjointness_check_catches_a_leaked_test_problem() -> None:
    from kvgate.workloads import training_problems

    train = training_problems.generate_training(64, seed=1)
    leaked = training_problems.test_problems()[5]
    answer, result = training_problems.solve(leaked)
    train.append(training_problems.TrainProblem(training_problems.render_original(leaked), answer, result,
                                                leaked.template, leaked.key()))
    with pytest.raises(ValueError, match="overlap the test problems"):
        training_problems.check_disjoint(train)


def test_llama_head_size_allows_fp8_on_cpu_attn() -> None:
    config = MODELS["tiny-llama"].config
    assert config["head_dim"] % 32 == 0
    assert config["head_dim"] * config["num_attention_heads"] == config["hidden_size"]


def test_deepseek_is_mla_with_deepseeks_dimensions() -> None:
    config = MODELS["tiny-deepseek-v2"].config
    assert config["architectures"] == ["DeepseekV2ForCausalLM"]
    assert config["kv_lora_rank"] + config["qk_rope_head_dim"] == 576  # CPU_MLA's and FlashMLA's head size
    assert config["qk_nope_head_dim"] == config["v_head_dim"] == 128  # what the GPU MLA prefill paths accept
    assert config["q_lora_rank"] is None
    assert (config["n_routed_experts"], config["n_shared_experts"]) == (4, 1)


def test_models_take_the_matrixs_prompt_length() -> None:
    import tomllib

    workloads = tomllib.loads((Path(__file__).parents[1] / "matrix" / "workloads.toml").read_text())["workloads"]
    tiny = {k: w for k, w in workloads.items() if w["model"].startswith("kvgate:")}
    assert tiny
    for key, workload in tiny.items():
        config = MODELS[workload["model"].removeprefix("kvgate:")].config
        assert workload["model_args"]["max_model_len"] <= config["max_position_embeddings"], key


def test_unknown_name_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError) as error:
        ensure_model("tiny-lama", tmp_path)
    assert str(error.value) == "kvgate:tiny-lama: unknown tiny model. Did you mean tiny-llama?"


def test_resolve_model_leaves_hub_ids_and_paths_alone(tmp_path: Path) -> None:
    assert resolve_model("deepseek-ai/DeepSeek-V2-Lite-Chat", tmp_path) == "deepseek-ai/DeepSeek-V2-Lite-Chat"
    assert resolve_model("/models/llama", tmp_path) == "/models/llama"
    assert list(tmp_path.iterdir()) == []


def test_the_cache_folder_of_a_built_model_follows_the_recipe(tmp_path: Path, monkeypatch) -> None:
    """A tiny model kvgate builds (random weights, no shipped folder) is keyed by its recipe."""
    config = MODELS["tiny-deepseek-v2"].config
    monkeypatch.setitem(MODELS, "tiny-unshipped", tiny_models.TinyModel(
        name="tiny-unshipped", description="", seed=2, config=config))
    before = model_dir("tiny-unshipped", tmp_path)
    assert before.parent == tmp_path and before.name.startswith("tiny-unshipped-")
    monkeypatch.setitem(MODELS, "tiny-unshipped", tiny_models.TinyModel(
        name="tiny-unshipped", description="", seed=99, config=config))
    assert model_dir("tiny-unshipped", tmp_path) != before
    monkeypatch.setattr(tiny_models, "RECIPE_VERSION", tiny_models.RECIPE_VERSION + 1)
    assert model_dir("tiny-unshipped", tmp_path).name != before.name


def test_the_cache_folder_of_a_shipped_model_follows_its_files(tmp_path: Path, monkeypatch) -> None:
    import shutil

    before = model_dir("tiny-llama", tmp_path)
    shipped = tmp_path / "shipped"
    shutil.copytree(tiny_models.SHIPPED_DIR, shipped)
    monkeypatch.setattr(tiny_models, "SHIPPED_DIR", shipped)
    assert model_dir("tiny-llama", tmp_path) == before
    with (shipped / "tiny-llama" / "tokenizer_config.json").open("a") as f:
        f.write(" ")
    assert model_dir("tiny-llama", tmp_path) != before


def test_a_shipped_model_without_its_weights_is_refused_not_built_at_random(tmp_path: Path, monkeypatch) -> None:
    """A checkout whose shipped folder lacks model.safetensors (an incomplete clone, a file moved away while a run
    started) must not build the random recipe under the trained model's name: found on 2026-12-03, when an A/A run's
    head side answered 0 of 405 on such a model while its base side had the trained one."""
    shipped = tmp_path / "shipped"
    shutil.copytree(tiny_models.SHIPPED_DIR, shipped)
    (shipped / "tiny-deepseek-v2" / "model.safetensors").unlink()
    monkeypatch.setattr(tiny_models, "SHIPPED_DIR", shipped)
    with pytest.raises(InputError) as info:
        tiny_models.ensure_model("tiny-deepseek-v2", tmp_path / "cache")
    said = str(info.value)
    assert str(shipped / "tiny-deepseek-v2" / "model.safetensors") in said and "untrained" in said
    assert "git checkout -- src/kvgate/workloads/models/tiny-deepseek-v2/model.safetensors" in said
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert tiny_models.ensure_model("tiny-llama", tmp_path / "cache").is_dir()  # the others are whole


def test_the_cache_defaults_to_kvgate_model_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KVGATE_MODEL_DIR", str(tmp_path / "models"))
    assert model_dir("tiny-llama").parent == tmp_path / "models"
    monkeypatch.delenv("KVGATE_MODEL_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model_dir("tiny-llama").parent == tmp_path / "home" / ".cache" / "kvgate" / "models"


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@needs_builder
@pytest.mark.parametrize("name", sorted(MODELS))
def test_builds_are_byte_identical_and_complete(tmp_path: Path, name: str) -> None:
    first = ensure_model(name, tmp_path / "a")
    second = ensure_model(name, tmp_path / "b")
    assert first.name == second.name
    assert folder_bytes(first) == folder_bytes(second)
    assert sorted(folder_bytes(first)) == sorted([
        "config.json", "generation_config.json", "kvgate-model.json", "model.safetensors",
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
        *(["training_log.json"] if MODELS[name].shipped else [])])
    marker = json.loads((first / "kvgate-model.json").read_text())
    assert marker["parameters"] == parameters(name)
    assert [p.name for p in (tmp_path / "a").iterdir()] == [first.name], "a temporary build folder was left"


@needs_builder
def test_a_cached_model_is_not_rebuilt_and_a_half_one_is(tmp_path: Path) -> None:
    path = ensure_model("tiny-llama", tmp_path)
    weights = path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert ensure_model("tiny-llama", tmp_path) == path
    assert weights.stat().st_mtime_ns == stamp
    (path / "kvgate-model.json").unlink()  # as if a build had crashed in place
    weights.write_bytes(b"garbage")
    assert ensure_model("tiny-llama", tmp_path) == path
    assert (path / "kvgate-model.json").is_file() and weights.stat().st_size > 900_000


@needs_builder
@pytest.mark.parametrize("name", sorted(MODELS))
def test_weights_are_bf16_with_the_checkpoint_names_and_shapes(tmp_path: Path, name: str) -> None:
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(ensure_model(name, tmp_path) / "model.safetensors"))
    expected = {n: shape for n, shape, _ in weight_specs(MODELS[name].config)}
    assert {n: tuple(t.shape) for n, t in tensors.items()} == expected
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    if MODELS[name].shipped is None:  # the random recipe's initialisation
        assert torch.all(tensors["model.norm.weight"] == 1)
        assert 0.9 < tensors["model.embed_tokens.weight"].float().std().item() < 1.1
    else:  # trained: no longer the initialisation
        assert not torch.all(tensors["model.norm.weight"] == 1)


@needs_builder
@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_reads_the_config(tmp_path: Path, name: str) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(ensure_model(name, tmp_path))
    assert config.architectures == MODELS[name].config["architectures"]
    assert config.max_position_embeddings == MODELS[name].config["max_position_embeddings"]
    assert config.vocab_size == MODELS[name].config["vocab_size"]


@needs_builder
def test_the_tokenizer_covers_gsm8k_prompts_compactly(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from kvgate.workloads import gsm8k_local

    tokenizer = transformers.AutoTokenizer.from_pretrained(ensure_model("tiny-llama", tmp_path))
    assert len(tokenizer) == MODELS["tiny-llama"].config["vocab_size"]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1)
    for word in ("Question", "Answer"):
        assert word in tokenizer.get_vocab(), word
    assert tokenizer("1234", add_special_tokens=False).input_ids == tokenizer("1 2 3 4".replace(" ", ""),
                                                                              add_special_tokens=False).input_ids
    assert len(tokenizer("1234", add_special_tokens=False).input_ids) == 4, "digits are single tokens"
    record = gsm8k_local.load("test")[0]
    text = f"Question: {record['question']}\nAnswer: {record['answer']}"
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(text) / len(ids) > 1.5, "the tokenizer should compress grade-school text (digits one by one)"
