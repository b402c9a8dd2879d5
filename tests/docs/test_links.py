"""Every relative link of README.md, ARCHITECTURE.md and docs/*.md resolves, anchors included,
and every docs page is reachable from the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\]\n]|\][^(\n])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """The text outside fenced blocks and inline code (links there are not links)."""
    return _CODE.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [
        t
        for t in _LINK.findall(_prose(path.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", t)  # http:, https:, mailto:
    ]


def test_the_slug_follows_github() -> None:
    assert _slug("DP×EP groups of torch engines") == "dpep-groups-of-torch-engines"
    assert _slug("Attached fleets (`pdlab attach`)") == "attached-fleets-pdlab-attach"
    assert _slug("Cluster runs: sim vs real") == "cluster-runs-sim-vs-real"
    assert _slug("Fitting live engines' timings") == "fitting-live-engines-timings"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_finder_sees_links_and_only_links(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# Top\n[a](b.md) and [c](b.md#top), `[not](x.md)`, [web](https://x.org)\n"
        "```\n[not](y.md)\n```\n![img](pic.png)\n"
    )
    assert relative_links(page) == ["b.md", "b.md#top", "pic.png"]
    assert anchors(page) == {"top"}


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in reached or page.suffix != ".md" or not page.exists():
            continue
        reached.add(page)
        for target in relative_links(page):
            file_part = target.partition("#")[0]
            if file_part:
                todo.append((page.parent / file_part).resolve())
    orphans = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in reached)
    assert not orphans, f"docs pages no README path links to: {orphans}"
