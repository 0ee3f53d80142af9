"""The real CPU run fixture (tests/fixtures/cpu_run/test1.tar.xz) and the matrix it is judged by."""

from __future__ import annotations

from pathlib import Path

import archives

ARCHIVE = Path(__file__).parent / "fixtures" / "cpu_run" / "test1.tar.xz"


def extract(folder: Path) -> Path:
    archives.extract(ARCHIVE, folder)
    return folder / "test1"


def matrix_of_the_run(folder: Path) -> Path:
    """The repository's matrix as the run was made with: its CPU_MLA cell ran the tiny DeepSeek-V2 before it was
    trained (it scored 0), 5-shot, so that workload has no accuracy floor here; and its FP8 cell ran the tiny Llama as
    it is, before its FP8 cells loaded k/v scales from a checkpoint (contract 1.7: `fp8_kv_scales`): what the gate
    holds a folder to (kvgate.gate.trusted)."""
    matrix = without_checkpoint_kv_scales(without_mla_floor(copy_of_the_matrix(folder)))
    workloads = (matrix / "workloads.toml").read_text(encoding="utf-8")
    head, mla = workloads.split("[workloads.tiny-deepseek-v2]\n", 1)
    assert "num_fewshot = 0" in mla
    (matrix / "workloads.toml").write_text(head + "[workloads.tiny-deepseek-v2]\n" + mla.replace(
        "num_fewshot = 0", "num_fewshot = 5", 1), encoding="utf-8")
    return matrix


def copy_of_the_matrix(folder: Path) -> Path:
    folder.mkdir()
    for toml in (Path(__file__).parents[1] / "matrix").glob("*.toml"):
        (folder / toml.name).write_text(toml.read_text(encoding="utf-8"), encoding="utf-8")
    return folder


def without_checkpoint_kv_scales(folder: Path) -> Path:
    """The matrix before contract 1.7: no workload's FP8 cells load k/v scales from a checkpoint."""
    workloads = (folder / "workloads.toml").read_text(encoding="utf-8")
    assert workloads.count('\nfp8_kv_scales = "checkpoint"\n') == 1
    (folder / "workloads.toml").write_text(workloads.replace('\nfp8_kv_scales = "checkpoint"\n', "\n"),
                                           encoding="utf-8")
    return folder


def without_mla_floor(folder: Path) -> Path:
    workloads = (folder / "workloads.toml").read_text(encoding="utf-8")
    head, mla = workloads.split("[workloads.tiny-deepseek-v2]\n", 1)
    kept = [line for line in mla.splitlines(keepends=True) if not line.startswith("expected_accuracy")]
    assert len(kept) == len(mla.splitlines(keepends=True)) - 1
    (folder / "workloads.toml").write_text(head + "[workloads.tiny-deepseek-v2]\n" + "".join(kept), encoding="utf-8")
    return folder
