"""The cell filters of `kvgate matrix`, `kvgate run` and `kvgate kernels`: backend names in any case, and filters that
select no cell refused (exit 2) with the cells nearest to them."""

from __future__ import annotations

import pytest

from kvgate.cli import main
from kvgate.matrix import cells as matrix_module
from kvgate.matrix.views import nearest_cells


def test_backend_names_are_case_insensitive(capsys):
    assert main(["matrix", "--format", "ids", "--backend", "FLASHINFER", "--arch", "sm90"]) == 0
    upper = capsys.readouterr().out.split()
    assert main(["matrix", "--format", "ids", "--backend", "flashinfer", "--arch", "sm90"]) == 0
    lower = capsys.readouterr().out.split()
    assert main(["matrix", "--format", "ids", "--backend", "FlashInfer", "--arch", "sm90"]) == 0
    mixed = capsys.readouterr().out.split()
    assert upper and upper == lower == mixed
    assert all(cell_id.startswith("flashinfer-") and cell_id.endswith("-sm90") for cell_id in upper)


@pytest.mark.parametrize("command", [["matrix"], ["kernels", "--run-dir", "unused"], ["run", "accuracy", "--run-dir", "unused"]])
def test_a_selection_of_no_cell_is_exit_2_with_the_nearest_cells(command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a run that started would write here; none may
    assert main([*command, "--backend", "flashinfer", "--arch", "cpu"]) == 2
    err = capsys.readouterr().err
    where = "kvgate " + " ".join(command[:2] if command[0] == "run" else command[:1])
    assert err == (f"ERROR {where}: no cell matches these filters. Nearest: flashinfer-fp8-sm80, flashinfer-fp8-sm89, "
                   "flashinfer-fp8-sm90, flashinfer-auto-sm80, flashinfer-auto-sm89; list them all with "
                   "`kvgate matrix`\n")
    assert list(tmp_path.iterdir()) == []


def test_nearest_cells_pass_every_filter_but_one():
    matrix = matrix_module.load(None)
    near = nearest_cells(matrix.cells, backends=["flashinfer_mla"], kv_cache_dtypes=["fp8"], archs=["sm80"])
    assert near, "the matrix has FLASHINFER_MLA FP8 cells and FP8 sm80 cells"
    for cell_id in near:
        cell = matrix.cell(cell_id)
        misses = [cell.backend != "FLASHINFER_MLA", cell.kv_cache_dtype != "fp8", cell.arch != "sm80"]
        assert sum(misses) == 1, cell_id
    assert near[0] == "flashinfer_mla-fp8-sm100"  # the spelled id flashinfer_mla-fp8-sm80 differs in one digit


def test_nearest_cells_fall_back_to_the_closest_ids():
    """No CPU cell comes within one filter of FLASHINFER on sm90: the closest ids still name some."""
    cpu_cells = [cell for cell in matrix_module.load(None).cells if cell.arch == "cpu"]
    near = nearest_cells(cpu_cells, backends=["FLASHINFER"], archs=["sm90"], limit=2)
    assert len(near) == 2 and set(near) <= {cell.id for cell in cpu_cells}
