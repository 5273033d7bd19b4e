"""Harness adapters: the registry, and the config each writes, which must point
the harness at the trial's proxy URL with the trial token and nowhere else."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from services.sandbox.common.errors import EnvSetupError, UnknownName
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.harnesses import HARNESSES, AgentContext, ModelAccess, get_harness
from services.sandbox.harnesses.declared import user_dir
from services.sandbox.harnesses.declared_spec import load
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task

BASE = "http://127.0.0.1:4100/trials/t-1/v1"
TOKEN = "trial-token-123"


@pytest.fixture
def ctx(tmp_path: Path) -> AgentContext:
    (tmp_path / "home").mkdir()
    (tmp_path / "run").mkdir()
    return AgentContext(
        trial_id="t-1",
        task=load_task(make_task(tmp_path / "tasks")),
        instruction="Write hello to hello.txt.",
        model="policy-model",
        max_turns=7,
        base_url=BASE,
        token=TOKEN,
        options={},
        paths=SandboxPaths(),
        home=tmp_path / "home",
        runtime=tmp_path / "run",
    )


def test_registry_lists_every_harness() -> None:
    # What this checkout ships; a developer's own files (`harnessrl harness add`) come on top.
    users = {load(path).harness.name for path in user_dir().glob("*.toml")} if user_dir().is_dir() else set()
    assert set(HARNESSES) - users == {
        "claude-code",
        "opencode",
        "codex",
        "mini-swe-agent",
        "openhands-sdk",
        "shell",
        "oracle",
        "nop",
        # declared in TOML files (services/sandbox/harnesses/declared/)
        "pi",
        "qwen-code",
        "gemini-cli",
        "copilot-cli",
        "cline",
        "openclaw",
        "hermes-agent",
    }
    with pytest.raises(UnknownName, match="valid harnesses"):
        get_harness("aider")


def test_claude_code(ctx: AgentContext) -> None:
    cmd = get_harness("claude-code").prepare(ctx)
    assert cmd.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4100/trials/t-1"
    assert cmd.env["ANTHROPIC_API_KEY"] == TOKEN
    assert cmd.env["DISABLE_TELEMETRY"] == "1" and cmd.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert cmd.argv[cmd.argv.index("--max-turns") + 1] == "7"
    assert cmd.argv[cmd.argv.index("--model") + 1] == "policy-model"
    assert ctx.instruction in cmd.argv


def test_opencode(ctx: AgentContext) -> None:
    cmd = get_harness("opencode").prepare(ctx)
    config = json.loads((ctx.runtime / "opencode.json").read_text())
    provider = config["provider"]["harnessrl"]
    assert provider["options"] == {"baseURL": BASE, "apiKey": TOKEN}
    assert config["model"] == "harnessrl/policy-model" and config["autoupdate"] is False
    assert config["share"] == "disabled"
    assert cmd.env["OPENCODE_CONFIG"] == "/run/harnessrl/opencode.json"
    assert cmd.env["OPENCODE_DISABLE_AUTOUPDATE"] == "1" and cmd.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"


def test_codex(ctx: AgentContext) -> None:
    cmd = get_harness("codex").prepare(ctx)
    config = tomllib.loads((ctx.home / ".codex" / "config.toml").read_text())
    assert config["model"] == "policy-model" and config["model_provider"] == "harnessrl"
    provider = config["model_providers"]["harnessrl"]
    assert provider["base_url"] == BASE and provider["wire_api"] == "responses"
    assert cmd.env[provider["env_key"]] == TOKEN and cmd.env["CODEX_HOME"] == "/home/agent/.codex"


def test_mini_swe_agent(ctx: AgentContext) -> None:
    cmd = get_harness("mini-swe-agent").prepare(ctx)
    assert f"model.model_kwargs.api_base={BASE}" in cmd.argv and f"model.model_kwargs.api_key={TOKEN}" in cmd.argv
    assert "agent.step_limit=7" in cmd.argv and "environment.cwd=/app" in cmd.argv
    assert cmd.env["MSWEA_CONFIGURED"] == "true" and cmd.stdin == b""


def test_openhands(ctx: AgentContext) -> None:
    cmd = get_harness("openhands-sdk").prepare(ctx)
    assert cmd.env["HARNESSRL_BASE_URL"] == BASE and cmd.env["HARNESSRL_API_KEY"] == TOKEN
    assert cmd.env["HARNESSRL_MAX_TURNS"] == "7"
    assert (ctx.runtime / "openhands_driver.py").read_text().startswith('"""Runs inside the sandbox')


def test_builtin_harnesses(ctx: AgentContext, tmp_path: Path) -> None:
    assert get_harness("nop").model_access == ModelAccess.NONE
    oracle = get_harness("oracle").prepare(ctx)
    assert oracle.uploads == [(ctx.task.solution_dir, ctx.paths.solution)]
    with pytest.raises(EnvSetupError, match="agent-script"):
        get_harness("shell").prepare(ctx)
    shell_ctx = AgentContext(**{**ctx.__dict__, "options": {"script": "echo hi"}})
    cmd = get_harness("shell").prepare(shell_ctx)
    assert (ctx.runtime / "agent.sh").read_text() == "echo hi"
    assert cmd.env["OPENAI_BASE_URL"] == BASE and cmd.env["OPENAI_API_KEY"] == TOKEN
    bad = AgentContext(**{**ctx.__dict__, "options": {"script_path": str(tmp_path / "missing.sh")}})
    with pytest.raises(EnvSetupError, match="script_path"):
        get_harness("shell").prepare(bad)


def test_missing_install_is_a_setup_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path / "empty-home"))
    for name in ("claude-code", "opencode", "codex", "mini-swe-agent", "openhands-sdk"):
        with pytest.raises(EnvSetupError, match="scripts/setup"):
            get_harness(name).check_installed()


def test_collect_logs_never_follows_the_agents_symlinks(ctx: AgentContext, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.mkdir()
    (secret / "key").write_text("do not copy")
    (ctx.home / ".claude").mkdir()
    (ctx.home / ".claude" / "projects").symlink_to(secret)
    dest = tmp_path / "artifacts"
    get_harness("claude-code").collect_logs(ctx, dest)
    assert not (dest / ".claude" / "projects" / "key").exists()
    (ctx.home / ".claude" / "projects").unlink()
    (ctx.home / ".claude" / "projects").mkdir()
    (ctx.home / ".claude" / "projects" / "s.jsonl").write_text("{}\n")
    get_harness("claude-code").collect_logs(ctx, dest)
    assert (dest / ".claude" / "projects" / "s.jsonl").read_text() == "{}\n"
