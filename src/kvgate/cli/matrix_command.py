"""`kvgate matrix`: print the cells, as a table for people or as a GitHub Actions matrix."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvgate import EXIT_FAILED, EXIT_OK, InputError
from kvgate.matrix import cells as matrix_module
from kvgate.matrix.views import cells_table, gha_matrix

HELP = "print the matrix's cells (a table, or {\"include\": [...]} for GitHub Actions)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("table", "gha", "ids"), default="table",
                        help="table for people; gha for strategy.matrix; ids one cell id per line")
    add_filter_arguments(parser)
    parser.add_argument("--changed-files", metavar="FILE", type=Path,
                        help="a file listing changed paths (one per line, e.g. `git diff --name-only`); "
                             "keeps only cells whose backend's sources match (shared code keeps all)")
    parser.add_argument("--changed-by-vllm", metavar="SPEC",
                        help="keep only the cells a vLLM change can affect: patch:PATH (its files), source:PATH[@BASE] "
                             "(the checkout's diff against BASE, both sides of renames) or wheel:PATH")
    parser.add_argument("--check-vllm", action="store_true",
                        help="compare declared support with the installed vLLM's backend classes")


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix-dir", type=Path, default=None, help="default: the repository's matrix/")
    parser.add_argument("--arch", action="append", default=[], help="keep this arch (repeatable)")
    parser.add_argument("--backend", action="append", default=[], help="keep this backend (repeatable)")
    parser.add_argument("--kv-cache-dtype", action="append", default=[], help="keep this kv dtype (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="keep this cell id (repeatable)")


def read_changed_files(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise InputError(str(path), f"cannot read the changed-files list: {error.strerror}",
                         hint="Pass the output of `git diff --name-only BASE...HEAD` saved to a file") from None


def selected_cells(args: argparse.Namespace) -> tuple[matrix_module.Matrix, list[matrix_module.Cell]]:
    matrix = matrix_module.load(args.matrix_dir)
    changed = read_changed_files(args.changed_files) if getattr(args, "changed_files", None) else None
    if getattr(args, "changed_by_vllm", None):
        from kvgate.change.overlay import changed_paths_of
        from kvgate.change.spec import parse_spec

        changed = [*(changed or []), *changed_paths_of(parse_spec(args.changed_by_vllm, "--changed-by-vllm"))]
    cells = matrix.select(archs=args.arch, backends=args.backend, kv_cache_dtypes=args.kv_cache_dtype,
                          cell_ids=args.cell, changed_files=changed)
    return matrix, cells


def run(args: argparse.Namespace) -> int:
    matrix, cells = selected_cells(args)
    if args.check_vllm:
        from kvgate.change.declared_support import check_installed_vllm, format_report

        report = check_installed_vllm(matrix)
        print(format_report(report))
        return EXIT_FAILED if report.disagreements else EXIT_OK
    if args.format == "gha":
        print(json.dumps(gha_matrix(matrix, cells), separators=(",", ":")))
    elif args.format == "ids":
        print("\n".join(cell.id for cell in cells))
    else:
        print(cells_table(matrix, cells))
    if not cells:
        print("kvgate: no cell matches these filters", file=sys.stderr)
    return EXIT_OK
