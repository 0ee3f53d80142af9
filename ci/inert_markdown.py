"""Untrusted Markdown made inert for a GitHub comment, by parsing it, never by pattern-matching its source.

markdown-it-py parses the text as GitHub does (CommonMark with GFM's tables and strikethrough); the comment is
written out again from the parse tree, so what GitHub renders is only what this module wrote:
  - text is escaped (every character Markdown gives a meaning backslash-escaped), so no emphasis, link, image,
    raw HTML or block marker can form from it; in it, every `@` before a name character and every `#`, `GH-`
    before a digit gets a word joiner (no ping, no backlink), and GFM's autolinks (`https://...`, `www....`,
    `mailto:`) lose their link-ness (`https[:]//`, `www[.]`), except addresses in this run's own repository;
  - links keep their text; only a link whose address, with its `..` and `.` segments resolved (percent-encoding
    decoded first), lies in this run's repository on github.com stays a link, to that resolved address;
  - images keep their alt text; code keeps its text in a fence or span longer than any backtick run in it;
  - raw HTML survives only as the few inert tags kvgate's report uses (details, summary, sub, sup, b, i, code, br)
    without attributes; any other tag, comment or declaration becomes text;
  - anything else the parser knows becomes escaped text.
The result is parsed again and checked: a link outside the repository, an image or another HTML tag in it means
this module missed something, and the whole report becomes one code block (inert) instead.
"""

from __future__ import annotations

import html
import importlib.util
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode


def _inert_text():
    """kvgate/report/inert_text.py, loaded by its path (it imports nothing; the comment job has no kvgate installed)."""
    if "kvgate_inert_text" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "kvgate_inert_text", Path(__file__).resolve().parents[1] / "src" / "kvgate" / "report" / "inert_text.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["kvgate_inert_text"] = module
        spec.loader.exec_module(module)
    return sys.modules["kvgate_inert_text"]


_text = _inert_text()
CONTROL, own_address, defang, escape_text, no_pings = (_text.CONTROL, _text.own_address, _text.defang,
                                                       _text.escape_text, _text.no_pings)
_start_of_line = _text.start_of_line
INERT_TAGS = frozenset({"details", "summary", "sub", "sup", "b", "i", "code", "br"})
INERT_TAG = re.compile(r"</?([A-Za-z]+)\s*/?>")


def parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


class _InertHtml(HTMLParser):
    """Raw HTML as inert HTML: the inert tags (without attributes) kept, anything else escaped, text defanged."""

    def __init__(self, repository: str):
        super().__init__(convert_charrefs=True)
        self.repository = repository
        self.out: list[str] = []
        self.foreign = False  # met a tag, comment or declaration that is not one of the inert tags

    def _text(self, text: str) -> None:
        self.out.append(html.escape(defang(text, self.repository), quote=False))

    def _tag(self, tag: str, attrs: list, closing: bool = False) -> None:
        if tag in INERT_TAGS and not attrs:
            self.out.append(f"</{tag}>" if closing else f"<{tag}>")
        else:
            self.foreign = True
            self._text(f"</{tag}>" if closing else (self.get_starttag_text() or f"<{tag}>"))

    def handle_starttag(self, tag, attrs):
        self._tag(tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._tag(tag, attrs)

    def handle_endtag(self, tag):
        self._tag(tag, [], closing=True)

    def handle_data(self, data):
        self._text(data)

    def handle_comment(self, data):
        self.foreign = True
        self._text(f"<!--{data}-->")

    def handle_decl(self, decl):
        self.foreign = True
        self._text(f"<!{decl}>")

    def handle_pi(self, data):
        self.foreign = True
        self._text(f"<?{data}>")

    def unknown_decl(self, data):
        self.foreign = True
        self._text(f"<![{data}]>")


def inert_html(raw: str, repository: str) -> tuple[str, bool]:
    """(the HTML made inert, whether it held anything but the inert tags and text)."""
    parsed = _InertHtml(repository)
    parsed.feed(raw)
    parsed.close()
    if parsed.rawdata:  # an unfinished tag at the end
        parsed.foreign = True
        parsed._text(parsed.rawdata)
    return "".join(parsed.out), parsed.foreign


def _fence(content: str, mark: str = "`", least: int = 3) -> str:
    runs = [len(run) for run in re.findall(f"{re.escape(mark)}+", content)]
    return mark * max(least, max(runs, default=0) + 1)


class _Writer:
    def __init__(self, repository: str):
        self.repository = repository

    # -- inline
    def inline(self, node: SyntaxTreeNode, *, in_table: bool = False, line_start: bool = False) -> str:
        """The inline nodes as Markdown; line_start: they open a line, so text first in it must not open a block.

        Text is escaped a run at a time, never a node at a time: an image (its alt text) or a link that is not kept
        (its text) is text beside the text around it, so `@![octocat](x.png)` is the text `@octocat` (a mention, if
        `@` and `octocat` were escaped apart), and `#[12](https://evil.example)` the text `#12`."""
        out: list[str] = []
        run: list[str] = []
        pieces = self._pieces(node.children)
        for piece in pieces:
            if isinstance(piece, str):
                run.append(piece)
                continue
            if run:
                out.append(escape_text("".join(run), self.repository))
                run = []
            out.append(self._inline(piece, in_table))
        if run:
            out.append(escape_text("".join(run), self.repository))
        if line_start and out and isinstance(pieces[0], str):  # text first, a dropped link's or an image's too
            out[0] = _start_of_line(out[0])
        return "".join(out)

    def _pieces(self, children: list[SyntaxTreeNode]) -> list[str | SyntaxTreeNode]:
        """The inline nodes with what becomes plain text as strings: text, and the text of images and of links that
        are not kept (out of the repository), as deep as they nest."""
        pieces: list[str | SyntaxTreeNode] = []
        for child in children:
            if child.type in ("text", "text_special"):
                pieces.append(child.content)
            elif child.type == "image" or (child.type == "link" and own_address(
                    str(child.attrs.get("href", "")), self.repository) is None):
                pieces.extend(self._pieces(child.children))
            else:
                pieces.append(child)
        return pieces

    def _inline(self, node: SyntaxTreeNode, in_table: bool) -> str:
        kind = node.type
        if kind in ("text", "text_special"):
            return escape_text(node.content, self.repository)
        if kind == "softbreak":
            return " "
        if kind == "hardbreak":
            return "<br>"
        if kind == "code_inline":
            content = no_pings(node.content.replace("|", "\\|") if in_table else node.content)
            fence = _fence(content, least=1)
            pad = " " if content.startswith(("`", " ")) or content.endswith(("`", " ")) or not content.strip() else ""
            return f"{fence}{pad}{content}{pad}{fence}"
        if kind in ("em", "strong", "s"):
            inner = self.inline(node, in_table=in_table)
            mark = {"em": "*", "strong": "**", "s": "~~"}[kind]
            return f"{mark}{inner}{mark}" if inner.strip() else inner
        if kind == "link":
            inner = self.inline(node, in_table=in_table)
            address = own_address(str(node.attrs.get("href", "")), self.repository)
            if address is None or (node.markup == "autolink" and not inner):
                return inner
            return f"[{inner}](<{address}>)"
        if kind == "image":
            return self.inline(node, in_table=in_table)
        if kind == "html_inline":
            match = INERT_TAG.fullmatch(node.content.strip())
            if match and match.group(1).lower() in INERT_TAGS:
                return node.content.strip().lower()
            return escape_text(node.content, self.repository)
        return escape_text(node.content or "", self.repository)  # anything else: its text, inert

    # -- blocks
    def blocks(self, nodes: list[SyntaxTreeNode], *, tight: bool = False) -> list[str]:
        """Blocks apart by a blank line; those of a tight list item (its paragraphs hidden) without one."""
        lines: list[str] = []
        for node in nodes:
            block = self.block(node)
            if not block:
                continue
            if lines and not tight:
                lines.append("")
            lines.extend(block)
        return lines

    def block(self, node: SyntaxTreeNode) -> list[str]:
        kind = node.type
        if kind == "paragraph":
            return [self.inline(node.children[0], line_start=True)] if node.children else []
        if kind == "heading":
            level = int(node.tag[1]) if node.tag[1:].isdigit() else 1
            return ["#" * level + " " + self.inline(node.children[0])]
        if kind == "blockquote":
            return [f"> {line}" if line else ">" for line in self.blocks(node.children)]
        if kind in ("bullet_list", "ordered_list"):
            start = int(node.attrs.get("start", 1)) if kind == "ordered_list" else 1
            lines = []
            for index, item in enumerate(node.children):
                marker = f"{start + index}. " if kind == "ordered_list" else "- "
                tight = any(child.type == "paragraph" and child.hidden for child in item.children)
                body = self.blocks(item.children, tight=tight) or [""]
                lines.append(marker + body[0])
                lines.extend(" " * len(marker) + line if line else "" for line in body[1:])
            return lines
        if kind in ("fence", "code_block"):
            content = no_pings(node.content)
            content = content if content.endswith("\n") or not content else content + "\n"
            fence = _fence(content)
            return [fence, *content.splitlines(), fence]
        if kind == "hr":
            return ["***"]
        if kind == "html_block":
            raw = node.content.rstrip("\n")
            first = re.match(r"\s*<(/?)([A-Za-z]+)", raw)
            if first and first.group(2).lower() in INERT_TAGS:
                kept, _ = inert_html(raw, self.repository)
                return kept.splitlines() or [""]
            return [_start_of_line(escape_text(" ".join(raw.split("\n")), self.repository))]
        if kind == "table":
            return self.table(node)
        text = node.content or " ".join(c.content for c in node.children if c.content)
        return [_start_of_line(escape_text(" ".join(text.split()), self.repository))] if text.strip() else []

    def table(self, node: SyntaxTreeNode) -> list[str]:
        rows: list[list[str]] = []
        aligns: list[str] = []
        for section in node.children:
            for row in section.children:
                cells = []
                for cell in row.children:
                    cells.append(self.inline(cell.children[0], in_table=True) if cell.children else "")
                    if section.type == "thead":
                        style = str(cell.attrs.get("style", ""))
                        aligns.append({"text-align:left": ":--", "text-align:right": "--:",
                                       "text-align:center": ":-:"}.get(style, "---"))
                rows.append(cells)
        if not rows:
            return []
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join(aligns or ["---"] * len(rows[0])) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        return lines


def sanitise(markdown: str, repository: str = "") -> str:
    """Markdown from an untrusted source, written out again inert (see the module's docstring). `repository`
    (owner/name) is this run's: links into it stay links."""
    text = CONTROL.sub("", markdown.replace("\r\n", "\n").replace("\r", "\n"))
    lines = _Writer(repository).blocks(SyntaxTreeNode(parser().parse(text)).children)
    out = "\n".join(lines) + ("\n" if lines else "")
    problem = inert_problem(out, repository)
    if problem is None:
        return out
    fence = _fence(text)
    return (f"_(the report could not be shown safely as Markdown ({problem}); here it is as text)_\n\n"
            f"{fence}\n{text.rstrip()}\n{fence}\n")


def inert_problem(markdown: str, repository: str) -> str | None:
    """What in `markdown`, parsed as GitHub would, is not inert: a link out of the repository, an image, a raw HTML
    tag other than the inert ones, a code fence with an info string; None when nothing is."""
    for token in parser().parse(markdown):
        for child in [token, *(token.children or [])]:
            if child.type == "link_open":
                href = str(child.attrs.get("href", ""))
                if own_address(href, repository) != href:
                    return f"a link to {href[:80]!r}"
            elif child.type == "image":
                return "an image"
            elif child.type == "html_inline":
                match = INERT_TAG.fullmatch(child.content.strip())
                if not match or match.group(1).lower() not in INERT_TAGS:
                    return f"the HTML {child.content[:40]!r}"
            elif child.type == "html_block" and inert_html(child.content, repository)[1]:
                return f"the HTML {child.content[:40]!r}"
            elif child.type == "fence" and child.info.strip():
                return "a code fence with an info string"
    return None
