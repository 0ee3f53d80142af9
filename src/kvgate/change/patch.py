"""Unified diffs against vLLM's sources: read them, sort their paths, apply them exactly. Pure (text in, text out).

kvgate applies a change to the installed release's Python sources (kvgate.change.overlay), so it must
know which paths of a vLLM change reach the installed package:

    package     vllm/** except compiled sources: applied to the release's copy
    build       what needs a build: csrc/**, cmake/**, CMakeLists.txt, setup.py, pyproject.toml,
                requirements/**, and any *.cu/*.cuh/*.cpp/*.c/*.h/*.hpp/*.so: refused, never silently
                run with the release's kernels
    elsewhere   tests/, docs/, benchmarks/, CI files, ...: not part of the installed package, not applied

The applier is strict, like `patch --fuzz=0`: every hunk's context and removed lines must be found as they
are (a hunk may move, to the nearest place after the previous hunk); a problem names the patch file, the
file and the hunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from kvgate import PATH_CONTROL_CHARACTERS, InputError

PACKAGE_ROOT = "vllm"
COMPILED_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".so", ".pyd", ".cmake")
BUILD_FILES = ("CMakeLists.txt", "setup.py", "pyproject.toml", "MANIFEST.in", "use_existing_torch.py")
BUILD_FOLDERS = ("csrc", "cmake", "requirements")

# At most 9 digits a number: no file of vLLM comes near a billion lines, and int() of thousands of digits raises
_HUNK = re.compile(r"^@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@")
_OCTAL = re.compile(rb"\\([0-3][0-7]{2})")  # a byte: git writes \000 to \377
_MAIL_START = re.compile(r"^From [0-9a-f]{40} ")
_PLAIN_BINARY = re.compile(r"^(?:Binary files|Files) (.+) and (.+) differ$")


def classify(path: str) -> str:
    """package | build | elsewhere, for a path relative to the vLLM repository root."""
    parts = PurePosixPath(path).parts
    if not parts:
        return "elsewhere"
    if path.endswith(COMPILED_SUFFIXES) or parts[0] in BUILD_FOLDERS or (len(parts) == 1 and parts[0] in BUILD_FILES):
        return "build"
    if parts[0] == PACKAGE_ROOT:
        return "package"
    return "elsewhere"


@dataclass(frozen=True, kw_only=True, slots=True)
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[tuple[str, str], ...]  # (" " | "-" | "+", text without its newline)
    old_ends_without_newline: bool
    new_ends_without_newline: bool
    patch_line: int  # where the hunk header stands in the patch (1-based)


@dataclass(frozen=True, kw_only=True, slots=True)
class FilePatch:
    old_path: str | None  # None: a new file
    new_path: str | None  # None: a deleted file
    hunks: tuple[Hunk, ...] = ()
    binary: bool = False
    patch_line: int = 0  # the first line of this file's section
    copy: bool = False  # old_path -> new_path is a copy (`copy from`/`copy to`): the old path stays
    part: int = 0  # which mail of a `git format-patch` series (0 for a plain diff): each applies to the one before's result

    @property
    def path(self) -> str:
        """The path the change leaves (the old one for a deletion)."""
        return self.new_path or self.old_path or ""

    @property
    def paths(self) -> tuple[str, ...]:
        """Both sides (a rename touches two paths), without repeats."""
        return tuple(dict.fromkeys(p for p in (self.old_path, self.new_path) if p))


@dataclass(kw_only=True)
class _Section:
    start: int
    part: int = 0
    old_path: str | None = None
    new_path: str | None = None
    saw_old: bool = False
    saw_new: bool = False
    rename_from: str | None = None
    rename_to: str | None = None
    copied: bool = False
    new_file: bool = False
    deleted_file: bool = False
    binary: bool = False
    hunks: list[Hunk] = field(default_factory=list)


def parse_patch(text: str, source: str) -> list[FilePatch]:
    """The file sections of a unified diff (plain `diff -u` or `git diff`, renames and copies included)."""
    lines = text.removeprefix("\ufeff").split("\n")  # an editor's byte order mark hid the first file's header
    if lines and lines[-1] == "":
        lines.pop()
    sections: list[_Section] = []
    current: _Section | None = None
    in_message = False  # inside a `git format-patch` mail's header and message: free text, up to its "---" line
    part = 0
    i = 0
    while i < len(lines):
        line = lines[i] if lines[i].startswith((" ", "+", "-")) else lines[i].rstrip("\r")
        if _MAIL_START.match(line):
            current, in_message, part = None, True, part + 1
        if in_message:
            in_message = line != "---" and not line.startswith("diff ")
            if in_message or line == "---":
                i += 1
                continue
        if line.startswith("Only in ") and ": " in line:
            raise InputError(source, f"{line[:120]!r}: `diff -r` without -N leaves out a file that only one side has",
                             f"line {i + 1}", "Make it with `diff -ruN` or `git diff`")
        elif (current is None or current.saw_old) and _PLAIN_BINARY.match(line):
            match = _PLAIN_BINARY.match(line)
            current = _Section(start=i + 1, part=part, binary=True, saw_old=True, saw_new=True)
            sections.append(current)
            current.old_path = _header_path(match[1], source, i + 1)
            current.new_path = _header_path(match[2], source, i + 1)
        elif line.startswith("diff --git "):
            current = _Section(start=i + 1, part=part)
            sections.append(current)
            old, new = _git_header_paths(line[len("diff --git "):], source, i + 1)
            current.old_path, current.new_path = old, new
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            if current is None or current.saw_old or current.hunks:
                current = _Section(start=i + 1, part=part)
                sections.append(current)
            current.old_path = _header_path(line[4:], source, i + 1)
            current.new_path = _header_path(lines[i + 1][4:], source, i + 2)
            current.saw_old = current.saw_new = True
            i += 2
            continue
        elif current is not None and line.startswith("@@"):
            hunk, i = _read_hunk(lines, i, source)
            current.hunks.append(hunk)
            continue
        elif current is None and _HUNK.match(line):
            raise InputError(source, "a hunk before any file header ('--- a/FILE' / '+++ b/FILE')", f"line {i + 1}",
                             "Was the header cut or edited by hand?")
        elif current is not None and (line.startswith("+++") or (line.startswith("---") and line.strip("-"))):
            # a header whose other half is damaged: its hunks would be read as the previous file's
            raise InputError(source, f"a file header {line[:80]!r} without its '{'---' if line[0] == '+' else '+++'}' "
                                     "line", f"line {i + 1}", "Was the header cut or edited by hand?")
        elif current is not None and current.hunks and line[:1] in ("+", "-") and line not in ("-- ", "--"):
            # a line the hunk's header does not count (a line added by hand, the counts not): applied, it was dropped
            hunk = current.hunks[-1]
            raise InputError(source, f"{line[:60]!r} follows a hunk whose header counts {hunk.old_count} old and "
                                     f"{hunk.new_count} new lines (line {hunk.patch_line})", f"line {i + 1}",
                             "Was the patch edited by hand? Make it again with `git diff`, or fix the hunk's counts")
        elif current is not None and not current.saw_old:
            if line.startswith("rename from ") or line.startswith("copy from "):
                current.rename_from = _unquote(line.split(" from ", 1)[1], source, i + 1)
                current.copied = line.startswith("copy ")
            elif line.startswith("rename to ") or line.startswith("copy to "):
                current.rename_to = _unquote(line.split(" to ", 1)[1], source, i + 1)
            elif line.startswith("new file mode"):
                current.new_file = True
            elif line.startswith("deleted file mode"):
                current.deleted_file = True
            elif line.startswith("Binary files ") or line.startswith("GIT binary patch"):
                current.binary = True
        i += 1
    if not sections:
        raise InputError(source, "not a unified diff (no '--- a/FILE' / '+++ b/FILE' or 'diff --git' header)",
                         hint="Make it with `git diff` or `diff -u`")
    return [_finish(s, source) for s in sections]


def _finish(section: _Section, source: str) -> FilePatch:
    old, new = section.old_path, section.new_path
    for which, named, header in (("'---'", section.rename_from, old), ("'+++'", section.rename_to, new)):
        if section.saw_old and named and header is not None and header != named:
            # the hunks were read as the rename's (a document) while they change the header's file (a vLLM source)
            verb = "copy" if section.copied else "rename"
            raise InputError(source, f"the {which} header names {header!r}, its {verb} line {named!r}",
                             f"line {section.start}", "Was the header edited by hand? Make the patch again with "
                                                      "`git diff`")
    if section.rename_from or section.rename_to:
        old, new = section.rename_from or old, section.rename_to or new
    if section.new_file and not section.saw_old:
        old = None
    if section.deleted_file and not section.saw_new:
        new = None
    if old is None and new is None:
        raise InputError(source, "a file section names no file", f"line {section.start}")
    for path in (old, new):
        if path is not None:
            _check_path(path, source, section.start)
    return FilePatch(old_path=old, new_path=new, hunks=tuple(section.hunks), binary=section.binary,
                     patch_line=section.start, copy=section.copied, part=section.part)


def _read_hunk(lines: list[str], i: int, source: str) -> tuple[Hunk, int]:
    header = lines[i].rstrip("\r")
    match = _HUNK.match(header)
    if not match:
        raise InputError(source, f"malformed hunk header {header[:60]!r}", f"line {i + 1}",
                         "Expected '@@ -START,COUNT +START,COUNT @@'")
    old_start, old_count = int(match[1]), int(match[2]) if match[2] is not None else 1
    new_start, new_count = int(match[3]), int(match[4]) if match[4] is not None else 1
    body: list[tuple[str, str]] = []
    old_seen = new_seen = 0
    old_no_newline = new_no_newline = False
    j = i + 1
    while j < len(lines):
        line = lines[j]
        if line.startswith("\\"):  # "\ No newline at end of file": about the line before it
            last = body[-1][0] if body else " "
            old_no_newline |= last in " -"
            new_no_newline |= last in " +"
            j += 1
            continue
        if old_seen >= old_count and new_seen >= new_count:
            break
        op, content = (line[:1] or " "), line[1:]
        if op not in " -+":
            raise InputError(source, f"hunk ends early: {old_seen} of {old_count} old and {new_seen} of {new_count} "
                                     f"new lines", f"line {j + 1}", "Was the patch cut or edited by hand?")
        body.append((op, content))
        old_seen += op in " -"
        new_seen += op in " +"
        j += 1
    if old_seen != old_count or new_seen != new_count:
        raise InputError(source, f"hunk ends early: {old_seen} of {old_count} old and {new_seen} of {new_count} new "
                                 f"lines", f"line {i + 1}", "Was the patch cut or edited by hand?")
    return Hunk(old_start=old_start, old_count=old_count, new_start=new_start, new_count=new_count,
                lines=tuple(body), old_ends_without_newline=old_no_newline,
                new_ends_without_newline=new_no_newline, patch_line=i + 1), j


def _git_header_paths(rest: str, source: str, line: int) -> tuple[str | None, str | None]:
    if rest.startswith('"'):
        first, _, tail = _split_quoted(rest, source, line)
    elif len(rest) % 2 and rest[len(rest) // 2] == " " and rest[:len(rest) // 2][2:] == rest[len(rest) // 2 + 1:][2:]:
        first, tail = rest[:len(rest) // 2], rest[len(rest) // 2 + 1:]  # "a/x b/y.py b/x b/y.py": one name twice
    else:
        first, _, tail = rest.partition(" b/")
        tail = "b/" + tail if tail else ""
    second = tail.strip()
    return _strip_prefix(_unquote(first, source, line)), _strip_prefix(_unquote(second, source, line))


def _split_quoted(text: str, source: str, line: int) -> tuple[str, str, str]:
    end = 1
    while end < len(text):
        if text[end] == "\\":
            end += 2
            continue
        if text[end] == '"':
            return text[:end + 1], " ", text[end + 1:].strip()
        end += 1
    raise InputError(source, "unterminated quoted path", f"line {line}")


def _header_path(text: str, source: str, line: int) -> str | None:
    path = text.split("\t", 1)[0].rstrip("\r")
    if path == "/dev/null":
        return None
    return _strip_prefix(_unquote(path, source, line))


def _strip_prefix(path: str | None) -> str | None:
    if path is None or path == "/dev/null":
        return None
    for prefix in ("a/", "b/"):
        if path.startswith(prefix):
            return path[len(prefix):]
    return path


def _unquote(path: str, source: str, line: int) -> str:
    """git quotes paths with unusual bytes: "a/\\303\\251t\\303\\251.py" -> a/été.py."""
    path = path.strip()
    if not (len(path) >= 2 and path.startswith('"') and path.endswith('"')):
        return path
    body = path[1:-1].encode("utf-8", "surrogateescape")  # octal escapes, and any character git left as it is
    body = _OCTAL.sub(lambda m: bytes([int(m[1], 8)]), body)
    simple = {b"\\n": b"\n", b"\\t": b"\t", b'\\"': b'"', b"\\\\": b"\\"}
    for escaped, plain in simple.items():
        body = body.replace(escaped, plain)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(source, "a quoted path is not UTF-8", f"line {line}") from None


def _check_path(path: str, source: str, line: int) -> None:
    pure = PurePosixPath(path)
    if (pure.is_absolute() or ".." in pure.parts or "\\" in path or not path.strip()
            or PATH_CONTROL_CHARACTERS.search(path)):
        raise InputError(source, f"unsafe path {path!r}", f"line {line}",
                         "A vLLM patch names files relative to the repository root (a/vllm/...)")


def apply_file_patch(original: str | None, patch: FilePatch, source: str) -> str | None:
    """The new text of one file (None: deleted). `original` is the release's text (None: no such file)."""
    name = patch.path
    if patch.binary:
        raise InputError(source, f"binary change to {name}", f"line {patch.patch_line}",
                         "kvgate applies text changes only; pass a wheel: for binary ones")
    if patch.old_path is None:
        if original is not None:
            raise InputError(source, f"creates {name}, which the release already has", f"line {patch.patch_line}",
                             "Make the patch against the release's sources")
        original = ""
    elif original is None:
        raise InputError(source, f"changes {patch.old_path}, which the release does not have",
                         f"line {patch.patch_line}", "Make the patch against the release's sources")
    if patch.new_path is None:
        _apply_hunks(original, patch, source)  # the removal must match what is there
        return None
    return _apply_hunks(original, patch, source)


def _apply_hunks(original: str, patch: FilePatch, source: str) -> str:
    lines = original.split("\n") if original else []  # an empty file has no line, not one empty line
    if original.endswith("\n"):
        lines.pop()
    ends_with_newline = original.endswith("\n") or not original  # lines added to it end theirs, unless a hunk says
    out: list[str] = []
    cursor = 0  # index into `lines` of the first line not yet copied
    new_ends_with_newline = ends_with_newline
    for number, hunk in enumerate(patch.hunks, start=1):
        old = [text for op, text in hunk.lines if op in " -"]
        new = [text for op, text in hunk.lines if op in " +"]
        wanted = max(hunk.old_start - 1, 0) if hunk.old_count else hunk.old_start
        at = _find(lines, old, wanted, cursor)
        if at is None:
            where = f"line {hunk.patch_line}"
            raise InputError(source, f"hunk {number} of {patch.old_path or patch.path} does not apply: its "
                                     f"{len(old)} context/removed lines are not at line {hunk.old_start} of the "
                                     f"release's file (or anywhere after hunk {number - 1})" if number > 1 else
                             f"hunk {number} of {patch.old_path or patch.path} does not apply: its {len(old)} "
                             f"context/removed lines are not at line {hunk.old_start} of the release's file",
                             where, "Make the patch against the installed release's sources (kvgate applies "
                                    "without fuzz)")
        out.extend(lines[cursor:at])
        out.extend(new)
        cursor = at + len(old)
        if cursor >= len(lines) and (hunk.old_ends_without_newline or hunk.new_ends_without_newline):
            new_ends_with_newline = not hunk.new_ends_without_newline
    out.extend(lines[cursor:])
    text = "\n".join(out)
    if out and new_ends_with_newline:
        text += "\n"
    return text


def _find(lines: list[str], block: list[str], wanted: int, cursor: int) -> int | None:
    """Where `block` stands in `lines` at or after `cursor`, nearest to `wanted` first."""
    if not block:
        return min(max(wanted, cursor), len(lines))
    limit = len(lines) - len(block)
    if limit < cursor:
        return None
    wanted = min(max(wanted, cursor), limit)  # a start past the file's end searched from its end, not counted down to
    first = block[0]
    for distance in range(0, max(limit - wanted, wanted - cursor) + 1):
        for at in ((wanted - distance, wanted + distance) if distance else (wanted,)):
            if cursor <= at <= limit and lines[at] == first and lines[at:at + len(block)] == block:
                return at
    return None


def changed_paths(patches: list[FilePatch]) -> list[str]:
    """Every path a patch touches, both sides of renames, in order, without repeats."""
    return list(dict.fromkeys(p for patch in patches for p in patch.paths))
