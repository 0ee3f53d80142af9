"""ci/fetch_vllm_wheels.py: each side's per-commit vLLM wheel where the index has one, against a local index laid
out as vLLM's (https://wheels.vllm.ai/<commit>/vllm/), through real pip."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE, HEAD = "a" * 40, "b" * 40


def per_commit_index(root: Path, commit: str, version: str) -> None:
    """A PEP 503 page for `vllm` under <root>/<commit>/ holding one wheel (metadata only)."""
    folder = root / commit / "vllm"
    folder.mkdir(parents=True)
    name = f"vllm-{version}-cp38-abi3-manylinux1_x86_64.whl"
    with zipfile.ZipFile(folder / name, "w") as wheel:
        info = f"vllm-{version}.dist-info"
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                                        "Tag: cp38-abi3-manylinux1_x86_64\n")
        wheel.writestr(f"{info}/RECORD", "")
        wheel.writestr("vllm/__init__.py", f"__version__ = '{version}'\n")
    (folder / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>\n')
    (root / commit / "index.html").write_text('<html><body><a href="vllm/">vllm</a></body></html>\n')


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_FIND_LINKS": "", "PIP_NO_INDEX": "",
               "GITHUB_ENV": str(tmp_path / "github_env"), "WHEELS_DIR": str(tmp_path / "wheels"), **env}
    return subprocess.run([sys.executable, "ci/fetch_vllm_wheels.py"], cwd=ROOT, env=environ, capture_output=True,
                          text=True, check=False, timeout=300)


def test_the_merge_bases_wheel_is_named_to_the_job_and_a_head_without_one_keeps_its_overlay(tmp_path):
    index = tmp_path / "index"
    per_commit_index(index, BASE, "0.27.0.dev12+gaaaaaaa")
    result = run(tmp_path, MERGE_BASE=BASE, HEAD_SHA=HEAD, KVGATE_VLLM_WHEEL_INDEX=index.as_uri())
    assert result.returncode == 0, result.stdout + result.stderr
    wheel = tmp_path / "wheels" / "base" / "vllm-0.27.0.dev12+gaaaaaaa-cp38-abi3-manylinux1_x86_64.whl"
    assert wheel.is_file()
    assert (tmp_path / "github_env").read_text() == f"KVGATE_VLLM_BASE_WHEEL={wheel}\n"
    assert f"::notice::no vLLM wheel of {HEAD[:12]} (head)" in result.stdout


def test_both_wheels_and_a_bad_commit(tmp_path):
    index = tmp_path / "index"
    per_commit_index(index, BASE, "0.27.0.dev12+gaaaaaaa")
    per_commit_index(index, HEAD, "0.27.0.dev13+gbbbbbbb")
    result = run(tmp_path, MERGE_BASE=BASE, HEAD_SHA=HEAD, KVGATE_VLLM_WHEEL_INDEX=index.as_uri())
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "github_env").read_text().splitlines() == [
        f"KVGATE_VLLM_BASE_WHEEL={tmp_path}/wheels/base/vllm-0.27.0.dev12+gaaaaaaa-cp38-abi3-manylinux1_x86_64.whl",
        f"KVGATE_VLLM_HEAD_WHEEL={tmp_path}/wheels/head/vllm-0.27.0.dev13+gbbbbbbb-cp38-abi3-manylinux1_x86_64.whl"]
    bad = run(tmp_path, MERGE_BASE="main", HEAD_SHA=HEAD, KVGATE_VLLM_WHEEL_INDEX=index.as_uri())
    assert bad.returncode == 2 and "::error::$MERGE_BASE: 'main' is not a full 40-character commit SHA" in bad.stdout


def test_a_job_environment_file_that_cannot_be_written_is_one_error_line(tmp_path):
    """$GITHUB_ENV naming a folder was an IsADirectoryError traceback once a wheel was found."""
    index = tmp_path / "index"
    per_commit_index(index, BASE, "0.27.0.dev12+gaaaaaaa")
    (tmp_path / "folder").mkdir()
    result = run(tmp_path, MERGE_BASE=BASE, HEAD_SHA=HEAD, KVGATE_VLLM_WHEEL_INDEX=index.as_uri(),
                 GITHUB_ENV=str(tmp_path / "folder"))
    assert (result.returncode, result.stderr) == (2, "")
    assert result.stdout.splitlines()[-1] == (
        f"::error::$GITHUB_ENV {tmp_path}/folder: cannot append to it (it is a folder). Point it at a file this job may "
        "write (GitHub Actions sets it for each step), or unset it")
