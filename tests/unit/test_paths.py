"""The harnessrl home is a real path: sandboxes bind what is under it at the same path, and
a symlink on the way does not resolve inside them (every sandboxed trial then failed in the
forwarder's execvp, from a worktree whose ``.harnessrl`` linked to another checkout's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl import paths


def test_the_default_home_reached_through_a_symlink_is_its_real_path(tmp_path: Path, monkeypatch) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".harnessrl").symlink_to(real)
    monkeypatch.delenv("HARNESSRL_HOME", raising=False)
    monkeypatch.delenv("HARNESSRL_TOOLS_DIR", raising=False)
    monkeypatch.setattr(paths, "PROJECT_ROOT", checkout)
    assert paths.home() == real
    assert paths.tools_dir() == real / "tools"


@pytest.mark.parametrize("variable", ["HARNESSRL_HOME", "HARNESSRL_TOOLS_DIR", "HARNESSRL_RUNS_DIR"])
def test_a_home_given_through_a_symlink_is_its_real_path(variable: str, tmp_path: Path, monkeypatch) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv(variable, str(tmp_path / "link"))
    got = {"HARNESSRL_HOME": paths.home, "HARNESSRL_TOOLS_DIR": paths.tools_dir, "HARNESSRL_RUNS_DIR": paths.runs_dir}
    assert got[variable]() == real
