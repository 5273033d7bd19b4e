"""Where the Ubuntu keyring's Debian package comes from: the host's own Debian mirror,
read from apt's sources in either format; security-only entries are not a mirror."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.sandbox.baseimages import debian_mirror
from services.sandbox.common.errors import EnvSetupError

DEB822 = """Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
# a comment
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
"""


def test_the_first_debian_uri_of_a_release_in_either_format(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert debian_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text("# old\ndeb [arch=amd64] http://one.example/debian bookworm main\n")
    assert debian_mirror(tmp_path) == "http://one.example/debian"


def test_no_mirror_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb http://security.example/debian bookworm-security main\n")
    with pytest.raises(EnvSetupError, match="no Debian mirror"):
        debian_mirror(tmp_path)
