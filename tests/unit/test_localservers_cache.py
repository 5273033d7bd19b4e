"""The Docker data root kept across test sessions: one session at a time holds it,
and a second one at the same time gets none (it starts cold on a scratch root)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harnessrl.localservers import cached_data_root


@pytest.mark.skipif(shutil.which("dockerd") is None, reason="dockerd not installed (scripts/setup)")
def test_one_session_holds_the_kept_data_root(tmp_path: Path) -> None:
    with cached_data_root(tmp_path) as first:
        assert first is not None and first.parent == tmp_path / "docker-engine"
        with cached_data_root(tmp_path) as second:
            assert second is None
    with cached_data_root(tmp_path) as again:
        assert again == first  # same engine version, same key: warm next time
