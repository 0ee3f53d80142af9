"""Fill the Hugging Face cache that GPU runners read with the hub offline: the selected cells' hub models and the
datasets of their lm-eval tasks (`kvgate prefetch`).

Run it on a trusted machine with network access, with the HF_HOME the runners will get a copy of. A gated model
(meta-llama/Llama-3.1-8B-Instruct) needs a token there, from an account that accepted its licence: HF_TOKEN in
that environment. Never on a runner: a runner's engines run the vLLM under test, so they get no token and no
network (kvgate.runners.environment.process_env), and read only this cache (kvgate.runners.environment.hub_cache checks it
before an engine starts).

Models come through huggingface_hub.snapshot_download (the main revision, safetensors weights; never the
duplicate `original/` checkpoints or *.bin/*.pth files vLLM does not load); datasets through
datasets.load_dataset with lm-eval's own path and config, which builds the Arrow files `datasets` reads offline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kvgate.matrix.cells import Cell
from kvgate.runners.environment.hub_cache import (
    HUB_TASK_DATASETS,
    HubDataset,
    dataset_cached,
    is_hub_model,
    long_context_hub_model,
    model_snapshot,
)

IGNORED_FILES = ("original/*", "*.pth", "*.pt", "*.bin", "*.gguf", "*.h5", "*.msgpack", "*.onnx")


@dataclass(frozen=True, kw_only=True, slots=True)
class PrefetchPlan:
    models: tuple[str, ...]
    datasets: tuple[HubDataset, ...]


def prefetch_plan(cells: Iterable[Cell]) -> PrefetchPlan:
    """The hub models (not kvgate's own, which it builds, nor local folders: the cells' and their passkey task's
    engines of its own) and hub datasets the cells need, each once."""
    cells = list(cells)
    long_models = {m for m in (long_context_hub_model(c) for c in cells) if m}
    cells = [c for c in cells if is_hub_model(c.model)]
    models = sorted({c.model for c in cells} | long_models)
    tasks = {str(c.workload.gsm8k["task"]) for c in cells}
    datasets = sorted({HUB_TASK_DATASETS[t] for t in tasks if t in HUB_TASK_DATASETS}, key=lambda d: (d.path, d.name or ""))
    return PrefetchPlan(models=tuple(models), datasets=tuple(datasets))


def fetch_model(repo_id: str) -> None:
    import huggingface_hub

    huggingface_hub.snapshot_download(repo_id, ignore_patterns=list(IGNORED_FILES))


def fetch_dataset(dataset: HubDataset) -> None:
    import datasets

    datasets.load_dataset(dataset.path, dataset.name)


def prefetch(plan: PrefetchPlan, env: Mapping[str, str] | None = None, *,
             say: Callable[[str], None] = print) -> list[str]:
    """Fetch what the plan names and check the cache then holds it; the problems, one line each ([] when all is there)."""
    env = os.environ if env is None else env
    problems = []
    for repo_id in plan.models:
        say(f"kvgate prefetch: model {repo_id} ...")
        try:
            fetch_model(repo_id)
        except Exception as error:  # every model is tried; each failure is reported with its remedy
            problems.append(f"model {repo_id}: {_why(error)}")
            continue
        snapshot = model_snapshot(repo_id, env)
        if snapshot is None:
            problems.append(f"model {repo_id}: downloaded, but no snapshot with config.json and safetensors weights "
                            f"is in the cache kvgate reads (HF_HOME and HF_HUB_CACHE as the runners will have them?)")
        else:
            say(f"kvgate prefetch: model {repo_id}: {snapshot}")
    for dataset in plan.datasets:
        shown = f"{dataset.path} ({dataset.name})" if dataset.name else dataset.path
        say(f"kvgate prefetch: dataset {shown} ...")
        try:
            fetch_dataset(dataset)
        except Exception as error:
            problems.append(f"dataset {shown}: {_why(error)}")
            continue
        if not dataset_cached(dataset, env):
            problems.append(f"dataset {shown}: loaded, but its Arrow files are not in the datasets cache kvgate reads "
                            f"(HF_DATASETS_CACHE as the runners will have it?)")
        else:
            say(f"kvgate prefetch: dataset {shown}: cached")
    return problems


def _why(error: Exception) -> str:
    name = type(error).__name__
    if name == "GatedRepoError":
        return ("gated: accept its licence on huggingface.co with an account, and give that account's read token as "
                "HF_TOKEN here (only here: the runners need no token)")
    if name in ("LocalEntryNotFoundError", "OfflineModeIsEnabled") or "offline" in str(error).lower():
        return f"the hub is unreachable from here ({name}: {error})"
    return f"{name}: {error}"
