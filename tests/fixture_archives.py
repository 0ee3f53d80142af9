"""Unpacking the recorded runs under tests/fixtures (tar.xz) on every Python kvgate supports.

tarfile's `filter="data"` (which refuses links out of the folder, absolute paths and device files) came with
CPython 3.11.4 and 3.12; Debian 12's python3 is 3.11.2, without it. There the same rule is checked here, member by
member, before extracting: only files and folders, each inside the destination.
"""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath


def extract_data(archive: tarfile.TarFile, destination: Path, members: Sequence[tarfile.TarInfo] | None = None) -> None:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(destination, members=members, filter="data")
        return
    chosen = list(members) if members is not None else archive.getmembers()
    for member in chosen:
        name = PurePosixPath(member.name)
        if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"{member.name}: not a plain file or folder inside the archive's folder")
    archive.extractall(destination, members=chosen)
