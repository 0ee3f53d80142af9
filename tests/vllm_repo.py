"""A vLLM git repository made from the engine environment's installed vLLM (its Python sources as one commit), for
the plan job's tests and benchmarks/plan_time.py: the real tree, so the import graph is vLLM's own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kvgate.change.vllm_tree import installed_vllm_root

GIT = ("-c", "user.email=kvgate@example.invalid", "-c", "user.name=kvgate", "-c", "commit.gpgsign=false")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *GIT, *args], capture_output=True, text=True, check=True).stdout


def make(folder: Path) -> Path | None:
    """A repository whose one commit holds the installed vLLM's .py files under vllm/ and a README; None without
    an installed vLLM."""
    root = installed_vllm_root()
    if root is None:
        return None
    repo = folder / "vllm-repo"
    shutil.copytree(root / "vllm", repo / "vllm", ignore=lambda d, names: [
        n for n in names if n == "__pycache__" or (Path(d, n).is_file() and not n.endswith(".py"))])
    (repo / "README.md").write_text("vLLM\n", encoding="utf-8")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base: the installed vLLM")
    return repo


def commit_change(repo: Path, edits: dict[str, str], message: str = "head") -> str:
    """Append each edit's text to its file (creating it), commit, and return the new commit."""
    for path, text in edits.items():
        target = repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD").strip()
