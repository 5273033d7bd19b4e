"""OpenCode's search tools need ripgrep, which it downloads at run time when it
finds none (a sandbox has no network): setup bundles Debian's rg self-contained
(runtime/ripgrep), the adapter links it where OpenCode looks before downloading,
and a missing bundle fails the harness check (and so preflight) by name.
tests/e2e/test_harness_search_tools.py runs the real tools in a sandbox."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harnessrl import paths
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.harnesses import AgentContext, get_harness
from services.sandbox.harnesses.npm_harnesses import OPENCODE_RG, ripgrep_runtime
from services.sandbox.task.model import load_task
from stack import preflight, runconfig
from tests.run_support import make_pool, tiny_model, write_config
from tests.sandbox_support import make_task


def _context(tmp_path: Path) -> AgentContext:
    (tmp_path / "home").mkdir()
    (tmp_path / "run").mkdir()
    return AgentContext(
        trial_id="t-1",
        task=load_task(make_task(tmp_path / "tasks")),
        instruction="Write hello to hello.txt.",
        model="policy-model",
        max_turns=7,
        base_url="http://127.0.0.1:4100/trials/t-1/v1",
        token="trial-token",
        options={},
        paths=SandboxPaths(),
        home=tmp_path / "home",
        runtime=tmp_path / "run",
    )


def test_opencode_mounts_and_links_the_bundled_ripgrep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_TOOLS_DIR", str(tmp_path / "tools"))
    ctx = _context(tmp_path)
    adapter = get_harness("opencode")
    assert ripgrep_runtime() == tmp_path / "tools" / "runtime" / "ripgrep"
    assert ripgrep_runtime() in adapter.install_paths()  # mounted read-only, at the same path
    cmd = adapter.prepare(ctx)
    link = ctx.home / OPENCODE_RG
    assert link.is_symlink() and link.readlink() == ripgrep_runtime() / "bin" / "rg"
    # OpenCode looks in $XDG_CACHE_HOME/opencode/bin: the adapter's XDG_CACHE_HOME is HOME/.cache.
    assert f"{cmd.env['XDG_CACHE_HOME']}/opencode/bin/rg" == f"{ctx.paths.home}/{OPENCODE_RG}"
    adapter.prepare(ctx)  # a second trial in the same HOME replaces the link
    assert link.readlink() == ripgrep_runtime() / "bin" / "rg"


def test_missing_ripgrep_fails_the_opencode_check_and_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "tools"
    monkeypatch.setenv("HARNESSRL_TOOLS_DIR", str(tools))
    entry = tools / "npm" / "node_modules" / ".bin" / "opencode"
    entry.parent.mkdir(parents=True)
    entry.write_text("")
    with pytest.raises(EnvSetupError, match=r"ripgrep .*runtime/ripgrep/bin/rg not found.*Debian package ripgrep"):
        get_harness("opencode").check_installed()
    if not paths.default_model_dir().exists():
        pytest.skip("default model not prepared (preflight's model check needs it)")
    model = tiny_model(tmp_path / "model")
    cfg = runconfig.load(write_config(tmp_path, model, make_pool(tmp_path), run={"harness": "opencode"}))
    harness = {c.name: c for c in preflight.static_checks(cfg, []).checks}["harness"]
    assert not harness.ok and "ripgrep" in harness.detail and "scripts/setup" in harness.detail
    rg = tools / "runtime" / "ripgrep" / "bin" / "rg"
    rg.parent.mkdir(parents=True)
    rg.write_text("")
    get_harness("opencode").check_installed()  # the rest of it is the version check's


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_bundled_ripgrep_runs_with_nothing_else_of_the_host() -> None:
    """The bundle needs no library of the image it runs in: with only itself mounted
    (no /usr, no /lib), it searches."""
    bundle = ripgrep_runtime()
    if not (bundle / "bin" / "rg").exists():
        pytest.skip(f"{bundle} is not installed; scripts/setup bundles it")
    here = Path(__file__).resolve()
    argv = ["bwrap", "--ro-bind", str(bundle), str(bundle), "--ro-bind", str(here.parent), "/search", "--proc", "/proc"]
    argv += ["--dev", "/dev", "--chdir", "/search", "--clearenv", str(bundle / "bin" / "rg"), "--no-config"]
    proc = subprocess.run([*argv, "-n", "Debian's rg self-contained", here.name], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "bundles Debian's rg self-contained" in proc.stdout
