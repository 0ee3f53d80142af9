"""The Hugging Face cache a GPU runner reads with the hub offline: where it is, and whether a cell's model and
dataset are in it. Stdlib only; read as huggingface_hub and datasets lay it out (their documented cache):

    $HF_HUB_CACHE (default $HF_HOME/hub)             models--<org>--<name>/refs/main -> snapshots/<commit>/...
    $HF_DATASETS_CACHE (default $HF_HOME/datasets)   <org>___<name>/<config>/<version>/<hash>/  (the Arrow files
                                                     `datasets.load_dataset` builds; offline, datasets 5.2 reads
                                                     only these: datasets/load.py CachedDatasetModuleFactory)
    $HF_HOME defaults to $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface.

A runner never downloads: the engines run with HF_HUB_OFFLINE=1 (kvgate.runners.environment.process_env), so a
model or dataset missing from the cache is reported before any engine starts, with how to fill the cache
(`kvgate prefetch`, on a trusted machine: kvgate.runners.environment.prefetch).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.matrix.cells import Cell


@dataclass(frozen=True, kw_only=True, slots=True)
class HubDataset:
    path: str  # the dataset repository, as lm-eval's task YAML names it (dataset_path)
    name: str | None  # its config (dataset_name)


# lm-eval tasks a workload may name whose data comes from the hub (lm-eval 0.4.13 tasks/gsm8k/gsm8k.yaml): gsm8k,
# and the hub models' pool (kvgate.workloads.gsm8k_pool: gsm8k's test then train split, loaded from the same
# dataset). kvgate's own task (kvgate_gsm8k_local) reads files kvgate ships and needs nothing.
GSM8K_DATASET = HubDataset(path="openai/gsm8k", name="main")
HUB_TASK_DATASETS = {"gsm8k": GSM8K_DATASET, "kvgate_gsm8k_test_train": GSM8K_DATASET}
PREFETCH_HINT = ("Fill the cache on a machine with network access (a token for gated models there, never on a "
                 "runner): `kvgate prefetch` with the same HF_HOME, then copy it to this runner (README: "
                 "\"Offline operation\")")


def is_hub_model(model: str) -> bool:
    """A hub repository id ("org/name"), not a local folder (which vLLM loads as it is) nor one of kvgate's."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", model) is not None and not Path(model).exists()


def hf_home(env: Mapping[str, str]) -> Path:
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser()
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface"


def hub_cache(env: Mapping[str, str]) -> Path:
    chosen = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    return Path(chosen).expanduser() if chosen else hf_home(env) / "hub"


def datasets_cache(env: Mapping[str, str]) -> Path:
    return Path(env["HF_DATASETS_CACHE"]).expanduser() if env.get("HF_DATASETS_CACHE") else hf_home(env) / "datasets"


def hub_is_offline(env: Mapping[str, str]) -> bool:
    return env.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def model_snapshot(repo_id: str, env: Mapping[str, str]) -> Path | None:
    """The cached snapshot of a model's main revision holding a config.json and weights; None when absent."""
    repo = hub_cache(env) / f"models--{repo_id.replace('/', '--')}"
    try:
        commit = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    snapshot = repo / "snapshots" / commit
    has_weights = any(p.exists() for p in snapshot.glob("*.safetensors"))  # exists(): the blob behind the link
    return snapshot if (snapshot / "config.json").exists() and has_weights else None


def dataset_cached(dataset: HubDataset, env: Mapping[str, str]) -> bool:
    """Whether `datasets` can load it offline: a built <org>___<name>/<config>/<version>/<hash>/ folder."""
    root = datasets_cache(env) / dataset.path.replace("/", "___")
    pattern = f"{dataset.name}/*/*" if dataset.name else "*/*/*"
    return any(p.is_dir() for p in root.glob(pattern))


def missing_from_cache(cell: Cell, stages: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why an offline engine could not start this cell's stages (model, the accuracy stage's dataset, the model of
    the passkey task's engine of its own), else None."""
    if not hub_is_offline(env):
        return None
    problems = []
    hub = is_hub_model(cell.model)
    if hub and any(stage in ("accuracy", "throughput") for stage in stages) and model_snapshot(cell.model, env) is None:
        problems.append(f"model {cell.model} is not in the Hugging Face cache {hub_cache(env)}")
    long_model = long_context_hub_model(cell)
    if "accuracy" in stages and long_model and model_snapshot(long_model, env) is None:
        problems.append(f"the passkey task's model {long_model} (workloads long_context.model) is not in the Hugging "
                        f"Face cache {hub_cache(env)}")
    dataset = HUB_TASK_DATASETS.get(str(cell.workload.gsm8k["task"])) if hub else None
    if "accuracy" in stages and dataset is not None and not dataset_cached(dataset, env):
        problems.append(f"lm-eval's gsm8k dataset {dataset.path} ({dataset.name}) is not in "
                        f"the datasets cache {datasets_cache(env)}")
    if not problems:
        return None
    return f"{' and '.join(problems)}, and the engines run with the hub offline (HF_HUB_OFFLINE=1). {PREFETCH_HINT}"


def long_context_hub_model(cell: Cell) -> str | None:
    """The hub model of the passkey task's engine of its own (workloads long_context.model), if it names one."""
    long_context = cell.workload.long_context
    model = long_context.model if long_context is not None else None
    return model if model and is_hub_model(model) else None


def environment_summary(env: Mapping[str, str]) -> dict[str, str]:
    """The cache places, as `kvgate prefetch` reports them."""
    return {"HF_HOME": str(hf_home(env)), "hub": str(hub_cache(env)), "datasets": str(datasets_cache(env))}


def token_file(env: Mapping[str, str]) -> Path | None:
    """A token `hf auth login` left in HF_HOME (copied with the cache it would reach the runners)."""
    path = Path(env["HF_TOKEN_PATH"]).expanduser() if env.get("HF_TOKEN_PATH") else hf_home(env) / "token"
    return path if path.is_file() else None

