"""The README stays a ten-minute read, and the documents' references resolve.

- README.md is at most 15 KB: the details live in docs/.
- Every "invariant N" cited anywhere in the repository (code, tests, docs) has a
  heading in docs/architecture.md, where the invariants are numbered 1-9.
- Nothing cites a document that is not in the repository (the design notes the
  project started from), and the README and docs/ use no internal shorthand."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from harnessrl.paths import PROJECT_ROOT

README_MAX_BYTES = 15 * 1024
ARCHITECTURE = PROJECT_ROOT / "docs" / "architecture.md"
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".toml", ".sh", ".ts", ".tsx", ".js", ".yml", ".yaml", ".proto", ".txt", ""}
SKIP_DIRS = {".git", ".venv", ".harnessrl", "node_modules", "__pycache__", "wheels", "test-artifacts", "build", "dist"}
CITATION = re.compile(r"\binvariants?\s+(\d+(?:\s*(?:-|–|,|and|&)\s*\d+)*)", re.I)
HEADING = re.compile(r"^#{2,4}\s+Invariant\s+(\d+)\b", re.M)
OUTSIDE_DOCS = ("FACTS.md", "INTERFACES.md", "ARCHITECTURE.md", "STYLE.md")
# These two name dead references and invariant numbers on purpose, as their patterns' examples.
PATTERN_TESTS = {Path(__file__).resolve(), PROJECT_ROOT / "tests" / "unit" / "test_doc_links.py"}
SHORTHAND = ("issues were silent", "the issue asked", "stop 27", "no device was lent", "one session)")


def text_files() -> Iterator[Path]:
    for root, dirs, files in os.walk(PROJECT_ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")]
        for name in files:
            path = Path(root) / name
            if path.suffix in TEXT_SUFFIXES and path not in PATTERN_TESTS and path.stat().st_size < 2_000_000:
                yield path


def cited(text: str) -> set[int]:
    """Invariant numbers cited in ``text``: "invariant 6", "invariants 1-4", "invariants 5 and 7"."""
    found: set[int] = set()
    for group in CITATION.findall(text):
        for part in re.split(r"\s*(?:,|and|&)\s*", group):
            ends = [int(n) for n in re.split(r"\s*[-–]\s*", part) if n]
            found.update(range(ends[0], ends[-1] + 1))
    return found


def citations() -> dict[int, list[str]]:
    where: dict[int, list[str]] = {}
    for path in text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n in cited(text):
            where.setdefault(n, []).append(str(path.relative_to(PROJECT_ROOT)))
    return where


def test_the_readme_is_a_short_read() -> None:
    size = len((PROJECT_ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes (at most {README_MAX_BYTES}): move details to docs/"


def test_architecture_numbers_the_nine_invariants_in_order() -> None:
    assert [int(n) for n in HEADING.findall(ARCHITECTURE.read_text())] == list(range(1, 10))


def test_every_cited_invariant_has_a_heading() -> None:
    headed = {int(n) for n in HEADING.findall(ARCHITECTURE.read_text())}
    where = citations()
    assert {1, 5, 6} <= set(where), "the scan found none of the usual citations: is it reading the repository?"
    missing = {n: files for n, files in where.items() if n not in headed}
    assert not missing, f"cited invariants with no heading in docs/architecture.md: {missing}"


def test_the_citation_pattern() -> None:
    assert cited("keeps invariants 1-4 (invariant 6; Invariants 5 and 7, invariant 9)") == {1, 2, 3, 4, 5, 6, 7, 9}
    assert cited("invariant 12") == {12}
    assert cited("no invariant here, 6 items") == set()


def test_no_document_outside_the_repository_is_cited() -> None:
    found = []
    for path in text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [
            f"{path.relative_to(PROJECT_ROOT)}: {name}"
            for name in OUTSIDE_DOCS
            if re.search(rf"(?<![\w/]){re.escape(name)}", text)
        ]
    assert not found, f"documents that are not in the repository: {found}"


def test_the_readme_and_docs_use_no_internal_shorthand() -> None:
    docs = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
    found = [f"{d.relative_to(PROJECT_ROOT)}: {s!r}" for d in docs for s in SHORTHAND if s in d.read_text()]
    assert not found, found
