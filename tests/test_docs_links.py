"""The documentation's links hold: README.md and every docs/*.md page link only to files that exist
and to headings those files have, and every docs/*.md page is reachable from README.md directly.

A relative link is ``[text](path)`` or ``[text](path#anchor)`` (images too), outside code spans and
fenced code blocks; ``http(s)://`` and ``mailto:`` links are not checked. An anchor must be the slug
GitHub gives one of the target's headings: lowercased, punctuation dropped except hyphens,
underscores and spaces, spaces turned into hyphens, and ``-1``, ``-2``, ... added to repeats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = ("http://", "https://", "mailto:")


@dataclass(frozen=True)
class Link:
    """One relative link: the page it is on, its line, and its target as written."""

    page: Path
    line: int
    target: str

    @property
    def path(self) -> Path:
        """The file the link names, resolved from its page's folder (the page itself for ``#anchor``)."""
        file_part = self.target.split("#", 1)[0]
        return self.page if not file_part else (self.page.parent / file_part).resolve()

    @property
    def anchor(self) -> str | None:
        return self.target.split("#", 1)[1] if "#" in self.target else None

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}: ({self.target})"


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def relative_links(page: Path) -> list[Link]:
    """Every link on ``page`` that names a file of this repository or a heading of the page."""
    return [Link(page, number, match.group(1))
            for number, line in prose_lines(page.read_text(encoding="utf-8"))
            for match in _LINK.finditer(_CODE_SPAN.sub("", line))
            if not match.group(1).lower().startswith(_EXTERNAL)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (inline links count by their text)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of every heading on ``page``, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", pages(), ids=_page_id)
def test_every_relative_link_in_the_docs_resolves(page: Path) -> None:
    broken = [str(link) for link in relative_links(page) if not link.path.exists()]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", pages(), ids=_page_id)
def test_every_anchor_in_the_docs_names_a_heading_of_its_target(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        if link.anchor is None or not link.path.exists():
            continue  # a missing file is the other test's failure
        if link.path.suffix != ".md" or link.anchor not in anchors(link.path):
            broken.append(str(link))
    assert not broken, "anchors that name no heading of their target:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {link.path for link in relative_links(README)}
    unlinked = [_page_id(page) for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked]
    assert not unlinked, "docs pages README.md does not link: " + ", ".join(unlinked)


def test_heading_slugs_follow_githubs_rule() -> None:
    assert slug("Keys: what a namespace covers") == "keys-what-a-namespace-covers"
    assert slug("The pool server's `/metrics`") == "the-pool-servers-metrics"
    assert slug("Every trace and capacity, one tier (prefix hit ratio, %)") == (
        "every-trace-and-capacity-one-tier-prefix-hit-ratio-")
    assert slug("`policy.name: adaptive`, the default") == "policyname-adaptive-the-default"
    assert slug("See [the pool](pool.md)") == "see-the-pool"


def test_repeated_headings_get_numbered_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Setup\n\n## Setup\n\n```\n## not a heading\n```\n", encoding="utf-8")
    assert anchors(page) == {"title", "setup", "setup-1"}


def test_links_in_code_are_not_checked(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[real](a.md) `[span](b.md)`\n\n```\n[fenced](c.md)\n```\n"
                    "[web](https://example.com) [mail](mailto:x@example.com)\n", encoding="utf-8")
    assert [link.target for link in relative_links(page)] == ["a.md"]
