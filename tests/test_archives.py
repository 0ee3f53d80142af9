"""The shipped runs unpack on every declared Python, and an archive that would write outside its folder is refused."""

from __future__ import annotations

import io
import sys
import tarfile as stdlib_tarfile
from pathlib import Path

import pytest

import archives


def _implementations() -> list:
    found = []
    if hasattr(stdlib_tarfile, "data_filter"):
        found.append(pytest.param(stdlib_tarfile, id="stdlib"))
    else:
        found.append(pytest.param(None, id="stdlib", marks=pytest.mark.skip(
            reason=f"this Python ({sys.version.split()[0]}) has no tarfile data filter (3.11.4 and later have it)")))
    try:
        from backports import tarfile as backported
    except ImportError:
        found.append(pytest.param(None, id="backports", marks=pytest.mark.skip(reason="backports.tarfile is not installed")))
    else:
        found.append(pytest.param(backported, id="backports"))
    return found


IMPLEMENTATIONS = _implementations()


def _file(name: str, text: bytes = b"x") -> tuple[stdlib_tarfile.TarInfo, bytes]:
    info = stdlib_tarfile.TarInfo(name)
    info.size = len(text)
    return info, text


def _link(name: str, target: str, kind: bytes = stdlib_tarfile.SYMTYPE) -> tuple[stdlib_tarfile.TarInfo, None]:
    info = stdlib_tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _device(name: str) -> tuple[stdlib_tarfile.TarInfo, None]:
    info = stdlib_tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = stdlib_tarfile.CHRTYPE, 1, 3
    return info, None


def write_archive(path: Path, entries) -> Path:
    with stdlib_tarfile.open(path, "w:xz") as archive:
        for info, data in entries:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


HOSTILE = {
    "an absolute path": [_file("/tmp/kvgate-absolute.txt")],
    "a .. path": [_file("../escape.txt")],
    "a .. inside a path": [_file("run/../../escape.txt")],
    "a symlink to an absolute path": [_link("run/link", "/etc/passwd")],
    "a symlink leaving the folder": [_link("run/link", "../../outside")],
    "a hard link leaving the folder": [_link("run/hard", "../outside.txt", stdlib_tarfile.LNKTYPE)],
    "a path through a symlink leaving the folder": [_link("run/up", ".."), _file("run/up/../escape.txt")],
    "a device": [_device("run/null")],
}


@pytest.mark.parametrize("module", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_an_archive_that_would_write_outside_its_folder_is_refused(tmp_path, module, case):
    archive = write_archive(tmp_path / "hostile.tar.xz", HOSTILE[case])
    (tmp_path / "outside.txt").write_text("outside")
    destination = tmp_path / "box" / "into"
    destination.mkdir(parents=True)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not p.is_relative_to(destination))
    with pytest.raises(module.FilterError):
        archives.extract(archive, destination, module=module)
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not p.is_relative_to(destination))
    assert after == before
    assert (tmp_path / "outside.txt").read_text() == "outside"
    assert not Path("/tmp/kvgate-absolute.txt").exists()


@pytest.mark.parametrize("module", IMPLEMENTATIONS)
def test_files_folders_and_links_inside_the_folder_unpack(tmp_path, module):
    archive = write_archive(tmp_path / "run.tar.xz", [
        _file("run/cell/status.json", b"{}"), _link("run/latest", "cell"), _link("run/same", "run/cell/status.json",
                                                                                  stdlib_tarfile.LNKTYPE)])
    archives.extract(archive, tmp_path / "out", module=module)
    assert (tmp_path / "out" / "run" / "latest" / "status.json").read_bytes() == b"{}"
    assert (tmp_path / "out" / "run" / "same").read_bytes() == b"{}"
    archives.extract(archive, tmp_path / "one", members=["run/cell/status.json"], module=module)
    assert [p.name for p in (tmp_path / "one").rglob("*") if p.is_file()] == ["status.json"]


def test_this_python_unpacks_with_a_data_filter():
    """Debian 12's python3 (3.11.2) has none in its standard library: the backported tarfile is used there."""
    if sys.version_info >= (3, 11, 4):
        assert archives.tarfile is stdlib_tarfile
    else:
        assert archives.tarfile.__name__ == "backports.tarfile"
    assert hasattr(archives.tarfile, "data_filter")
