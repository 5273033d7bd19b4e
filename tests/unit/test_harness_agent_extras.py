"""Each harness adapter gives a task's skills and MCP servers to its harness in the
harness's own format (the config it writes, the setup that installs the skills), or
refuses by name what its harness cannot take."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.harnesses import AgentContext, get_harness
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task

BASE = "http://127.0.0.1:4100/trials/t-1/v1"
STDIO = "[[environment.mcp_servers]]\nname = 'notes'\ntransport = 'stdio'\ncommand = 'python3'\nargs = ['/opt/s.py']\n"
HTTP = (
    "[[environment.mcp_servers]]\nname = 'api'\ntransport = 'http'\nurl = 'http://localhost:9/mcp'\n"
    "headers = {{ X-Mode = 'fast' }}\n"
)
SSE = "[[environment.mcp_servers]]\nname = 'feed'\nurl = 'http://127.0.0.1:8/sse'\n"
SKILLS = "[environment]\nskills_dir = '/skills'\n"


def _ctx(tmp_path: Path, toml: str) -> AgentContext:
    (tmp_path / "home").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    return AgentContext(
        trial_id="t-1",
        task=load_task(make_task(tmp_path / "tasks", toml=toml)),
        instruction="Write hello to hello.txt.",
        model="policy-model",
        max_turns=7,
        base_url=BASE,
        token="tok",
        options={},
        paths=SandboxPaths(),
        home=tmp_path / "home",
        runtime=tmp_path / "run",
    )


def _copies_to(setup: list[str] | None, dest: str) -> None:
    assert setup is not None and setup[-2:] == ["/skills", dest], setup


def test_claude_code(tmp_path: Path) -> None:
    cmd = get_harness("claude-code").prepare(_ctx(tmp_path, SKILLS + STDIO + HTTP + SSE))
    flag = cmd.argv.index("--mcp-config")
    assert cmd.argv[flag + 1] == "/run/harnessrl/mcp.json"
    servers = json.loads((tmp_path / "run" / "mcp.json").read_text())["mcpServers"]
    assert servers == {
        "notes": {"type": "stdio", "command": "python3", "args": ["/opt/s.py"]},
        "api": {"type": "http", "url": "http://localhost:9/mcp", "headers": {"X-Mode": "fast"}},
        "feed": {"type": "sse", "url": "http://127.0.0.1:8/sse"},
    }
    _copies_to(cmd.setup, "/home/agent/.claude/skills")


def test_codex(tmp_path: Path) -> None:
    cmd = get_harness("codex").prepare(_ctx(tmp_path, SKILLS))
    _copies_to(cmd.setup, "/home/agent/.agents/skills")
    assert "mcp_servers" not in tomllib.loads((tmp_path / "home" / ".codex" / "config.toml").read_text())


def test_codex_mcp_servers(tmp_path: Path) -> None:
    get_harness("codex").prepare(_ctx(tmp_path, STDIO + HTTP))
    config = tomllib.loads((tmp_path / "home" / ".codex" / "config.toml").read_text())
    assert config["mcp_servers"] == {
        "notes": {"command": "python3", "args": ["/opt/s.py"]},
        "api": {"url": "http://localhost:9/mcp", "http_headers": {"X-Mode": "fast"}},
    }
    assert config["model_providers"]["harnessrl"]["wire_api"] == "responses"  # the tables follow, not nest


def test_codex_refuses_an_sse_mcp_server_by_name(tmp_path: Path) -> None:
    with pytest.raises(EnvSetupError, match=r"'codex' cannot reach MCP server 'feed' .*transport 'sse'"):
        get_harness("codex").prepare(_ctx(tmp_path, STDIO + SSE))


def test_opencode(tmp_path: Path) -> None:
    cmd = get_harness("opencode").prepare(_ctx(tmp_path, SKILLS + STDIO + HTTP))
    config = json.loads((tmp_path / "run" / "opencode.json").read_text())
    assert config["mcp"] == {
        "notes": {"type": "local", "command": ["python3", "/opt/s.py"], "enabled": True},
        "api": {
            "type": "remote",
            "url": "http://localhost:9/mcp",
            "oauth": False,
            "enabled": True,
            "headers": {"X-Mode": "fast"},
        },
    }
    _copies_to(cmd.setup, "/home/agent/.config/opencode/skills")


def test_openhands_sdk(tmp_path: Path) -> None:
    cmd = get_harness("openhands-sdk").prepare(_ctx(tmp_path, SKILLS + STDIO + SSE))
    assert json.loads(cmd.env["HARNESSRL_MCP_CONFIG"]) == {
        "notes": {"command": "python3", "args": ["/opt/s.py"]},
        "feed": {"url": "http://127.0.0.1:8/sse", "transport": "sse"},
    }
    assert cmd.env["HARNESSRL_SKILLS_DIR"] == "/home/agent/.agents/skills"
    _copies_to(cmd.setup, "/home/agent/.agents/skills")


@pytest.mark.parametrize("harness", ["openhands-sdk", "mini-swe-agent"])
def test_headers_are_refused_where_harbor_refuses_them(tmp_path: Path, harness: str) -> None:
    with pytest.raises(EnvSetupError, match=rf"'{harness}' cannot send HTTP headers.*'api' headers"):
        get_harness(harness).prepare(_ctx(tmp_path, HTTP))


def test_mini_swe_agent_lists_servers_in_its_instruction_and_refuses_skills(tmp_path: Path) -> None:
    cmd = get_harness("mini-swe-agent").prepare(_ctx(tmp_path / "a", STDIO + SSE))
    instruction = cmd.argv[cmd.argv.index("-t") + 1]
    assert instruction == (
        "Write hello to hello.txt.\n\nMCP Servers:\nThe following MCP servers are available for this task.\n"
        "- notes: stdio transport, command: python3 /opt/s.py\n- feed: sse transport, url: http://127.0.0.1:8/sse\n"
    )
    assert cmd.setup is None
    with pytest.raises(EnvSetupError, match=r"'mini-swe-agent' cannot take task\.toml environment\.skills_dir"):
        get_harness("mini-swe-agent").prepare(_ctx(tmp_path / "b", SKILLS))


@pytest.mark.parametrize("harness", ["claude-code", "codex", "opencode", "openhands-sdk", "mini-swe-agent"])
def test_a_task_without_extras_changes_nothing(tmp_path: Path, harness: str) -> None:
    cmd = get_harness(harness).prepare(_ctx(tmp_path, "[environment]\nmemory_mb = 512\n"))
    assert cmd.setup is None and "--mcp-config" not in cmd.argv and "HARNESSRL_MCP_CONFIG" not in cmd.env
    assert not (tmp_path / "run" / "mcp.json").exists()


def test_the_skills_setup_copies_and_names_a_missing_dir(tmp_path: Path) -> None:
    # The setup argv runs in the sandbox; its shell script is the same on the host.
    setup = get_harness("claude-code").prepare(_ctx(tmp_path, SKILLS)).setup
    assert setup is not None
    src, dst = tmp_path / "skills", tmp_path / "dst" / ".claude" / "skills"
    (src / "greet").mkdir(parents=True)
    (src / "greet" / "SKILL.md").write_text("---\nname: greet\n---\n")
    ok = subprocess.run([*setup[:-2], str(src), str(dst)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and (dst / "greet" / "SKILL.md").is_file(), ok.stderr
    gone = subprocess.run([*setup[:-2], str(tmp_path / "nope"), str(dst)], capture_output=True, text=True, check=False)
    assert gone.returncode != 0
    assert f"environment.skills_dir: {tmp_path / 'nope'} is not a directory in the sandbox" in gone.stderr
