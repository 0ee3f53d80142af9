"""The repository holds what it cites: no tracked file points outside it, and every docs/ page it cites exists.

A fact kvgate relies on lives in docs/ (docs/facts/ for what was read from or measured on vLLM, FlashInfer and the
machines), in kvgate's own words with its upstream source; a reader of a checkout can open everything it cites.
Checked over the files git tracks or would track in the folders and files that cite (git ls-files, new files
included), so ignored build outputs and virtual environments do not count.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CITING = ("src", "matrix", "docs", "ci", "benchmarks", "noxfile.py", "README.md")

# Paths that leave the checkout: the development machines' shared folder (../shared/..., any depth) and their
# absolute /work/ paths.
OUTSIDE_THE_REPOSITORY = re.compile(r"(?:\.\./)+shared/|(?<![\w.-])/work/")
# A docs page named from the repository root, with its heading anchor if one is given: docs/facts/h200.md#anchor.
# A path that is part of a longer one (a URL's .../docs/x.md, vLLM's own docs/...) does not count.
DOCS_CITATION = re.compile(r"(?<![\w./-])(docs/[\w./-]+?\.md)(?:#([\w-]+))?")
# A Markdown link to another Markdown file or to a heading: [text](page.md#anchor), [text](#anchor).
MARKDOWN_LINK = re.compile(r"\]\((?!https?://)([^)\s#]*\.md)?(?:#([^)\s]+))?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


@dataclass(frozen=True)
class BadCitation:
    where: str  # "path:line"
    cited: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.cited} ({self.why})"


def tracked_text_files(root: Path, pathspecs: tuple[str, ...]) -> list[Path]:
    """The text files (no NUL byte) under `pathspecs` that git tracks or would track (not ignored)."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                             "--", *pathspecs],
                            capture_output=True, check=True).stdout.decode().split("\0")
    files = [root / name for name in listed if name and (root / name).is_file()]
    return [path for path in files if b"\0" not in path.read_bytes()]


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: link text kept, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page (outside code fences), repeated headings numbered as GitHub does."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (heading := HEADING.match(line)):
            anchor = heading_anchor(heading.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def check_target(root: Path, where: str, cited: str, page: Path, anchor: str | None) -> list[BadCitation]:
    if not page.is_file():
        return [BadCitation(where, cited, f"{page.relative_to(root) if page.is_relative_to(root) else page} "
                                          "does not exist")]
    if anchor and anchor not in anchors(page):
        return [BadCitation(where, cited, f"no heading of {page.name} has the anchor #{anchor}")]
    return []


def bad_citations(root: Path, files: list[Path]) -> list[BadCitation]:
    """Every citation in `files` of a path outside the repository or of a docs page or heading that is missing."""
    bad: list[BadCitation] = []
    for path in files:
        name = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            where = f"{name}:{number}"
            bad += [BadCitation(where, match.group(0), "outside the repository: write the fact into docs/facts/")
                    for match in OUTSIDE_THE_REPOSITORY.finditer(line)]
            for match in DOCS_CITATION.finditer(line):
                if path.suffix == ".md" and line[:match.start()].endswith("]("):
                    continue  # a Markdown link: resolved from its page below
                bad += check_target(root, where, match.group(0), root / match.group(1), match.group(2))
            if path.suffix == ".md":
                for match in MARKDOWN_LINK.finditer(line):
                    page = (path.parent / match.group(1)).resolve() if match.group(1) else path
                    bad += check_target(root, where, match.group(0), page, match.group(2))
    return bad


def test_no_tracked_file_cites_a_path_outside_the_repository_or_a_missing_docs_page():
    files = tracked_text_files(ROOT, CITING)
    assert len(files) > 100, f"git ls-files listed only {len(files)} files under {CITING}"
    assert [str(citation) for citation in bad_citations(ROOT, files)] == []


def test_the_facts_cite_their_upstream_sources():
    for page in sorted((ROOT / "docs" / "facts").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        assert re.search(r"<https://[^>]+>", text), f"{page.name} names no upstream source"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "facts").mkdir(parents=True)
    (tmp_path / "docs" / "facts" / "cpu.md").write_text(
        "# CPU facts\n\n```\n# not a heading\n```\n\n## FP8 needs AVX-512\n\n## Timings\n\n## Timings\n",
        encoding="utf-8")
    return tmp_path


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_path_outside_the_repository_is_named_with_its_line(checkout):
    source = write(checkout, "src/a.py", '"""Ok."""\n# measured (../shared/facts/cpu.md)\nX = "/work/main/x"\n')
    assert [str(citation) for citation in bad_citations(checkout, [source])] == [
        "src/a.py:2: ../shared/ (outside the repository: write the fact into docs/facts/)",
        "src/a.py:3: /work/ (outside the repository: write the fact into docs/facts/)",
    ]


def test_a_missing_docs_page_or_heading_is_named_and_an_existing_one_passes(checkout):
    toml = write(checkout, "matrix/policy.toml",
                 "# docs/facts/cpu.md#fp8-needs-avx-512 and docs/facts/cpu.md#timings-1, docs/facts/cpu.md.\n"
                 "# docs/facts/gpu.md and docs/facts/cpu.md#timings-2 and docs/facts/cpu.md#not-a-heading\n"
                 "# https://github.com/vllm-project/vllm/blob/main/docs/usage.md is upstream's, not ours\n")
    assert [str(citation) for citation in bad_citations(checkout, [toml])] == [
        "matrix/policy.toml:2: docs/facts/gpu.md (docs/facts/gpu.md does not exist)",
        "matrix/policy.toml:2: docs/facts/cpu.md#timings-2 (no heading of cpu.md has the anchor #timings-2)",
        "matrix/policy.toml:2: docs/facts/cpu.md#not-a-heading (no heading of cpu.md has the anchor #not-a-heading)",
    ]


def test_markdown_links_are_resolved_from_the_page_that_holds_them(checkout):
    page = write(checkout, "docs/facts/gpu.md",
                 "# GPU\n\nSee [the CPU](cpu.md#fp8-needs-avx-512), [above](#gpu), [gone](../missing.md) and "
                 "[upstream](https://example.org/x.md).\n")
    assert [str(citation) for citation in bad_citations(checkout, [page])] == [
        "docs/facts/gpu.md:3: ](../missing.md) (docs/missing.md does not exist)",
    ]


def test_anchors_follow_github():
    assert heading_anchor("CPU_MLA is auto only; FP8 crashes at the first decode") == \
        "cpu_mla-is-auto-only-fp8-crashes-at-the-first-decode"
    assert heading_anchor("FlashInfer's MLA decode on SM90: fa2 and fa3 only") == \
        "flashinfers-mla-decode-on-sm90-fa2-and-fa3-only"
    assert heading_anchor("The gate ([results](docs/results-folder.md))") == "the-gate-results"
