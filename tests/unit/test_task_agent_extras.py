"""``[environment] skills_dir`` and ``[[environment.mcp_servers]]`` as Harbor reads them
(transports, the ``http`` alias, the ``sse`` default), and every malformed or unreachable
value refused naming the task, the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.sandbox.common.errors import TaskError
from services.sandbox.task.agent_extras import McpServer, unreachable_servers
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task

STDIO = "[[environment.mcp_servers]]\nname = 'notes'\ntransport = 'stdio'\ncommand = 'python3'\nargs = ['/opt/s.py']\n"


def test_skills_and_servers_load_with_harbors_meaning(tmp_path: Path) -> None:
    toml = (
        "[environment]\nskills_dir = '/skills'\n"
        + STDIO
        + "[[environment.mcp_servers]]\nname = 'web'\nurl = 'http://localhost:8000/sse'\n"
        + "[[environment.mcp_servers]]\nname = 'api'\ntransport = 'http'\nurl = 'http://127.0.0.1:9/mcp'\n"
        + "headers = {{ X-Mode = 'fast' }}\n"
    )
    env = load_task(make_task(tmp_path, toml=toml)).config.environment
    assert env.skills_dir == "/skills"
    stdio, web, api = env.mcp_servers
    assert (stdio.transport, stdio.command, stdio.args) == ("stdio", "python3", ["/opt/s.py"])
    assert (web.transport, web.host) == ("sse", "localhost")  # Harbor's default transport
    assert (api.transport, api.headers) == ("streamable-http", {"X-Mode": "fast"})  # 'http' is an alias


def test_an_empty_skills_dir_is_unset_as_in_harbor(tmp_path: Path) -> None:
    assert load_task(make_task(tmp_path, toml="[environment]\nskills_dir = ''\n")).config.environment.skills_dir is None


def test_a_compose_service_is_a_reachable_host(tmp_path: Path) -> None:
    # load_task refuses compose files until sidecars land; the host check reads the file alone.
    (tmp_path / "environment").mkdir()
    (tmp_path / "environment" / "docker-compose.yaml").write_text("services:\n  main: {}\n  mcp-server: {}\n")
    servers = [McpServer(name=n, url=f"http://{n}:8000/mcp") for n in ("mcp-server", "elsewhere")]
    (line,) = unreachable_servers(tmp_path, servers)
    assert line.startswith("environment.mcp_servers.1 ('elsewhere')") and "['main', 'mcp-server']" in line
    (tmp_path / "environment" / "docker-compose.yaml").write_text("services: [\n")
    (line,) = unreachable_servers(tmp_path, servers)
    assert "environment/docker-compose.yaml is not valid YAML" in line


@pytest.mark.parametrize(
    ("toml", "fragments"),
    [
        ("[[environment.mcp_servers]]\nname = 'm'\ntransport = 'stdio'\n", ["mcp_servers.0", "'command' is required"]),
        ("[[environment.mcp_servers]]\nname = 'm'\n", ["mcp_servers.0", "'url' is required for transport 'sse'"]),
        (
            "[[environment.mcp_servers]]\nname = 'm'\ntransport = 'websocket'\nurl = 'ws://x'\n",
            ["mcp_servers.0.transport", "'stdio', 'sse' or 'streamable-http'"],
        ),
        ("[[environment.mcp_servers]]\ntransport = 'stdio'\ncommand = 'x'\n", ["mcp_servers.0.name", "required"]),
        (
            "[[environment.mcp_servers]]\nname = 'a b'\ntransport = 'stdio'\ncommand = 'x'\n",
            ["mcp_servers.0.name", "letters, digits"],
        ),
        (STDIO + STDIO, ["environment.mcp_servers", "two servers are named 'notes'"]),
        (
            "[[environment.mcp_servers]]\nname = 'm'\nurl = 'http://mcp.example.com/mcp'\n",
            ["environment.mcp_servers.0 ('m')", "'mcp.example.com'", "cannot be reached", "invariant 6"],
        ),
        (
            "[[environment.mcp_servers]]\nname = 'm'\nurl = 'http://localhost/mcp'\n"
            "headers = {{ Authorization = 'Bearer ${{TOKEN}}' }}\n",
            ["mcp_servers.0.headers", "'Authorization'", "host's environment"],
        ),
        (
            "[[environment.mcp_servers]]\nname = 'm'\ntransport = 'stdio'\ncommand = 'x'\nurl = 'http://localhost/'\n",
            ["mcp_servers.0", "HTTP transports only"],
        ),
        ("[[environment.mcp_servers]]\nname = 'm'\nurl = 'localhost:80'\n", ["mcp_servers.0", "http(s)://HOST"]),
        ("[environment]\nskills_dir = 3\n", ["environment.skills_dir", "string"]),
    ],
)
def test_a_malformed_field_is_named(tmp_path: Path, toml: str, fragments: list[str]) -> None:
    task = make_task(tmp_path, toml=toml)
    with pytest.raises(TaskError) as info:
        load_task(task)
    message = str(info.value)
    for fragment in (str(task), "task.toml", *fragments):
        assert fragment in message, message
