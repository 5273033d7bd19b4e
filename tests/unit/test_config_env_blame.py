"""A bad value from the environment is blamed on its variable, not on the config file
the service also read (which did not set the field)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl.config import validate
from harnessrl.errors import ConfigError
from services.proxy.settings import Settings as ProxySettings
from tests.cli_support import run_cli


def test_the_variable_is_named(tmp_path: Path) -> None:
    config = tmp_path / "base.toml"
    config.write_text("[proxy]\nport = 0\n")
    out = run_cli("proxy", "serve", "--config", str(config), env={"HARNESSRL_PROXY_TOP_K": "abc"})
    assert out.returncode == 2, out.stdout + out.stderr
    line = out.stderr.strip()
    assert line.startswith(f"error: environment HARNESSRL_PROXY_TOP_K (under {config}: [proxy]): top_k:"), line
    assert "(got 'abc')" in line


def test_the_file_is_named_when_it_set_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_PROXY_TOP_K", "abc")
    with pytest.raises(ConfigError) as info:
        validate(ProxySettings, {"top_k": "x"}, "base.toml: [proxy]")
    assert str(info.value).startswith("base.toml: [proxy]: top_k:") and "HARNESSRL" not in str(info.value)
    monkeypatch.delenv("HARNESSRL_PROXY_TOP_K")
    monkeypatch.setenv("HARNESSRL_PROXY_TOP_P", "2")
    with pytest.raises(ConfigError, match=r"^environment HARNESSRL_PROXY_TOP_P \(under run.toml: \[proxy\]\): top_p"):
        validate(ProxySettings, {}, "run.toml: [proxy]")
