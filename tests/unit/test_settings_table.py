"""The settings table generator (stack/settings_table.py): every service's settings
class, env names that the settings classes really read, defaults that are the same
on every machine, and the README splice with its clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stack import settings_table
from stack.settings_table import BEGIN, END, REGENERATE, drift, render, service_settings, splice

ROOT = Path(__file__).resolve().parents[2]


def test_every_service_with_settings_has_a_table() -> None:
    folders = {p.relative_to(ROOT / "services").parts[0] for p in (ROOT / "services").glob("**/settings.py")}
    assert set(service_settings()) == folders >= {"proxy", "gateway", "sandbox", "capture_store", "trainer"}
    table = render()
    for name in folders:
        assert f"#### `{name}`" in table and f"| `{name}` |" in table


def test_the_env_names_are_the_ones_the_settings_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.sandbox.common.settings import Settings as SandboxSettings
    from services.sandbox_remote.settings import Settings as RemoteSettings

    table = render()
    for env in ("HARNESSRL_SANDBOX_CONCURRENCY", "HARNESSRL_SANDBOX_LOCAL__BWRAP", "HARNESSRL_SANDBOX_REMOTE_POLL_S"):
        assert f"| `{env}` |" in table
    monkeypatch.setenv("HARNESSRL_SANDBOX_CONCURRENCY", "7")
    monkeypatch.setenv("HARNESSRL_SANDBOX_LOCAL__BWRAP", "/opt/bwrap")
    monkeypatch.setenv("HARNESSRL_SANDBOX_REMOTE_POLL_S", "0.7")
    sandbox, remote = SandboxSettings(), RemoteSettings()
    assert sandbox.concurrency == 7 and sandbox.local.bwrap == "/opt/bwrap" and remote.poll_s == 0.7


def test_rows_show_types_bounds_defaults_and_secrets() -> None:
    table = render()
    assert "| `HARNESSRL_SANDBOX_CONCURRENCY` | int >=1 <=256 | `4` | Trials one worker runs at once. |" in table
    assert "| `HARNESSRL_SANDBOX_AUTH_TOKEN` | secret (optional) | unset |" in table
    assert "| `HARNESSRL_SANDBOX_WORK_DIR` | path | `$HARNESSRL_HOME/sandbox/trials` |" in table
    assert "`HARNESSRL_GATEWAY_PORT` = `0`" in table


def test_the_output_does_not_depend_on_the_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = render()
    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("HARNESSRL_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("HARNESSRL_SANDBOX_CONCURRENCY", "9")
    assert render() == first
    assert str(tmp_path) not in first and str(ROOT) not in first


def test_splice_and_drift(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nno markers\n")
    problem = drift(readme)
    assert problem is not None and BEGIN in problem and REGENERATE in problem
    readme.write_text(f"# x\n{BEGIN}\nstale\n{END}\ntail\n")
    assert "out of date" in (drift(readme) or "") and REGENERATE in (drift(readme) or "")
    readme.write_text(splice(readme.read_text(), render()))
    assert drift(readme) is None and readme.read_text().endswith(f"{END}\ntail\n")
    with pytest.raises(ValueError, match="exactly one"):
        splice(f"{END}\n{BEGIN}\n", "t")
    with pytest.raises(ValueError, match="exactly one"):
        splice(f"{BEGIN}\n{BEGIN}\n{END}\n", "t")


def test_the_script(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{BEGIN}\n{END}\n")
    script = [str(ROOT / "scripts" / "settings_table")]
    env = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    stale = subprocess.run([*script, "--check", str(readme)], capture_output=True, text=True, env=env, timeout=120)
    assert stale.returncode == 1 and REGENERATE in stale.stderr
    assert subprocess.run([*script, "--write", str(readme)], env=env, timeout=120).returncode == 0
    assert subprocess.run([*script, "--check", str(readme)], env=env, timeout=120).returncode == 0
    printed = subprocess.run(script, capture_output=True, text=True, env=env, timeout=120)
    assert printed.stdout == render()
    no_markers = tmp_path / "plain.md"
    no_markers.write_text("nothing\n")
    refused = subprocess.run(
        [*script, "--write", str(no_markers)], capture_output=True, text=True, env=env, timeout=120
    )
    assert refused.returncode == 2 and BEGIN in refused.stderr
    assert settings_table.main(["--check", str(readme)]) == 0
