"""Stage 6 of kvgate's flow, the report: verdict -> what people and CI read (report.md, report.html,
junit.xml, verdict.json).

`render_all` is pure (file name -> bytes); `write_all` writes them into the output folder atomically:
every file goes to a temporary name first and is renamed into place only when all four are written, and
nothing else in the folder is touched. Modules: markdown (the PR comment / step summary), html (plots),
junit_xml (one test case per check). It may import the matrix, the results and the gate (the verdict); it
must never import the runners, the kernels, the workloads or the CLI, nor an engine (vLLM, torch, lm-eval).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from kvgate import InputError
from kvgate.gate.verdict import Verdict, to_dict
from kvgate.report.html import HistoryPlots, render_html
from kvgate.report.junit_xml import render_junit
from kvgate.report.markdown import headline, render_markdown, status_description

OUTPUT_FILES = ("verdict.json", "report.md", "report.html", "junit.xml")

__all__ = ["OUTPUT_FILES", "HistoryPlots", "headline", "render_all", "write_all"]


def render_all(verdict: Verdict, history: HistoryPlots | None = None) -> dict[str, bytes]:
    """Every output; report.html gains "History of main" when the CLI recorded the run there (`history`)."""
    # a lone surrogate (a folder name that is not UTF-8 reads with them) written as its escape, `\udcff`: UTF-8 has
    # no such character, and verdict.json reads the escape back as the same name
    return {
        "verdict.json": (json.dumps(verdict_record(verdict), indent=2, ensure_ascii=False, allow_nan=False)
                         + "\n").encode(errors="backslashreplace"),
        "report.md": render_markdown(verdict).encode(errors="backslashreplace"),
        "report.html": render_html(verdict, history).encode(errors="backslashreplace"),
        "junit.xml": render_junit(verdict),
    }


def verdict_record(verdict: Verdict) -> dict:
    """verdict.json: the verdict, with the commit status's description (the report's headline, <= 140 characters)."""
    record = to_dict(verdict)
    position = list(record).index("exit_status") + 1
    items = list(record.items())
    return dict([*items[:position], ("status_description", status_description(verdict)), *items[position:]])


def write_all(verdict: Verdict, out_dir: Path, history: HistoryPlots | None = None) -> dict[str, Path]:
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(str(out_dir), f"cannot create the output folder: {error.strerror or error}",
                         hint="Pass a writable --out folder") from None
    rendered = render_all(verdict, history)
    temporary: dict[str, str] = {}
    try:
        for name, data in rendered.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out_dir)
            temporary[name] = tmp
            os.fchmod(fd, 0o644)  # mkstemp makes 0600; an artifact uploader running as another user reads these
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        paths = {}
        for name, tmp in temporary.items():
            os.replace(tmp, out_dir / name)
            paths[name] = out_dir / name
        return paths
    except OSError as error:
        for tmp in temporary.values():
            Path(tmp).unlink(missing_ok=True)
        raise InputError(str(out_dir), f"cannot write the gate's outputs: {error.strerror or error}",
                         hint="Pass a writable --out folder") from None
