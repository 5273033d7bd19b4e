"""The table of env vars and ports in docs/settings.md is the generator's output
(no skip: a file without the markers fails too), and ``scripts/settings_table
--check`` with no file checks that document."""

from __future__ import annotations

from harnessrl.paths import PROJECT_ROOT
from stack import settings_table
from stack.settings_table import TARGET, drift


def test_the_settings_table_in_docs_is_up_to_date() -> None:
    assert TARGET == PROJECT_ROOT / "docs" / "settings.md"
    problem = drift(TARGET)
    assert problem is None, problem


def test_check_without_a_file_checks_docs_settings() -> None:
    assert settings_table.main(["--check"]) == 0
