"""Unpacking the shipped archives of real runs (tests/fixtures/**/*.tar.xz), safely, on every Python kvgate declares.

tarfile's "data" extraction filter (PEP 706) refuses a member that would land outside the folder: a `..` in its
path, a symlink or hard link pointing out of the folder, a device or FIFO. The standard library has it from Python
3.11.4 and 3.12; Debian 12's python3 is 3.11.2, without it, so there the same filter comes from backports.tarfile
(the standard library's later tarfile, published for older Pythons; in the CPU engine environment's lock).
On top of the filter (which would strip a leading "/" and extract the member inside the folder), an absolute
member name is refused: a shipped archive never holds one, so an archive that does is not one of ours.
"""

from __future__ import annotations

import tarfile as _stdlib_tarfile
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType


def _tarfile_with_the_data_filter() -> ModuleType:
    if hasattr(_stdlib_tarfile, "data_filter"):
        return _stdlib_tarfile
    from backports import tarfile as backported  # Python < 3.11.4

    return backported


tarfile = _tarfile_with_the_data_filter()


def refusing_filter(module: ModuleType):
    """The data filter of `module` (a tarfile), refusing absolute member names instead of stripping their "/"."""

    def refuse_absolute(member, dest_path: str):
        if member.name.startswith(("/", "\\")) or Path(member.name).is_absolute():
            raise module.AbsolutePathError(member)
        return module.data_filter(member, dest_path)

    return refuse_absolute


def extract(archive: Path, folder: Path, members: Iterable[str] | None = None, module: ModuleType = tarfile) -> Path:
    """Unpack `archive` (or only the named `members`) into `folder`; raise module.FilterError for an unsafe member."""
    with module.open(archive) as opened:
        chosen = None if members is None else [opened.getmember(name) for name in members]
        opened.extractall(folder, members=chosen, filter=refusing_filter(module))
    return folder
