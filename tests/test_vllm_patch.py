"""Unified diffs against vLLM's sources: parsed and applied exactly as git would, refused with the place named.

The patches here are made by the real `git diff` in a repository the test builds, so the parser meets git's
own output (renames, new and deleted files, no newline at the end, quoted non-ASCII names).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvgate import InputError
from kvgate.change.patch import apply_file_patch, changed_paths, classify, parse_patch
from kvgate.change.spec import parse_spec


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "vllm-repo"
    (root / "vllm" / "a").mkdir(parents=True)
    (root / "vllm" / "a" / "x.py").write_text("".join(f"line{i}\n" for i in range(1, 31)))
    (root / "vllm" / "old_name.py").write_text("".join(f"keep {i}\n" for i in range(20)))
    (root / "vllm" / "gone.py").write_text("bye\n")
    (root / "vllm" / "no_newline.py").write_text("last line")
    (root / "vllm" / "été.py").write_text("accent\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    return root


def change(repo: Path) -> None:
    text = (repo / "vllm" / "a" / "x.py").read_text().replace("line2\n", "LINE2\n").replace("line28\n", "LINE28\n")
    (repo / "vllm" / "a" / "x.py").write_text(text)
    git(repo, "mv", "vllm/old_name.py", "vllm/new_name.py")
    (repo / "vllm" / "new_name.py").write_text((repo / "vllm" / "new_name.py").read_text().replace("keep 3", "KEEP 3"))
    git(repo, "rm", "-q", "vllm/gone.py")
    (repo / "vllm" / "fresh.py").write_text("new file\n")
    (repo / "vllm" / "no_newline.py").write_text("last line\nand one more")
    (repo / "vllm" / "été.py").write_text("accent changed\n")
    git(repo, "add", "-A")


def test_git_diff_applies_to_the_base_exactly_as_git_wrote_it(repo):
    change(repo)
    patches = parse_patch(git(repo, "diff", "--cached", "-M"), "change.patch")
    assert changed_paths(patches) == ["vllm/a/x.py", "vllm/fresh.py", "vllm/gone.py", "vllm/old_name.py",
                                      "vllm/new_name.py", "vllm/no_newline.py", "vllm/été.py"]
    for patch in patches:
        before = git(repo, "show", f"HEAD:{patch.old_path}") if patch.old_path else None
        after = apply_file_patch(before, patch, "change.patch")
        expected = (repo / patch.new_path).read_text() if patch.new_path else None
        assert after == expected, patch.path


def test_a_hunk_moved_by_lines_added_above_it_still_applies(repo):
    change(repo)
    patch = next(p for p in parse_patch(git(repo, "diff", "--cached", "vllm/a/x.py"), "p") if p.path == "vllm/a/x.py")
    shifted = "header 1\nheader 2\n" + git(repo, "show", "HEAD:vllm/a/x.py")
    assert apply_file_patch(shifted, patch, "p") == "header 1\nheader 2\n" + (repo / "vllm/a/x.py").read_text()


def test_a_hunk_that_does_not_match_names_the_file_the_hunk_and_the_patch_line(repo):
    change(repo)
    text = git(repo, "diff", "--cached", "vllm/a/x.py")
    patch = parse_patch(text, "fix.patch")[0]
    release = git(repo, "show", "HEAD:vllm/a/x.py").replace("line27\n", "line 27 edited\n")
    with pytest.raises(InputError) as caught:
        apply_file_patch(release, patch, "fix.patch")
    header_line = text.splitlines().index(next(line for line in text.splitlines() if line.startswith("@@ -25"))) + 1
    assert str(caught.value) == (
        f"fix.patch: hunk 2 of vllm/a/x.py does not apply: its 6 context/removed lines are not at line 25 of the "
        f"release's file (or anywhere after hunk 1) in line {header_line}. Make the patch against the installed "
        f"release's sources (kvgate applies without fuzz)")


def test_paths_are_sorted_into_package_build_and_elsewhere():
    assert [classify(p) for p in ("vllm/v1/attention/backends/cpu_attn.py", "vllm/_C.abi3.so", "csrc/cpu/attn.cpp",
                                  "CMakeLists.txt", "cmake/utils.cmake", "setup.py", "requirements/cuda.txt",
                                  "vllm/kernels/x.cu", "tests/test_x.py", "docs/a.md", ".buildkite/x.yaml")] == [
        "package", "build", "build", "build", "build", "build", "build", "build", "elsewhere", "elsewhere",
        "elsewhere"]


@pytest.mark.parametrize(("text", "message"), [
    ("hello\n", "p: not a unified diff (no '--- a/FILE' / '+++ b/FILE' or 'diff --git' header). Make it with "
                "`git diff` or `diff -u`"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n", "p: hunk ends early: 2 of 3 old and 1 of 3 new "
                                                                  "lines in line 3. Was the patch cut or edited by hand?"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ bogus @@\n", "p: malformed hunk header '@@ bogus @@' in line 3. Expected "
                                                      "'@@ -START,COUNT +START,COUNT @@'"),
    ("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "p: unsafe path '../etc/passwd' in line 1. "
                                                                      "A vLLM patch names files relative to the "
                                                                      "repository root (a/vllm/...)"),
    ("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "p: unsafe path '/etc/passwd' in line 1. A vLLM "
                                                              "patch names files relative to the repository root "
                                                              "(a/vllm/...)"),
    # git quotes a path with a line break; unquoted, it printed over two lines in --explain's table
    ('--- "a/vllm/a\\nb.py"\n+++ "b/vllm/a\\nb.py"\n@@ -1 +1 @@\n-a\n+b\n', "p: unsafe path 'vllm/a\\nb.py' in line 1. A "
                                                                          "vLLM patch names files relative to the "
                                                                          "repository root (a/vllm/...)"),
    # a quoted path's octal escape past a byte (\777 is 511): bytes() refused it, a ValueError traceback before
    ('--- "a/vllm/\\777.py"\n+++ "b/vllm/\\777.py"\n@@ -1 +1 @@\n-a\n+b\n',
     "p: unsafe path 'vllm/\\\\777.py' in line 1. A vLLM patch names files relative to the repository root (a/vllm/...)"),
    # a number of thousands of digits: int() refuses it (ValueError), a traceback before
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -" + "9" * 5000 + ",1 +1 @@\n-a\n+b\n",
     "p: malformed hunk header '@@ -" + "9" * 56 + "' in line 3. Expected '@@ -START,COUNT +START,COUNT @@'"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1," + "9" * 5000 + " +1 @@\n-a\n+b\n",
     "p: malformed hunk header '@@ -1," + "9" * 54 + "' in line 3. Expected '@@ -START,COUNT +START,COUNT @@'"),
])
def test_a_malformed_or_hostile_patch_is_one_error(text, message):
    with pytest.raises(InputError) as caught:
        parse_patch(text, "p")
    assert str(caught.value) == message


def test_a_binary_change_is_refused():
    text = ("diff --git a/vllm/_C.abi3.so b/vllm/_C.abi3.so\nindex 1..2 100755\n"
            "Binary files a/vllm/_C.abi3.so and b/vllm/_C.abi3.so differ\n")
    patch = parse_patch(text, "p")[0]
    with pytest.raises(InputError) as caught:
        apply_file_patch("x", patch, "p")
    assert str(caught.value) == ("p: binary change to vllm/_C.abi3.so in line 1. kvgate applies text changes only; "
                                 "pass a wheel: for binary ones")


@pytest.mark.parametrize(("text", "kind", "path", "version", "base"), [
    ("release", "release", None, None, None),
    ("release:0.32.0", "release", None, "0.32.0", None),
    ("wheel:dist/vllm-1-py3-none-any.whl", "wheel", "dist/vllm-1-py3-none-any.whl", None, None),
    ("source:../vllm", "source", "../vllm", None, None),
    ("source:../vllm@v0.32.0", "source", "../vllm", None, "v0.32.0"),
    ("patch:canaries/x.patch", "patch", "canaries/x.patch", None, None),
])
def test_specs(text, kind, path, version, base):
    spec = parse_spec(text)
    assert (spec.kind, str(spec.path) if spec.path else None, spec.version, spec.base_rev) == (kind, path, version, base)


@pytest.mark.parametrize(("text", "message"), [
    ("nightly", "--vllm: unknown vLLM spec 'nightly'. Write release[:VERSION], wheel:PATH, source:PATH[@BASE] or "
                "patch:PATH"),
    ("patch:", "--vllm: 'patch:' names no path. Write patch:PATH"),
    ("release:", "--vllm: 'release:' names no version. Write release or release:VERSION, e.g. release:0.32.0"),
    ("source:@v1", "--vllm: 'source:@v1': expected source:PATH@BASE with both parts. e.g. source:../vllm@v0.32.0, "
                   "or source:../vllm for the release's tag"),
    ("patch:~no-such-user-here/fix.diff", "--vllm: 'patch:~no-such-user-here/fix.diff': cannot expand "
                                          "'~no-such-user-here' (no such user or home directory). Write patch:PATH with "
                                          "the folder spelled out"),  # was expanduser's RuntimeError
])
def test_bad_specs(text, message):
    with pytest.raises(InputError) as caught:
        parse_spec(text)
    assert str(caught.value) == message


def test_a_hunk_that_claims_a_line_far_past_the_end_is_found_at_once():
    """`@@ -99999999` counted down one line at a time to the file's end: minutes for a file of 30 lines."""
    import time

    patch = parse_patch("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -999999999,2 +999999999,2 @@\n line29\n-line30\n+LINE30\n",
                        "p")[0]
    started = time.monotonic()
    text = apply_file_patch("".join(f"line{i}\n" for i in range(1, 31)), patch, "p")
    assert text.endswith("line29\nLINE30\n") and time.monotonic() - started < 1
    with pytest.raises(InputError, match=r"hunk 1 of vllm/x\.py does not apply"):
        apply_file_patch("a\n", patch, "p")


CUSTOM_OPS = "--- a/vllm/_custom_ops.py\n+++ b/vllm/_custom_ops.py\n@@ -1 +1 @@\n-a\n+b\n"
DOCS = "--- a/docs/x.md\n+++ b/docs/x.md\n@@ -1 +1 @@\n-a\n+b\n"


@pytest.mark.parametrize(("text", "message"), [
    # the first file's header damaged: its hunk was dropped, or read as the previous file's, and the file planned no cell
    (CUSTOM_OPS.replace("--- a/", "-- a/") + DOCS, "p: a hunk before any file header ('--- a/FILE' / '+++ b/FILE') in "
                                                   "line 3. Was the header cut or edited by hand?"),
    (DOCS + CUSTOM_OPS.replace("--- a/", "---a/"), "p: a file header '---a/vllm/_custom_ops.py' without its '+++' line "
                                                   "in line 6. Was the header cut or edited by hand?"),
    (DOCS + CUSTOM_OPS.replace("+++ b/", "+++b/"), "p: a file header '--- a/vllm/_custom_ops.py' without its '+++' line "
                                                   "in line 6. Was the header cut or edited by hand?"),
    # `diff -r` without -N: a deleted file is a line of prose, not a section
    (DOCS + "Only in a/vllm: _custom_ops.py\n", "p: 'Only in a/vllm: _custom_ops.py': `diff -r` without -N leaves out a "
                                                "file that only one side has in line 6. Make it with `diff -ruN` or "
                                                "`git diff`"),
])
def test_a_file_the_parser_would_lose_is_one_error(text, message):
    with pytest.raises(InputError) as caught:
        parse_patch(text, "p")
    assert str(caught.value) == message


@pytest.mark.parametrize("extra", ["+injected", "-line3"])
def test_a_line_past_its_hunks_counts_is_one_error_not_dropped(repo, extra):
    """A line added to a hunk by hand, its header's counts not: applied, it was left out, and the run tested a change
    that was not the patch (git apply refuses it)."""
    text = "--- a/vllm/a/x.py\n+++ b/vllm/a/x.py\n@@ -1,2 +1,2 @@\n line1\n-line2\n+LINE2\n" + extra + "\n"
    with pytest.raises(InputError) as caught:
        parse_patch(text, "p")
    assert str(caught.value) == (f"p: {extra!r} follows a hunk whose header counts 2 old and 2 new lines (line 3) in "
                                 "line 7. Was the patch edited by hand? Make it again with `git diff`, or fix the hunk's "
                                 "counts")


def test_a_format_patch_signature_after_the_last_hunk_is_no_hunk_line(repo):
    change(repo)
    git(repo, "commit", "-qm", "change")
    series = git(repo, "format-patch", "--stdout", "HEAD~1")
    assert "\n-- \n" in series  # git's signature, then its version
    assert len(parse_patch(series, "p")) == 6


def test_a_rename_whose_headers_name_another_file_is_one_error():
    """The hunks of vllm/x.py were read as the rename's, of docs/ (inert): applied nowhere, selecting no cell; git apply
    calls it an inconsistent old filename."""
    text = ("diff --git a/docs/x.md b/docs/y.md\nsimilarity index 90%\nrename from docs/x.md\nrename to docs/y.md\n"
            "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+A\n")
    with pytest.raises(InputError) as caught:
        parse_patch(text, "p")
    assert str(caught.value) == ("p: the '---' header names 'vllm/x.py', its rename line 'docs/x.md' in line 1. Was the "
                                 "header edited by hand? Make the patch again with `git diff`")


def test_a_rename_with_changes_keeps_its_paths(repo):
    change(repo)
    renamed = [p for p in parse_patch(git(repo, "diff", "--cached", "-M"), "p") if p.old_path == "vllm/old_name.py"]
    assert [(p.old_path, p.new_path, len(p.hunks)) for p in renamed] == [("vllm/old_name.py", "vllm/new_name.py", 1)]


def test_an_empty_file_has_no_line_to_match_or_to_end(repo):
    """An empty file was read as one empty line: text added without a newline at its end gained one, and a hunk
    removing an empty line applied to a file that has none."""
    (repo / "vllm" / "empty.py").write_text("")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "empty")
    (repo / "vllm" / "empty.py").write_text("x = 1")
    patch = parse_patch(git(repo, "diff"), "p")[0]
    assert apply_file_patch("", patch, "p") == "x = 1"
    removal = parse_patch("--- a/vllm/empty.py\n+++ b/vllm/empty.py\n@@ -1 +0,0 @@\n-\n", "p")[0]
    with pytest.raises(InputError, match=r"hunk 1 of vllm/empty\.py does not apply"):
        apply_file_patch("", removal, "p")


def test_what_plain_diff_and_editors_write_keeps_every_file():
    # a byte order mark before the first header (an editor's UTF-8 with BOM)
    assert changed_paths(parse_patch("\ufeff" + CUSTOM_OPS + DOCS, "p")) == ["vllm/_custom_ops.py", "docs/x.md"]
    # `diff -ru`'s line for a binary file is a file of the change, refused when applied
    binary = parse_patch(DOCS + "Binary files a/vllm/_C.abi3.so and b/vllm/_C.abi3.so differ\n", "p")
    assert changed_paths(binary) == ["docs/x.md", "vllm/_C.abi3.so"] and binary[1].binary
    # git's header of a mode-only change to a path holding " b/": the name twice, not split at the first " b/"
    mode = parse_patch("diff --git a/vllm/x b/y.py b/vllm/x b/y.py\nold mode 100644\nnew mode 100755\n", "p")
    assert changed_paths(mode) == ["vllm/x b/y.py"]
    # a quoted path (git quotes one with a '"') that holds UTF-8 as it is: read, not refused as not UTF-8
    quoted = parse_patch('--- "a/vllm/\u00e9\\"x.py"\n+++ "b/vllm/\u00e9\\"x.py"\n@@ -1 +1 @@\n-a\n+b\n', "p")
    assert changed_paths(quoted) == ['vllm/\u00e9"x.py']


def test_a_format_patch_series_keeps_its_commit_messages_apart(repo):
    (repo / "vllm/a/x.py").write_text((repo / "vllm/a/x.py").read_text().replace("line2\n", "LINE2\n"))
    git(repo, "commit", "-qam", "one\n\n--- not a header\n+++ nor this\n@@ -1 +1 @@ a quoted hunk")
    (repo / "vllm/gone.py").write_text("still here\n")
    git(repo, "commit", "-qam", "two")
    patches = parse_patch(git(repo, "format-patch", "--stdout", "HEAD~2"), "p")
    assert changed_paths(patches) == ["vllm/a/x.py", "vllm/gone.py"]


def test_a_mail_whose_message_has_no_separator_line_still_reads_its_diff():
    mail = ("From 0123456789abcdef0123456789abcdef01234567 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] x\n\n"
            "--- a quoted header\n+++ in the message\n\ndiff --git a/vllm/x.py b/vllm/x.py\n" + CUSTOM_OPS.replace(
                "_custom_ops", "x"))
    assert changed_paths(parse_patch(mail, "p")) == ["vllm/x.py"]
