"""Unpacking the tests' own fixture archives (tests/fixtures/*.tar.xz) on every Python kvgate supports.

tarfile's extraction filters (`filter="data"`) came with Python 3.11.4 (and 3.12); Debian 12's python3 is 3.11.2
and has none, so there the archives are unpacked without one. They are this repository's own files, and each
member is checked first to stay inside the folder, as the data filter would.
"""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from pathlib import Path


def unpack(archive: tarfile.TarFile, folder: Path, members: Sequence[tarfile.TarInfo] | None = None) -> None:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(folder, members=members, filter="data")
        return
    root = Path(folder).resolve()
    for member in members if members is not None else archive.getmembers():
        target = (root / member.name).resolve()
        if not (member.isfile() or member.isdir()) or root not in (target, *target.parents):
            raise ValueError(f"{member.name}: not a plain file or folder inside {root}")
    archive.extractall(folder, members=members)
