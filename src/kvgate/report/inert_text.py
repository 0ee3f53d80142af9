"""Text from a results folder or a gate artifact, as inert Markdown text: nothing GitHub renders from it links,
pings, references an issue, or opens a block. It imports nothing but the standard library: ci/inert_markdown.py (the
PR comment's sanitiser, which runs where kvgate's dependencies are not installed) loads this file by its path, and
kvgate.report.markdown writes every string of a results folder into report.md with it.

    escape_text(text, repository)   GitHub's autolinks (`https://`, `www.`, `mailto:`) defanged (`https[:]//`, `www[.]`)
                                    unless they resolve into `repository`; every `@` before a name character and `#`,
                                    `GH-` before a digit followed by a word joiner; then every character Markdown gives
                                    a meaning within a line backslash-escaped (CommonMark escapes any ASCII punctuation)
    start_of_line(text)             and, at the start of a line, what would open a block (`#`, `-`, `+`, `=`, `1.`)
    own_address(url, repository)    the address resolved (`..`, `.`, percent-encoding, backslashes) and rebuilt, when it
                                    lies in the repository on https://github.com
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import quote, unquote, urlsplit

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
WORD_JOINER = "\u2060"
# GitHub links a mention wherever `@` is followed by a name character; `#12`, `GH-12` are issue references
MENTION = re.compile(r"[@\uff20](?=[A-Za-z0-9_-])")
ISSUE_REFERENCE = re.compile(r"(#|\b[Gg][Hh]-)(?=[0-9])")
# What GFM's autolink extension and GitHub link in plain text: a scheme, or www.
# (GitHub's autolinker, cmark-gfm, takes a scheme after anything but a letter: `a_https://x.example`,
# `1https://x.example` link; and `www.` after `_`, `*`, `~`, `(`: no `\b`, which a `_` or a digit before would hide)
AUTOLINK = re.compile(r"(?i)(?<![a-z])(?:(https?|ftp)://[^\s<>]*|(www)\.[^\s<>]*|(mailto|xmpp|file|data|javascript):)")
# every scheme and `www.` in what one match took (`x(https://a.example)(https://evil.example)`: the second links)
INNER_AUTOLINK = re.compile(r"(?i)(https?|ftp)(://)|(www)(\.)")
TRAILING = ".,:;!?*_~'\")]"
# A github.com address names a repository: one other than this run's gets its host defanged (github[.]com), so no
# other issue or pull request gets a backlink
GITHUB_URL = re.compile(r"(?<![\w.-])((?:www\.)?github)\.(com)(?![\w-])", re.IGNORECASE)
# What means something in Markdown within a line, backslash-escaped (CommonMark escapes any ASCII punctuation):
# code, emphasis (an underscore between two letters or digits never emphasises: GFM's intraword rule), a link's or an
# image's `](` and a reference's `][` (a definition's `[label]:` only opens a line: start_of_line), raw HTML and autolinks (`<` before a tag's first character), character
# references (`&` before `#` or a letter), strikethrough, math, table cells and the escape itself; `p<0.001`,
# `flashinfer_mla` and `[strict-match]` stay as they are
MARKDOWN_SPECIAL = re.compile(r"([\\`*~$|]|(?<![^\W_])_|_(?![^\W_])|\](?=[(\[])|<(?=[A-Za-z/!?])|&(?=[#A-Za-z]))")
# ... and at the start of a line, what opens a block: a heading, a quote, a list item, a setext underline, a reference
# definition or task box
LINE_START = re.compile(r"^([#+=>\[-]|\d+[.)])")


def own_address(url: str, repository: str) -> str | None:
    """The address a link goes to, resolved (`..`, `.`, percent-encoding, backslashes) and rebuilt, when it lies in
    `repository` (owner/name) on https://github.com; None otherwise."""
    if not repository:
        return None
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if parts.scheme.lower() != "https" or parts.netloc.lower() != "github.com":
        return None
    path = unquote(parts.path).replace("\\", "/")
    if not path.startswith("/") or any(ch in path for ch in "\r\n\t "):
        return None
    resolved = posixpath.normpath(path)
    own = f"/{repository}".lower()
    if not (resolved.lower() == own or resolved.lower().startswith(own + "/")):
        return None
    address = "https://github.com" + quote(resolved, safe="/-._~")
    if parts.query:
        address += "?" + quote(unquote(parts.query), safe="=&-._~")
    if parts.fragment:
        address += "#" + quote(unquote(parts.fragment), safe="-._~")
    return address


def defang(text: str, repository: str) -> str:
    """Plain text as GitHub will not act on it: no mention, no issue reference, no autolink out of the repository (an
    address into it is kept, resolved), no github.com address of another repository."""
    kept: list[str] = []

    def autolink(match: re.Match[str]) -> str:
        found = match.group(0)
        if match.group(1):
            core = found.rstrip(TRAILING)
            address = own_address(core, repository)
            if address is not None:
                kept.append(address)
                return f"\0{len(kept) - 1}\0" + found[len(core):]
            scheme = match.group(1)
            return f"{scheme}[:]{_defang_inner(found[len(scheme) + 1:])}"
        if match.group(2):
            return f"{match.group(2)}[.]{_defang_inner(found[4:])}"
        return f"{match.group(3)}[:]"

    text = AUTOLINK.sub(autolink, text.replace("\0", ""))
    text = GITHUB_URL.sub(lambda m: f"{m.group(1)}[.]{m.group(2)}", text)
    text = MENTION.sub(lambda m: m.group(0) + WORD_JOINER, text)
    text = ISSUE_REFERENCE.sub(lambda m: m.group(0) + WORD_JOINER, text)
    return re.sub("\0([0-9]+)\0", lambda m: kept[int(m.group(1))], text)


def _defang_inner(text: str) -> str:
    """The rest of an address out of the repository: any further scheme or `www.` in it defanged too."""
    return INNER_AUTOLINK.sub(lambda m: f"{m.group(1)}[:]//" if m.group(1) else f"{m.group(3)}[.]", text)


def no_pings(text: str) -> str:
    """Code's text: GitHub makes no mention or reference in code, but every `@` and `#`, `GH-` before a digit gets its
    word joiner there too, whatever a renderer takes for code."""
    return ISSUE_REFERENCE.sub(lambda m: m.group(0) + WORD_JOINER, MENTION.sub(lambda m: m.group(0) + WORD_JOINER, text))


def escape_text(text: str, repository: str) -> str:
    """Text for a Markdown line: defanged, then what means something in Markdown escaped; kept own-repository
    addresses are escaped too (GitHub's autolinker reads the text after escapes)."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", defang(text, repository))


def start_of_line(text: str) -> str:
    """A line of text must not open a block either: a heading (`#`), a quote (`>`), a list item (`-`, `+`, `1.`, `1)`),
    a setext underline (`=`, `-`), a reference definition or task box (`[`)."""
    return LINE_START.sub(lambda m: m.group(0)[:-1] + "\\" + m.group(0)[-1], text)
