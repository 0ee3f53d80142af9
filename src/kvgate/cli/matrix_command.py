"""`kvgate matrix`: print the cells, as a table for people, a GitHub Actions matrix or a Buildkite pipeline
(kvgate.matrix.buildkite; ci/buildkite/README.md).

With a change, only the cells it can affect (kvgate.change.selection, from vLLM's own import graph):
    kvgate matrix --changed-by-vllm patch:fix.diff --explain          a change to the installed release
    kvgate matrix --vllm-git ../vllm --vllm-base B --vllm-head H       a vLLM pull request (both sides from git)
    kvgate matrix --changed-files changed.txt [--vllm-tree DIR]        listed paths, the graph of DIR (default: the
                                                                       pinned release's sources, which it says)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path, PurePosixPath

from kvgate import EXIT_FAILED, EXIT_OK, PATH_CONTROL_CHARACTERS, InputError
from kvgate.matrix import cells as matrix_module
from kvgate.matrix.views import cells_table, gha_matrix, nearest_cells

REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout: its .nox/_engine-cpu and ci/locks
MAX_CHANGED_FILES_BYTES = 256 * 1024 * 1024  # vLLM's whole tree is a few hundred kB of paths
HELP = "print the matrix's cells (a table, {\"include\": [...]} for GitHub Actions, or a Buildkite pipeline)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("table", "gha", "ids", "buildkite", "buildkite-vllm"), default="table",
                        help="table for people; gha for strategy.matrix; ids one cell id per line; buildkite a "
                             "pipeline for `buildkite-agent pipeline upload` (the cells, a wait, the gate); "
                             "buildkite-vllm a vLLM .buildkite/test_areas/ file whose step uploads that pipeline")
    parser.add_argument("--kvgate-repository", metavar="URL", default="",
                        help="required with --format buildkite and buildkite-vllm: the kvgate git repository the "
                             "steps clone")
    parser.add_argument("--kvgate-ref", metavar="SHA", default="",
                        help="required with --format buildkite and buildkite-vllm: the kvgate commit the steps run "
                             "(a full SHA)")
    add_filter_arguments(parser)
    parser.add_argument("--changed-files", metavar="FILE", type=Path,
                        help="a file listing changed vLLM paths (one per line, or NUL-separated): keep the cells they "
                             "can affect")
    parser.add_argument("--changed-by-vllm", metavar="SPEC",
                        help="keep only the cells a vLLM change can affect: patch:PATH, source:PATH[@BASE] or wheel:PATH, "
                             "against the installed release")
    parser.add_argument("--vllm-git", metavar="DIR", type=Path,
                        help="a vLLM git checkout: read both sides of the change from it (--vllm-base, --vllm-head); the "
                             "changed paths are its diff unless --changed-files lists them")
    parser.add_argument("--vllm-base", metavar="REV",
                        help="with --vllm-git: the commit the change starts from; required with --format buildkite: "
                             "the merge base the cells' base side runs (a full SHA)")
    parser.add_argument("--vllm-head", metavar="REV", help="with --vllm-git: the commit of the change")
    parser.add_argument("--vllm-tree", metavar="DIR", type=Path,
                        help="with --changed-files: the vLLM source whose import graph decides (a checkout, or a folder "
                             "holding the vllm package); default the pinned release's sources: this Python's vLLM, the "
                             "CPU engine environment's, or a cached download of the release ci/locks pins")
    parser.add_argument("--explain", action="store_true",
                        help="say why each cell was selected (the changed path and its import chain) and what each "
                             "path selected (stderr with --format gha/ids)")
    parser.add_argument("--explain-file", metavar="FILE", type=Path,
                        help="write that explanation as Markdown to FILE (the plan job's step summary)")
    parser.add_argument("--check-vllm", action="store_true",
                        help="compare declared support with the installed vLLM's backend classes")


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix-dir", type=Path, default=None, help="default: the repository's matrix/")
    parser.add_argument("--arch", action="append", default=[], help="keep this arch (repeatable)")
    parser.add_argument("--backend", action="append", default=[], help="keep this backend (repeatable)")
    parser.add_argument("--kv-cache-dtype", action="append", default=[], help="keep this kv dtype (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="keep this cell id (repeatable)")


def read_changed_files(path: Path) -> list[str]:
    """One path a line, or NUL-separated (`git diff -z --name-only`) when the file holds a NUL."""
    try:
        with open(path, "rb") as handle:  # a pipe too: --changed-files <(git diff --name-only ...)
            data = handle.read(MAX_CHANGED_FILES_BYTES + 1)
    except OSError as error:
        raise InputError(str(path), f"cannot read the changed-files list: {error.strerror}",
                         hint="Pass the output of `git diff --name-only BASE...HEAD` saved to a file") from None
    if len(data) > MAX_CHANGED_FILES_BYTES:  # /dev/zero was read to the end of memory
        raise InputError(str(path), f"the changed-files list is more than {MAX_CHANGED_FILES_BYTES} bytes",
                         hint="Pass the output of `git diff --name-only BASE...HEAD` saved to a file")
    text = data.decode("utf-8", "surrogateescape")
    parts = text.split("\0") if "\0" in text else text.splitlines()
    paths = [p.strip().removeprefix("./") for p in parts if p.strip()]
    if not paths:  # what a failed `git diff > FILE` leaves: planning no cell from it would pass the change unseen
        raise InputError(str(path), "the changed-files list names no path",
                         hint="Pass the output of `git diff --name-only BASE...HEAD`, or leave out --changed-files "
                              "for every cell")
    for line, changed in enumerate(paths, 1):
        pure = PurePosixPath(changed)
        if pure.is_absolute() or ".." in pure.parts or "\\" in changed or PATH_CONTROL_CHARACTERS.search(changed):
            # `docs/../vllm/x.py` would match docs/** (inert) and plan no cell for a change to vllm/x.py
            raise InputError(str(path), f"unsafe path {ascii(changed)[:120]}", f"path {line}",
                             "List paths relative to the repository root, as `git diff --name-only` writes them")
    return paths


def no_cell_error(where: str, matrix, *, archs=(), backends=(), kv_cache_dtypes=(), cell_ids=()) -> InputError:
    """Filters that select no cell: exit 2, naming the nearest cells."""
    near = nearest_cells(matrix.cells, archs=archs, backends=backends, kv_cache_dtypes=kv_cache_dtypes,
                         cell_ids=cell_ids)
    return InputError(where, "no cell matches these filters",
                      hint=f"Nearest: {', '.join(near)}; list them all with `kvgate matrix`" if near
                      else "List them all with `kvgate matrix`")


def no_cell_error_for(where: str, matrix, args: argparse.Namespace) -> InputError:
    return no_cell_error(where, matrix, archs=args.arch, backends=args.backend, kv_cache_dtypes=args.kv_cache_dtype,
                         cell_ids=args.cell)


def selected_cells(args: argparse.Namespace):
    """(matrix, the selected cells, the change's Selection or None when no change was given)."""
    matrix = matrix_module.load(args.matrix_dir)
    cells = matrix.select(archs=args.arch, backends=args.backend, kv_cache_dtypes=args.kv_cache_dtype,
                          cell_ids=args.cell)
    changed_files = getattr(args, "changed_files", None)
    spec, repo = getattr(args, "changed_by_vllm", None), getattr(args, "vllm_git", None)
    if not (changed_files or spec or repo):
        return matrix, cells, None
    from kvgate.change import code_sides
    from kvgate.change.selection import changed_modules, select

    listed = read_changed_files(changed_files) if changed_files else None
    tree_given = getattr(args, "vllm_tree", None)
    if repo is not None:
        if not (args.vllm_base and args.vllm_head):
            raise InputError("--vllm-git", "needs --vllm-base and --vllm-head", hint="Name the two commits of the change")
        changed, base, head = code_sides.from_git(repo, args.vllm_base, args.vllm_head, listed, matrix)
        tree = f"the vLLM git checkout {repo} at {args.vllm_base} (base) and {args.vllm_head} (head)"
    elif spec:
        release = pinned_release()
        changed, base, head = code_sides.from_spec(spec, matrix, release=release_of(release))
        changed = [*changed, *(listed or [])]
        tree = f"{release.described}, changed by {spec}"
    elif tree_given is not None:
        changed, base, head = code_sides.from_folder(tree_given, listed or [], matrix)
        tree = f"the vLLM tree {tree_given} (--vllm-tree)"
    elif not changed_modules(listed or []):
        changed, base, head = list(listed or []), None, None
        tree = "none: no changed path is a module of the vllm package, so no import graph was needed"
    else:
        release = pinned_release()
        changed, base, head = code_sides.from_folder(release.root, listed or [], matrix)
        tree = f"{release.described} (no --vllm-tree given)"
    selection = select(matrix, changed, cells, base=base, head=head)
    selection.tree = tree
    print(f"kvgate: selection read {tree}", file=sys.stderr)
    return matrix, selection.cells, selection


def pinned_release():
    """The pinned release's sources when no vLLM tree was given (kvgate.runners.environment.release_sources)."""
    from kvgate.change.vllm_tree import installed_vllm_root
    from kvgate.runners.environment.engine_venv import EngineEnvError
    from kvgate.runners.environment.release_sources import find_release_tree

    try:
        return find_release_tree(REPO_ROOT, this_python=installed_vllm_root(),
                                 log=lambda line: print(line, file=sys.stderr, flush=True))
    except EngineEnvError as error:
        raise InputError("kvgate matrix", f"no vLLM sources to read the import graph from: {error}") from None


def release_of(tree):
    from kvgate.change.overlay import Release

    return Release(version=tree.version, distribution_version=tree.distribution_version, package_dir=tree.root / "vllm")


def gha_extras(cells, selection) -> dict[str, dict]:
    """Per cell, what the plan adds to its matrix entry: the stages planned (each required at the gate), why others
    were not, and the changed path that selected it."""
    from kvgate.runners.stage_plan import planned_stages

    extras = {}
    for cell in cells:
        stages, not_planned = planned_stages(cell)
        extra: dict = {"stages": list(stages)}
        if not_planned:
            extra["not_planned"] = not_planned
        if selection is not None and cell.id in selection.reasons:
            extra["selected_by"] = selection.reasons[cell.id].path
        extras[cell.id] = extra
    return extras


def buildkite_document(args: argparse.Namespace, matrix, cells, selection) -> dict:
    """--format buildkite: the pipeline of the cells planned as for GitHub Actions (the same selection), a wait and
    the gate; --format buildkite-vllm: the vLLM step file that uploads it. JSON, which Buildkite reads as YAML."""
    from kvgate.matrix import buildkite

    run = buildkite.BuildkiteRun(kvgate_repository=args.kvgate_repository, kvgate_ref=args.kvgate_ref,
                                 merge_base=args.vllm_base or "")
    queues = buildkite.load_queues(args.matrix_dir or matrix_module.default_matrix_dir(), matrix)
    if args.format == "buildkite-vllm":
        return buildkite.vllm_step_file(matrix, queues, run)
    return check_pipeline(buildkite.pipeline(gha_matrix(matrix, cells, gha_extras(cells, selection)), queues, run))


BUILDKITE_SCHEMA = Path(matrix_module.__file__).resolve().parent / "buildkite_schema.json"


def check_pipeline(document: dict) -> dict:
    """The pipeline, validated again against Buildkite's published pipeline schema (ci/buildkite/schema/, shipped with
    kvgate as kvgate/matrix/buildkite_schema.json) before it is printed: a pipeline Buildkite would refuse, or that a
    changed path bent out of shape, is one ERROR line, never an upload."""
    import jsonschema
    from jsonschema.exceptions import best_match

    try:
        schema = json.loads(BUILDKITE_SCHEMA.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InputError(str(BUILDKITE_SCHEMA), f"cannot read Buildkite's pipeline schema ({error})",
                         hint="Reinstall kvgate (it ships ci/buildkite/schema/schema.json)") from None
    error = best_match(jsonschema.Draft7Validator(schema).iter_errors(document))
    if error is not None:
        place = "/".join(map(str, error.absolute_path)) or "the top level"
        raise InputError("kvgate matrix --format buildkite", f"the pipeline breaks Buildkite's schema: "
                         f"{' '.join(error.message.split())[:200]}", place, "Report it: kvgate emitted a pipeline Buildkite would refuse")
    return document


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    matrix, cells, selection = selected_cells(args)
    if args.check_vllm:
        from kvgate.change.declared_support import check_installed_vllm, format_report

        report = check_installed_vllm(matrix)
        print(format_report(report))
        return EXIT_FAILED if report.disagreements else EXIT_OK
    filtered = bool(args.arch or args.backend or args.kv_cache_dtype or args.cell)
    if not cells and filtered and selection is None:
        raise no_cell_error_for("kvgate matrix", matrix, args)
    if args.format == "gha":
        print(json.dumps(gha_matrix(matrix, cells, gha_extras(cells, selection)), separators=(",", ":")))
    elif args.format in ("buildkite", "buildkite-vllm"):
        print(json.dumps(buildkite_document(args, matrix, cells, selection), indent=2))
    elif args.format == "ids":
        print("\n".join(cell.id for cell in cells))
    else:
        print(cells_table(matrix, cells))
    if selection is not None:
        seconds = time.monotonic() - started
        lines = [f"kvgate: {len(selection.paths)} changed paths select {len(cells)} cells ({seconds:.1f} s)",
                 *selection.explain()]
        if args.explain:
            stream = sys.stdout if args.format == "table" else sys.stderr
            print("\n".join(lines), file=stream)
        if args.explain_file is not None:
            try:  # a path git gave as bytes that are not UTF-8 is written escaped, not a UnicodeEncodeError
                args.explain_file.write_text(selection.markdown(seconds), encoding="utf-8", errors="backslashreplace")
            except OSError as error:
                raise InputError(str(args.explain_file), f"cannot write the explanation: {error.strerror or error}",
                                 hint="Pass --explain-file a path in a folder that exists") from None
    return EXIT_OK
