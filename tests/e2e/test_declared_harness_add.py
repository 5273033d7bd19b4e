"""A harness a user adds from a TOML file of their own, as a user does it: ``harnessrl harness
add FILE`` checks it, installs it and runs its conformance cells against a real proxy, then
``harnessrl trial run --harness NAME`` runs a real trial of it in the sandbox (local backend;
the scripted engine plays the policy). The file is Pi's, over the Anthropic Messages API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from services.sandbox.harnesses.declared import SHIPPED_DIR

pytestmark = [
    pytest.mark.harness,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed"),
]
ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "services" / "sandbox" / "examples" / "hello"


def pi_over_anthropic() -> str:
    text = (SHIPPED_DIR / "pi.toml").read_text()
    for old, new in [
        ('name = "pi"', 'name = "pi-anthropic"'),
        ('protocol = "openai-chat"', 'protocol = "anthropic"'),
        ('api = "openai-completions"', 'api = "anthropic-messages"'),
        ('baseUrl = "{base_url}"', 'baseUrl = "{proxy_root}"'),  # its Anthropic client adds /v1
    ]:
        assert old in text, old
        text = text.replace(old, new)
    return text


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HARNESSRL_HARNESS_DIR": str(tmp / "harnesses"),
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp / "cache"),
        "HARNESSRL_SANDBOX_ARTIFACTS_DIR": str(tmp / "artifacts"),
        "HARNESSRL_RUNS_DIR": str(tmp / "runs"),
    }
    cmd = [sys.executable, "-m", "stack.cli", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_harness_added_from_a_file_runs_a_trial(tmp_path: Path) -> None:
    file = tmp_path / "pi-anthropic.toml"
    file.write_text(pi_over_anthropic())
    added = cli(tmp_path, "harness", "add", str(file))
    assert added.returncode == 0, added.stderr[-3000:]
    assert "tools       passed" in added.stderr, added.stderr
    assert (tmp_path / "harnesses" / "pi-anthropic.toml").is_file()
    listed = cli(tmp_path, "harness", "list")
    assert any(line.split()[:2] == ["pi-anthropic", "file"] for line in listed.stdout.splitlines()), listed.stdout

    def bash(command: str) -> dict[str, object]:
        return {"content": "Working.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}

    main = [bash("ls"), bash("echo hello > hello.txt"), {"content": "Created hello.txt."}]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"context_window": 200_000, "threads": {"main": main}, "chunk_tokens": 3}))
    args = ["--task", str(HELLO), "--harness", "pi-anthropic", "--engine", f"scripted:{script}", "--max-turns", "0"]
    ran = cli(tmp_path, "trial", "run", *args, "--json")
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout)
    assert result["termination_reason"] == "completed" and result["reward"] == 1.0, result
    assert result["num_segments"] == 1, result


def test_a_pypi_package_installs_into_a_venv_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PyPI side of [install] (no coding agent ships there small enough for a test: a tiny
    package with a console script stands in): its own venv, the exact version, its bin entry,
    mounted with the interpreter it was made from; a second install is a no-op."""
    from services.sandbox.harnesses.declared import declared_class, entry, install, installed_version
    from services.sandbox.harnesses.declared_spec import parse

    monkeypatch.setenv("HARNESSRL_TOOLS_DIR", str(tmp_path / "tools"))
    decl = parse(
        {
            "harness": {"name": "cow", "protocol": "openai-chat"},
            "install": {"pypi": "cowsay", "version": "6.1", "bin": "cowsay"},
            "run": {"argv": ["-t", "{instruction}"]},
        },
        "cow.toml",
    )
    assert install(decl) is True
    assert installed_version(decl) == "6.1" and entry(decl).is_file()
    adapter = declared_class(decl)()
    adapter.check_installed()
    assert adapter.install_paths()[0] == tmp_path / "tools" / "declared" / "cow"
    assert len(adapter.install_paths()) == 2  # the venv and its base interpreter's prefix
    out = subprocess.run([str(entry(decl)), "-t", "moo"], capture_output=True, text=True, check=True)
    assert "moo" in out.stdout
    assert install(decl) is False


def test_harness_install_runs_the_installs_at_once_and_names_each_failure(tmp_path: Path) -> None:
    """``harnessrl harness install A B``: the installs run at once (each declared harness has a
    prefix of its own); one that fails (a version the registry does not have) is named with its
    installer's error and the command exits 1, and the other is still installed."""
    harnesses = tmp_path / "harnesses"
    harnesses.mkdir()
    for name, version in (("cow-ok", "6.1"), ("cow-bad", "0.0.99")):
        (harnesses / f"{name}.toml").write_text(
            f'[harness]\nname = "{name}"\nprotocol = "openai-chat"\n'
            f'[install]\npypi = "cowsay"\nversion = "{version}"\nbin = "cowsay"\n'
            '[run]\nargv = ["-t", "{instruction}"]\n'
        )
    env = {**os.environ, "HARNESSRL_HARNESS_DIR": str(harnesses), "HARNESSRL_TOOLS_DIR": str(tmp_path / "tools")}
    cmd = [sys.executable, "-m", "stack.cli", "harness", "install", "cow-ok", "cow-bad"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "cow-ok: installed cowsay@6.1" in proc.stderr, proc.stderr[-3000:]
    assert "cow-bad: harness 'cow-bad'" in proc.stderr and "harness install failed: cow-bad" in proc.stderr
    assert (tmp_path / "tools" / "declared" / "cow-ok" / "bin" / "cowsay").is_file()
