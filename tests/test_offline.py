"""Offline operation: runners read models and lm-eval's datasets from a pre-filled Hugging Face cache with the hub
offline; a missing one is the cell's error before any engine starts; `kvgate prefetch` fills the cache on a
trusted machine (the downloads are stood in for here: this machine has no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_vllm import read_calls, write_fake_hf_cache, write_fake_vllm
from kvgate.cli import main
from kvgate.matrix import cells as kvmatrix
from kvgate.runners.environment import hub_cache
from kvgate.runners.environment.hub_cache import HubDataset, missing_from_cache
from kvgate.runners.environment.prefetch import prefetch_plan
from kvgate.runners.matrix_run import RunOptions, run_cells

ROOT = Path(__file__).resolve().parents[1]
LLAMA, DEEPSEEK = "meta-llama/Llama-3.1-8B-Instruct", "deepseek-ai/DeepSeek-V2-Lite-Chat"
GSM8K = ("openai/gsm8k", "main")


@pytest.fixture(scope="module")
def real_matrix() -> kvmatrix.Matrix:
    return kvmatrix.load(ROOT / "matrix")


def test_kvgate_names_the_dataset_lm_evals_gsm8k_task_loads():
    yaml = pytest.importorskip("yaml")
    import lm_eval

    task = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text())
    assert hub_cache.HUB_TASK_DATASETS["gsm8k"] == HubDataset(path=task["dataset_path"], name=task["dataset_name"])


def test_where_the_caches_are():
    assert hub_cache.hub_cache({"HF_HOME": "/h"}) == Path("/h/hub")
    assert hub_cache.datasets_cache({"HF_HOME": "/h"}) == Path("/h/datasets")
    assert hub_cache.hub_cache({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert hub_cache.hub_cache({"HF_HOME": "/h", "HF_HUB_CACHE": "/c"}) == Path("/c")
    assert hub_cache.datasets_cache({"HF_HOME": "/h", "HF_DATASETS_CACHE": "/d"}) == Path("/d")


def test_a_missing_model_and_dataset_are_named_with_the_remedy(real_matrix, tmp_path):
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    cell = real_matrix.cell("flash_attn-fp8-sm90")
    assert missing_from_cache(cell, ["accuracy", "throughput"], env) == (
        f"model {LLAMA} is not in the Hugging Face cache {tmp_path}/hub and lm-eval's gsm8k dataset openai/gsm8k "
        f"(main) is not in the datasets cache {tmp_path}/datasets, and the engines run with the hub offline "
        "(HF_HUB_OFFLINE=1). Fill the cache on a machine with network access (a token for gated models there, never "
        "on a runner): `kvgate prefetch` with the same HF_HOME, then copy it to this runner (README: \"Offline "
        "operation\")")
    write_fake_hf_cache(tmp_path, models=(LLAMA,))
    assert missing_from_cache(cell, ["throughput"], env) is None  # throughput needs no dataset
    assert "dataset openai/gsm8k" in missing_from_cache(cell, ["accuracy"], env)
    write_fake_hf_cache(tmp_path, datasets=(GSM8K,))
    assert missing_from_cache(cell, ["kernels", "accuracy", "throughput"], env) is None


def test_nothing_to_check_for_kvgates_own_models_or_an_online_engine(real_matrix, tmp_path):
    assert missing_from_cache(real_matrix.cell("cpu_attn-fp8-cpu"), ["accuracy"], {"HF_HOME": str(tmp_path),
                                                                                     "HF_HUB_OFFLINE": "1"}) is None
    assert missing_from_cache(real_matrix.cell("flash_attn-fp8-sm90"), ["accuracy"], {"HF_HOME": str(tmp_path),
                                                                                        "HF_HUB_OFFLINE": "0"}) is None


def test_a_passkey_model_of_the_hub_missing_from_the_cache_is_named_before_any_engine(tmp_path):
    """A workload whose passkey task has a hub model of its own (long_context.model): offline, a cache without it is
    the accuracy stage's error up front, even where the gsm8k model is kvgate's own; `kvgate prefetch` fetches it."""
    matrix_dir = tmp_path / "matrix"
    matrix_dir.mkdir()
    for toml in (ROOT / "matrix").glob("*.toml"):
        (matrix_dir / toml.name).write_text(toml.read_text())
    workloads = (matrix_dir / "workloads.toml").read_text()
    assert workloads.count('model = "kvgate:tiny-llama-long"') == 1
    (matrix_dir / "workloads.toml").write_text(workloads.replace('model = "kvgate:tiny-llama-long"',
                                                                 'model = "org/long-passkey-model"'))
    cell = kvmatrix.load(matrix_dir).cell("cpu_attn-auto-cpu")
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    assert missing_from_cache(cell, ["accuracy"], env) == (
        f"the passkey task's model org/long-passkey-model (workloads long_context.model) is not in the Hugging Face "
        f"cache {tmp_path}/hf/hub, and the engines run with the hub offline (HF_HUB_OFFLINE=1). Fill the cache on a "
        "machine with network access (a token for gated models there, never on a runner): `kvgate prefetch` with the "
        "same HF_HOME, then copy it to this runner (README: \"Offline operation\")")
    assert missing_from_cache(cell, ["throughput"], env) is None  # only the accuracy stage asks the passkey task
    assert prefetch_plan([cell]).models == ("org/long-passkey-model",)
    write_fake_hf_cache(tmp_path / "hf", models=("org/long-passkey-model",))
    assert missing_from_cache(cell, ["accuracy"], env) is None


def test_only_hub_ids_are_looked_up(tmp_path):
    assert hub_cache.is_hub_model(LLAMA)
    assert not hub_cache.is_hub_model("kvgate:tiny-llama")
    assert not hub_cache.is_hub_model("/nonexistent/kvgate-model")  # a local folder: vLLM loads it, or says why not
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "model").mkdir()
    assert not hub_cache.is_hub_model(str(tmp_path / "org" / "model"))


def test_a_weightless_snapshot_is_not_a_model(tmp_path):
    write_fake_hf_cache(tmp_path, models=(LLAMA,))
    snapshot = next((tmp_path / "hub").glob("models--*/snapshots/*"))
    (snapshot / "model-00001-of-00001.safetensors").unlink()
    assert hub_cache.model_snapshot(LLAMA, {"HF_HOME": str(tmp_path)}) is None


def test_a_runner_without_the_model_starts_no_engine(real_matrix, tmp_path, monkeypatch):
    fake = write_fake_vllm(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"{fake}:{ROOT / 'src'}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    options = RunOptions(run_dir=tmp_path / "run", stages=["accuracy"], local_arch="sm90", echo=False,
                         say=lambda line: None)

    status, outcomes = run_cells([real_matrix.cell("flash_attn-fp8-sm90")], options)

    assert status == 1
    assert [o.status for o in outcomes] == ["error", "error", "error"]  # accuracy, its probe and its passkey task
    assert outcomes[0].reason.startswith(f"model {LLAMA} is not in the Hugging Face cache {tmp_path}/empty-hf/hub")
    assert read_calls(fake) == []


def test_throughput_with_dummy_weights_needs_no_model_in_the_cache(real_matrix, tmp_path, monkeypatch):
    """The hub workloads time their architecture with dummy weights (kvgate ships its config.json): the throughput
    stage runs on a runner whose Hugging Face cache is empty, with load_format dummy."""
    fake = write_fake_vllm(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"{fake}:{ROOT / 'src'}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    monkeypatch.setenv("KVGATE_MODEL_DIR", str(tmp_path / "models"))
    options = RunOptions(run_dir=tmp_path / "run", stages=["throughput"], local_arch="sm90", echo=False,
                         say=lambda line: None)

    status, outcomes = run_cells([real_matrix.cell("flash_attn-fp8-sm90")], options)

    assert (status, [o.status for o in outcomes]) == (0, ["ok"]), outcomes
    (call,) = read_calls(fake)
    argv = call["argv"]
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert "dummy-weights-meta-llama--Llama-3.1-8B-Instruct" in argv[argv.index("--model") + 1]


# --------------------------------------------------------------------------------------------- prefetch

def test_the_plan_is_each_hub_model_and_dataset_once(real_matrix):
    plan = prefetch_plan(real_matrix.select(archs=["sm80", "sm89", "sm90", "sm100", "sm120", "cpu"]))
    assert plan.models == (DEEPSEEK, LLAMA)
    assert plan.datasets == (HubDataset(path="openai/gsm8k", name="main"),)
    assert prefetch_plan(real_matrix.select(archs=["cpu"])).models == ()


@pytest.fixture
def hub_standins(tmp_path, monkeypatch):
    """huggingface_hub.snapshot_download and datasets.load_dataset, as they would fill HF_HOME (no network here)."""
    import datasets
    import huggingface_hub

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls, gated = [], set()

    def snapshot_download(repo_id, **kwargs):
        calls.append(("model", repo_id, kwargs))
        if repo_id in gated:  # what the hub answers a token without access (403)
            raise huggingface_hub.errors.GatedRepoError.__new__(huggingface_hub.errors.GatedRepoError)
        write_fake_hf_cache(home, models=(repo_id,))

    def load_dataset(path, name=None, **kwargs):
        calls.append(("dataset", path, name))
        write_fake_hf_cache(home, datasets=((path, name),))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return home, calls, gated


def test_prefetch_fills_the_cache_a_runner_reads_offline(real_matrix, hub_standins, capsys):
    home, calls, _ = hub_standins
    assert main(["prefetch", "--arch", "sm90"]) == 0
    ignored = ["original/*", "*.pth", "*.pt", "*.bin", "*.gguf", "*.h5", "*.msgpack", "*.onnx"]
    assert calls == [("model", DEEPSEEK, {"ignore_patterns": ignored}), ("model", LLAMA, {"ignore_patterns": ignored}),
                     ("dataset", "openai/gsm8k", "main")]
    out = capsys.readouterr().out
    assert out.splitlines()[:4] == [
        f"kvgate prefetch: HF_HOME {home} (models in {home}/hub, datasets in {home}/datasets)",
        f"  model    {DEEPSEEK}", f"  model    {LLAMA}", "  dataset  openai/gsm8k (main)"]
    assert out.splitlines()[-1] == f"kvgate prefetch: done; give the runners a copy of {home} as their HF_HOME"
    runner_env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    for cell in real_matrix.select(archs=["sm90"]):
        assert missing_from_cache(cell, ["accuracy", "throughput"], runner_env) is None, cell.id


def test_a_gated_model_without_access_says_what_the_token_is_for(hub_standins, capsys):
    _, _, gated = hub_standins
    gated.add(LLAMA)
    assert main(["prefetch", "--arch", "sm89"]) == 1
    assert capsys.readouterr().err == (
        f"kvgate prefetch: FAILED model {LLAMA}: gated: accept its licence on huggingface.co with an account, and "
        "give that account's read token as HF_TOKEN here (only here: the runners need no token)\n")


def test_a_login_token_in_the_cache_is_flagged_before_the_cache_is_copied(hub_standins, capsys):
    home, _, _ = hub_standins
    home.mkdir(parents=True, exist_ok=True)
    (home / "token").write_text("hf_secret")
    assert main(["prefetch", "--cell", "flash_attn-auto-sm90"]) == 0
    assert capsys.readouterr().err == (
        f"kvgate prefetch: WARNING {home}/token holds a login token: copy the cache to the runners without it (e.g. "
        "rsync --exclude token --exclude stored_tokens), or fill it with HF_TOKEN instead of a login\n")


def test_dry_run_fetches_nothing(hub_standins, capsys):
    _, calls, _ = hub_standins
    assert main(["prefetch", "--dry-run"]) == 0
    assert calls == []
    assert json.dumps(capsys.readouterr().out).count("model    ") == 2
