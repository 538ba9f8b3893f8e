"""Every relative link in README.md and docs/*.md resolves: the file exists, and an
anchor (`file.md#heading`) names a heading of that file, slugged as GitHub does."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    found = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            found.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            found.append(f"{page.name}: {target} (no such heading)")
    return found


def test_every_relative_link_resolves() -> None:
    assert [p for page in PAGES for p in broken_links(page)] == []


def test_a_broken_link_is_seen(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# Top: `x`\n[ok](#top-x) [gone](b.md) [bad](#nowhere)\n"
                    "```\n[in code](c.md)\n```\n")  # fmt: skip
    assert broken_links(page) == ["a.md: b.md (no such file)", "a.md: #nowhere (no such heading)"]
