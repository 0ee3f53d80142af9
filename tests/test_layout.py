"""The package's layout is the data flow, and the imports keep to it.

    matrix -> runners / kernels (beside them: workloads) -> results -> gate -> report, with the CLI on top.

Each stage may import only the stages before it; the pure core (matrix, results, gate, report) imports no
engine at all, not even inside a function; and no module reaches into another module's private names. The
rules are read from the source with `ast`, so a new import cannot slip past them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kvgate"

ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"


def import_rules(text: str) -> dict[str, set[str]]:
    """stage -> the stages it may import, from the table "What each folder may import" of docs/architecture.md."""
    section = text.split("## What each folder may import", 1)[1].split("\n## ", 1)[0]
    rules = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) == 2:
            rules[cells[0].strip("`")] = set() if cells[1] == "nothing" else {c.strip(" `") for c in cells[1].split(",")}
    return rules


# stage -> the stages it may import (the package root, kvgate itself, is open to all: version and errors)
MAY_IMPORT = import_rules(ARCHITECTURE.read_text(encoding="utf-8"))
PURE_CORE = ("matrix", "results", "statistics", "gate", "report")
ENGINES = ("vllm", "torch", "lm_eval", "transformers", "flashinfer", "triton", "tokenizers", "safetensors")


def modules(stage: str | None = None) -> list[Path]:
    root = PACKAGE / stage if stage else PACKAGE
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def imports(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names) of every import in the file, those inside functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}:{node.lineno}: relative import; kvgate imports by absolute name")
    return found


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "kvgate" and len(parts) > 1 else None


def shown(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_the_package_root_holds_the_stages_and_nothing_else():
    entries = {p.name for p in PACKAGE.iterdir()  # a folder left with only bytecode after a move is no module
               if p.name != "__pycache__" and (p.is_file() or any(p.rglob("*.py")))}
    assert entries == {*MAY_IMPORT, "__init__.py", "__main__.py"}


@pytest.mark.parametrize("stage", sorted(MAY_IMPORT))
def test_each_stage_opens_with_what_it_owns_and_what_it_must_never_import(stage):
    docstring = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text(encoding="utf-8")))
    assert docstring, f"kvgate/{stage}/__init__.py has no docstring"
    if stage != "cli":
        assert "never import" in docstring, f"kvgate/{stage}/__init__.py does not say what it must never import"


@pytest.mark.parametrize("stage", sorted(MAY_IMPORT))
def test_a_stage_imports_only_the_stages_before_it(stage):
    wrong = []
    for path in modules(stage):
        for line, module, names in imports(path):
            targets = {stage_of(module)} if module != "kvgate" else {
                n for n in names if (PACKAGE / n).is_dir()}  # `from kvgate import matrix` names a stage
            for target in targets - {None, stage}:
                if target not in MAY_IMPORT[stage]:
                    wrong.append(f"{shown(path)}:{line} imports kvgate.{target}")
    assert not wrong, f"kvgate.{stage} may import only {sorted(MAY_IMPORT[stage])}:\n" + "\n".join(wrong)


def test_the_package_root_imports_no_stage():
    assert [m for _, m, _ in imports(PACKAGE / "__init__.py") if m.startswith("kvgate")] == []


@pytest.mark.parametrize("stage", PURE_CORE)
def test_the_pure_core_imports_no_engine(stage):
    wrong = [f"{shown(path)}:{line} imports {module}"
             for path in modules(stage) for line, module, _ in imports(path)
             if module.split(".")[0] in ENGINES]
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_modules_private_names():
    wrong = []
    for path in modules():
        for line, module, names in imports(path):
            if not module.startswith("kvgate"):
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            private_parts = [p for p in module.split(".") if p.startswith("_") and not p.startswith("__")]
            if private or private_parts:
                wrong.append(f"{shown(path)}:{line} from {module} import {', '.join(names)}")
    assert not wrong, "\n".join(wrong)


def test_the_rules_catch_a_forbidden_import(tmp_path):
    """The checker itself: an engine import inside a function of a pure module is found."""
    module = tmp_path / "sneaky.py"
    module.write_text("def f():\n    from vllm import LLM\n    return LLM\n", encoding="utf-8")
    assert [(line, name) for line, name, _ in imports(module)] == [(2, "vllm")]


def test_the_rules_are_read_from_docs_architecture():
    assert MAY_IMPORT["matrix"] == set() and MAY_IMPORT["change"] == {"matrix", "results"}
    assert MAY_IMPORT["runners"] == {"matrix", "change", "results", "statistics", "workloads", "kernels"}
    assert "gate" not in MAY_IMPORT["runners"] and "runners" not in MAY_IMPORT["gate"]


MAX_LINES = 620  # "no module is much over 600 lines"
MAX_FLAT_MODULES = 13  # "about a dozen modules flat", __init__.py not counted


def test_no_module_is_much_over_600_lines():
    long = [f"{shown(p)}: {n} lines" for p in modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, "\n".join(long)


def test_no_folder_holds_more_than_about_a_dozen_modules_flat():
    folders = {p.parent for p in modules()}
    crowded = [f"{f.relative_to(PACKAGE.parent)}: {n}" for f in sorted(folders)
               if (n := len([p for p in f.glob("*.py") if p.name != "__init__.py"])) > MAX_FLAT_MODULES]
    assert not crowded, "\n".join(crowded)


def test_no_two_modules_of_one_folder_differ_only_by_a_suffix():
    clashes = []
    for folder in sorted({p.parent for p in modules()}):
        stems = sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")
        clashes += [f"{folder.relative_to(PACKAGE.parent)}: {a}, {b}" for a in stems for b in stems
                    if b != a and b.startswith(a + "_")]
    assert not clashes, "\n".join(clashes)
