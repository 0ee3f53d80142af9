"""Reading a file kvgate did not write: a regular file only, and never more than a cap.

A FIFO blocks its reader and /dev/zero never ends, so neither is read: the kind of what a path names (links
followed) is checked before it is opened, and again on the open descriptor, in case the name was swapped in between
(the open itself does not block: O_NONBLOCK). At most `max_bytes` + 1 bytes are read, so a runaway or hostile file is
refused rather than read into memory. The results folder's readers share this with change/'s readers of a vLLM
tree and a source: checkout; each words its own error, naming its own file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotRegularFile(Exception):
    """The path names a folder, FIFO, socket or device: never read."""

    def __init__(self, path: Path | str, kind: str):
        super().__init__(f"{path} is not a regular file ({kind})")
        self.kind = kind  # "a folder" or "a FIFO, socket or device"


class FileTooLarge(Exception):
    """The file holds more than the cap; only the cap and one byte were read."""

    def __init__(self, path: Path | str, max_bytes: int):
        super().__init__(f"{path} is more than {max_bytes} bytes")
        self.max_bytes = max_bytes


def kind(info: os.stat_result) -> str | None:
    """None for a regular file, else what the path is, in words."""
    if stat.S_ISREG(info.st_mode):
        return None
    return "a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO, socket or device"


def read_bytes(path: Path | str, max_bytes: int, *, info: os.stat_result | None = None) -> bytes:
    """The bytes of the regular file at `path` (a link is followed), at most `max_bytes`. `info`: its os.stat()
    when the caller has it. Raises NotRegularFile, FileTooLarge, or the OSError of the stat, open or read (a dangling
    link, a loop, a permission)."""
    info = os.stat(path) if info is None else info
    if (what := kind(info)) is not None:
        raise NotRegularFile(path, what)
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
        if (what := kind(os.fstat(handle.fileno()))) is not None:
            raise NotRegularFile(path, what)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLarge(path, max_bytes)
    return data
