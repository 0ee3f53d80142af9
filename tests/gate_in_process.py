"""`kvgate gate` through the CLI's own entry point in the test's process: the same arguments, files and exit code as
`python -m kvgate gate ...`, without a fresh interpreter importing kvgate, numpy and scipy for each of the many real
runs the fixture tests judge (27 of them: about 2 s each)."""

from __future__ import annotations

import contextlib
import io

from kvgate.cli import main


def gate(*argv: str) -> tuple[int, str]:
    """(exit code, what it printed on stdout and stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["gate", *argv])
    return code, out.getvalue()
