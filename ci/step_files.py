"""GitHub Actions' step files ($GITHUB_OUTPUT, $GITHUB_STEP_SUMMARY, $GITHUB_ENV): appended to, never read.

The runner gives each step a fresh regular file; run by hand, a variable may name anything. A folder, a file in a
folder that does not exist or cannot be written, a full disk: each is one StepFileError naming the variable, the
path and the fix, which each script prints as its one `ERROR` line, never a traceback. A FIFO that nobody reads would
block the open for ever: it is opened without waiting (O_NONBLOCK) and refused, then written as a blocking file
(a pipe with a reader, `/dev/stdout`, still works). What the file held is never touched: it is opened to append.
Stdlib only: ci/plan.py, ci/gate_job.py, ci/fetch_baseline.py, ci/pr_comment.py and ci/fetch_vllm_wheels.py import
it with a bare python3 (the comment workflow checks out ci/ without src/).
"""

from __future__ import annotations

import errno
import os


class StepFileError(Exception):
    """A step file cannot be appended to; the message is one line naming the variable, the path and the fix."""


def _why(error: OSError) -> str:
    if error.errno == errno.EISDIR:
        return "it is a folder"
    if error.errno == errno.ENXIO:
        return "it is a FIFO or socket that nothing reads"
    return error.strerror or str(error)


def append(variable: str, path: str | None, text: str) -> None:
    """Append `text` to the file $`variable` names (`path`, its value); nothing when the variable is unset or empty."""
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
        with open(fd, "a", encoding="utf-8") as handle:  # it owns fd from here: closed on any error
            os.set_blocking(fd, True)
            handle.write(text)
    except OSError as error:
        shown = path if path.isprintable() else ascii(path)
        raise StepFileError(f"${variable} {shown[:200]}: cannot append to it ({_why(error)}). Point it at a file this "
                            "job may write (GitHub Actions sets it for each step), or unset it") from None
