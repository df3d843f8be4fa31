"""The README's and the docs' Markdown read as GitHub renders it: code blocks, links, anchors.

Shared by ``tests/unit/test_docs.py`` (links, the settings table) and
``tests/e2e/test_docs_examples.py`` (the code blocks, run against a live server).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The line just before a code block's fence that says the block cannot run as written.
FRAGMENT_MARKER = "<!-- fragment -->"

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def doc_files() -> list[Path]:
    """``README.md`` and every page under ``docs/``."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class CodeBlock:
    """One fenced code block: its info-string language, its text, where it starts (1-based line
    of the opening fence) and whether the line before the fence marks it as a fragment."""

    path: Path
    line: int
    language: str
    text: str
    fragment: bool


def _split(text: str) -> tuple[list[CodeBlock], list[tuple[int, str]]]:
    """The fenced blocks of ``text`` and its other lines, as (1-based number, line)."""
    blocks: list[CodeBlock] = []
    prose: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, language = match.group(1), match.group(2).lower()
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        start, body = i, []
        i += 1
        while i < len(lines) and not closing.match(lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence (or the end of the file, which closes it too)
        fragment = start > 0 and lines[start - 1].strip() == FRAGMENT_MARKER
        blocks.append(CodeBlock(Path(), start + 1, language, "\n".join(body) + "\n", fragment))
    return blocks, prose


def code_blocks(path: Path) -> list[CodeBlock]:
    blocks, _ = _split(path.read_text())
    return [CodeBlock(path, b.line, b.language, b.text, b.fragment) for b in blocks]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading's text: Markdown removed, lower case, punctuation dropped
    (letters, digits, ``_``, ``-`` and spaces stay), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = "".join(c for c in text if c in "_- " or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of ``path``, repeats numbered ``-1``, ``-2``... as GitHub does."""
    _, prose = _split(path.read_text())
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose:
        match = _HEADING.match(line)
        if not match:
            continue
        anchor = github_anchor(match.group(2))
        if anchor in seen:
            seen[anchor] += 1
            anchor = f"{anchor}-{seen[anchor]}"
        else:
            seen[anchor] = 0
        found.add(anchor)
    return found


@dataclass(frozen=True)
class Link:
    path: Path
    line: int
    target: str


def relative_links(path: Path) -> list[Link]:
    """The links of ``path`` outside code that point into the repository (no scheme, no ``//``)."""
    _, prose = _split(path.read_text())
    links = []
    for number, line in prose:
        line = _INLINE_CODE.sub("", line)
        for target in [*_LINK.findall(line), *_HTML_SRC.findall(line)]:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//", target):
                continue
            links.append(Link(path, number, target))
    return links


def broken(link: Link) -> str | None:
    """Why ``link`` does not resolve, or None: a missing file or folder, or an unknown anchor."""
    target, _, anchor = link.target.partition("#")
    destination = (link.path.parent / target).resolve() if target else link.path
    if not destination.exists():
        return f"{target}: no such file or folder"
    if anchor:
        if destination.is_dir() or destination.suffix != ".md":
            return f"#{anchor}: an anchor into something that is not a Markdown file"
        if anchor not in anchors(destination):
            return f"#{anchor}: no such heading in {destination.relative_to(ROOT)}"
    return None


def table_names(path: Path, heading: str) -> set[str]:
    """The environment variable names in the first column of the table under ``## heading``."""
    names: set[str] = set()
    inside = False
    _, prose = _split(path.read_text())
    for _, line in prose:
        match = _HEADING.match(line)
        if match:
            inside = match.group(2) == heading
            continue
        if inside and line.startswith("|"):
            first = line.strip("|").split("|")[0]
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", first))
    return names
