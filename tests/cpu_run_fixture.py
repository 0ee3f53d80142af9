"""The real CPU run fixture (tests/fixtures/cpu_run/test1.tar.xz) and the matrix it is judged by."""

from __future__ import annotations

import tarfile
from pathlib import Path

from fixture_archives import extract_data

ARCHIVE = Path(__file__).parent / "fixtures" / "cpu_run" / "test1.tar.xz"


def extract(folder: Path) -> Path:
    with tarfile.open(ARCHIVE) as archive:
        extract_data(archive, folder)
    return folder / "test1"


def matrix_of_the_run(folder: Path) -> Path:
    """The repository's matrix as the run was judged by: its CPU_MLA cell ran the tiny DeepSeek-V2 before it was
    trained (it scored 0), so that workload has no accuracy floor here."""
    folder.mkdir()
    for toml in (Path(__file__).parents[1] / "matrix").glob("*.toml"):
        (folder / toml.name).write_text(toml.read_text(encoding="utf-8"), encoding="utf-8")
    workloads = (folder / "workloads.toml").read_text(encoding="utf-8")
    head, mla = workloads.split("[workloads.tiny-deepseek-v2]\n", 1)
    kept = [line for line in mla.splitlines(keepends=True) if not line.startswith("expected_accuracy")]
    assert len(kept) == len(mla.splitlines(keepends=True)) - 1
    (folder / "workloads.toml").write_text(head + "[workloads.tiny-deepseek-v2]\n" + "".join(kept), encoding="utf-8")
    return folder
