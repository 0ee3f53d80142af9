"""The cells job's vLLM wheels: each side's per-commit wheel, where vLLM published one.

    MERGE_BASE=<sha> HEAD_SHA=<sha> WHEELS_DIR=/tmp/w python ci/fetch_vllm_wheels.py

vLLM builds a wheel of every commit of its main branch and serves it as a package index per commit
(https://wheels.vllm.ai/<commit>/, vLLM's installation docs). A side run from its own wheel runs its own compiled
kernels; the Python-over-the-release overlay is only right where the release was built from the same compiled
sources. For the merge base (a main commit) the wheel normally exists; for a pull request's head it normally does
not. Each wheel found is downloaded (no dependencies) and named to the job in $GITHUB_ENV as
KVGATE_VLLM_BASE_WHEEL / KVGATE_VLLM_HEAD_WHEEL, which ci/cell_job.py prefers to the side's source overlay. A
head without a wheel is said (::notice::) and runs its Python changes since the merge base over the merge base's
wheel; without the merge base's wheel both sides go over the installed release, which kvgate refuses, naming the
files, where the release's compiled sources are not the merge base's. $KVGATE_VLLM_WHEEL_INDEX replaces the index root (a mirror).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run isolated (python -I), Python puts no folder there
import step_files
from ci_facts import workflow_command

INDEX = "https://wheels.vllm.ai"
SHA = re.compile(r"[0-9a-f]{40}")
SIDES = (("BASE", "MERGE_BASE"), ("HEAD", "HEAD_SHA"))


def download(index: str, commit: str, folder: Path, timeout: float = 300) -> Path | None:
    """vLLM's wheel of `commit` from its per-commit index, or None where there is none (or the index is down)."""
    folder.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--pre", "--only-binary", ":all:",
         "--index-url", f"{index.rstrip('/')}/{commit}/", "--dest", str(folder), "vllm"],
        capture_output=True, text=True, timeout=timeout, check=False)
    wheels = sorted(folder.glob("vllm-*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        return None
    return wheels[0]


def main(environ: dict[str, str] = os.environ) -> int:  # type: ignore[assignment]
    index = environ.get("KVGATE_VLLM_WHEEL_INDEX", "") or INDEX
    folder = Path(environ.get("WHEELS_DIR", "") or "vllm-wheels").resolve()
    lines = []
    for side, variable in SIDES:
        commit = environ.get(variable, "").strip().lower()
        if not SHA.fullmatch(commit):
            print(workflow_command("error", f"${variable}: {commit[:60]!r} is not a full 40-character commit SHA"))
            return 2
        try:
            wheel = download(index, commit, folder / side.lower())
        except subprocess.TimeoutExpired:
            wheel = None
        if wheel is None:
            print(workflow_command("notice", f"no vLLM wheel of {commit[:12]} ({side.lower()}) at {index}/{commit}/: "
                                             "that side runs its checkout's Python over the installed release, where "
                                             "the release is built from the same compiled sources"))
            continue
        print(f"vLLM wheel of {commit[:12]} ({side.lower()}): {wheel.name}")
        lines.append(f"KVGATE_VLLM_{side}_WHEEL={wheel}\n")
    try:  # the wheels downloaded stay where they are
        step_files.append("GITHUB_ENV", environ.get("GITHUB_ENV", ""), "".join(lines))
    except step_files.StepFileError as error:
        print(workflow_command("error", str(error)))
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
