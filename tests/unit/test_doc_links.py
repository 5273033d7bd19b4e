"""The services' READMEs point only at documents that exist: markdown links and
upper-case document names (INTERFACES.md, ARCHITECTURE.md) resolve from the README's
folder or the repository root."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harnessrl.paths import PROJECT_ROOT

READMES = sorted(PROJECT_ROOT.glob("services/*/README.md"))
LINK = re.compile(r"\]\(([^)#\s]+)[^)]*\)")
DOC_NAME = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_]+\.md)\b")


def refs(text: str) -> list[str]:
    links = [m for m in LINK.findall(text) if not m.startswith(("http:", "https:", "mailto:"))]
    return links + DOC_NAME.findall(text)


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_readme_references_exist(readme: Path) -> None:
    missing = [r for r in refs(readme.read_text()) if not ((readme.parent / r).exists() or (PROJECT_ROOT / r).exists())]
    assert not missing, f"{readme.relative_to(PROJECT_ROOT)} points at {missing}"


def test_the_pattern_sees_a_dead_reference() -> None:
    assert refs("see INTERFACES.md and [the guide](docs/x.md#a)") == ["docs/x.md", "INTERFACES.md"]
