"""The project's documents read as documentation: pages, their sections by heading, the fenced code
blocks in a section, the links and the anchors GitHub gives each heading.

One reader for every test that runs or compares a documented command (the client tests, the
recipes, the Python examples, the support matrix), so a block is found the same way wherever it
lives. Headings and links inside fenced code are not headings or links.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target), not inside inline code; the target up to the first space or ')'
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


@dataclass(frozen=True)
class Heading:
    level: int
    title: str
    line: int  # 0-based line of the heading


def page_path(name: str) -> Path:
    """``README.md`` or ``docs/NAME.md`` (``NAME.md`` alone means the docs page)."""
    if name == "README.md" or "/" in name:
        return REPO / name
    return DOCS / name


@cache
def page(name: str) -> str:
    """The text of a page: ``README.md``, ``docs/serving.md`` or ``serving.md``."""
    return page_path(name).read_text(encoding="utf-8")


def pages() -> list[str]:
    """Every Markdown page of the project's documentation: the README and ``docs/*.md``."""
    return ["README.md", *sorted(f"docs/{path.name}" for path in DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines()):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def headings(text: str) -> list[Heading]:
    """The page's headings, in order (never a ``#`` comment inside a code block)."""
    found = []
    for number, line in prose_lines(text):
        match = HEADING.match(line)
        if match:
            found.append(Heading(len(match.group(1)), match.group(2), number))
    return found


def section(name: str, title: str) -> str:
    """The section of page ``name`` under the heading titled ``title`` (any level), up to the next
    heading of the same or a higher level; a unique title is required."""
    text = page(name)
    found = headings(text)
    matching = [h for h in found if h.title == title]
    assert len(matching) == 1, f"{name}: {len(matching)} headings titled {title!r}"
    start = matching[0]
    end = next((h.line for h in found if h.line > start.line and h.level <= start.level), None)
    lines = text.splitlines()
    return "\n".join(lines[start.line:end]) + "\n"


def code_blocks(name: str, title: str, language: str) -> list[str]:
    """The fenced ``language`` blocks of a section, in order, each without its fences."""
    return re.findall(rf"^```{re.escape(language)}\n(.*?)^```", section(name, title), flags=re.S | re.M)


def code_block(name: str, title: str, language: str, index: int = 0) -> str:
    """The ``index``-th fenced ``language`` block of a section."""
    blocks = code_blocks(name, title, language)
    assert len(blocks) > index, f"{name}, {title!r}: no {language} block #{index}"
    return blocks[index]


def github_slug(title: str) -> str:
    """The anchor GitHub gives a heading: the rendered text lower-cased, punctuation dropped (letters,
    digits, marks, ``-`` and ``_`` kept), each space a ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    kept = "".join(ch for ch in text.lower()
                   if ch in "-_ " or unicodedata.category(ch)[0] in ("L", "N", "M"))
    return kept.replace(" ", "-")


def anchors(name: str) -> set[str]:
    """Every anchor of a page: each heading's slug, a repeated slug numbered ``-1``, ``-2`` as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(page(name)):
        slug = github_slug(heading.title)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(name: str) -> list[str]:
    """The targets of the page's Markdown links (outside code blocks and inline code)."""
    out = []
    for _, line in prose_lines(page(name)):
        out.extend(LINK.findall(INLINE_CODE.sub("", line)))
    return out


__all__ = ["DOCS", "REPO", "Heading", "anchors", "code_block", "code_blocks", "github_slug", "headings", "links",
           "page", "page_path", "pages", "prose_lines", "section"]
