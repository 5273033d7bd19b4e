"""The README's table of env vars and ports is the generator's output (no skip: a
README without the markers fails too)."""

from __future__ import annotations

from pathlib import Path

from stack.settings_table import drift

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_settings_table_is_up_to_date() -> None:
    problem = drift(README)
    assert problem is None, problem
