"""Tar extraction stays inside its destination with and without tarfile's
extraction filters (Debian bookworm's Python 3.11.2 has none)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from services.sandbox.common import tarsafe


def _tar(*members: tuple[str, str, int, str]) -> tarfile.TarFile:
    """(name, kind 'f'|'l', mode, link or content)"""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, mode, text in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, text
                tar.addfile(info)
            else:
                info.size = len(text)
                tar.addfile(info, io.BytesIO(text.encode()))
    buffer.seek(0)
    return tarfile.open(fileobj=buffer)


@pytest.fixture(params=[True, False], ids=["filters", "no-filters"])
def filters(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(tarsafe, "_HAS_FILTERS", request.param and hasattr(tarfile, "data_filter"))
    return bool(request.param)


def test_plain_trees_extract_and_setuid_is_dropped(tmp_path: Path, filters: bool) -> None:
    tarsafe.extractall(_tar(("a/b.txt", "f", 0o4755, "x"), ("a/l", "l", 0o777, "b.txt")), tmp_path, "data")
    assert (tmp_path / "a" / "b.txt").read_text() == "x" and (tmp_path / "a" / "l").read_text() == "x"
    assert not (tmp_path / "a" / "b.txt").stat().st_mode & 0o4000
    tarsafe.extractall(_tar(("s", "f", 0o4755, "y")), tmp_path / "owned", "owned")
    assert (tmp_path / "owned" / "s").stat().st_mode & 0o4000


@pytest.mark.parametrize("member", [("../escape", "f", 0o644, "x"), ("a/../../escape", "f", 0o644, "x")])
def test_paths_outside_are_refused(tmp_path: Path, filters: bool, member: tuple[str, str, int, str]) -> None:
    with pytest.raises(tarfile.TarError):
        tarsafe.extractall(_tar(member), tmp_path / "d", "data")
    assert not (tmp_path / "escape").exists()


def test_links_out_are_refused_for_data_kept_for_tar(tmp_path: Path, filters: bool) -> None:
    for link in ("/etc/passwd", "../../etc/passwd"):
        with pytest.raises(tarfile.TarError):
            tarsafe.extractall(_tar(("l", "l", 0o777, link)), tmp_path / "data", "data")
    tarsafe.extractall(_tar(("abs", "l", 0o777, "/usr/bin/env")), tmp_path / "tar", "tar")
    assert (tmp_path / "tar" / "abs").is_symlink()
