"""Documents point only at documents that exist.

The services' READMEs: markdown links and upper-case document names (CONTRACT.md,
BASELINE.md) resolve from the README's folder or the repository root. The top-level
README.md and docs/*.md, which readers browse on a forge, are held stricter: every
relative link and image path resolves from the file's own folder, and a link's
``#anchor`` names a heading of its target (the forge's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harnessrl.paths import PROJECT_ROOT

READMES = sorted(PROJECT_ROOT.glob("services/*/README.md"))
DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)[^)]*\)")
FULL_LINK = re.compile(r"\]\(([^)\s]*)\)")
DOC_NAME = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_]+\.md)\b")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)


def refs(text: str) -> list[str]:
    links = [m for m in LINK.findall(text) if not m.startswith(("http:", "https:", "mailto:"))]
    return links + DOC_NAME.findall(text)


def prose(text: str) -> str:
    """``text`` without fenced blocks and code spans: a regex like ``](x)`` there is no link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor a forge gives a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def dead_links(doc: Path) -> list[str]:
    """Relative links of ``doc`` whose file or ``#anchor`` does not exist, from ``doc``'s folder."""
    dead = []
    for target in FULL_LINK.findall(prose(doc.read_text())):
        if target.startswith(("http:", "https:", "mailto:")) or not target:
            continue
        rel, _, anchor = target.partition("#")
        path = (doc.parent / rel).resolve() if rel else doc
        if not path.exists():
            dead.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            dead.append(target)
    return dead


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_readme_references_exist(readme: Path) -> None:
    missing = [r for r in refs(readme.read_text()) if not ((readme.parent / r).exists() or (PROJECT_ROOT / r).exists())]
    assert not missing, f"{readme.relative_to(PROJECT_ROOT)} points at {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_relative_link_of_the_readme_and_docs_resolves(doc: Path) -> None:
    dead = dead_links(doc)
    names = [n for n in DOC_NAME.findall(prose(doc.read_text())) if not (doc.parent / n).exists()]
    names = [n for n in names if not (PROJECT_ROOT / n).exists()]
    assert not dead and not names, f"{doc.relative_to(PROJECT_ROOT)} points at {dead + names}"


def test_the_pattern_sees_a_dead_reference() -> None:
    assert refs("see INTERFACES.md and [the guide](docs/x.md#a)") == ["docs/x.md", "INTERFACES.md"]


def test_dead_links_and_anchors_are_seen(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A title: `code`, here\n\n## Twice\n\n## Twice\n")
    (tmp_path / "img.png").write_bytes(b"")
    doc = tmp_path / "docs" / "b.md"
    doc.write_text(
        "[ok](a.md#a-title-code-here) [ok](a.md#twice-1) ![img](../img.png) [web](https://x.org/y)\n"
        "[dead](img.png) [from root](docs/a.md) [bad anchor](a.md#nope) [self](#nowhere)\n"
        "`[not a link](nowhere.md)`\n\n```\n[nor this](nowhere.md)\n```\n"
    )
    assert dead_links(doc) == ["img.png", "docs/a.md", "a.md#nope", "#nowhere"]
