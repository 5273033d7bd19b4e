"""A task's skills and MCP servers (``services.sandbox.task.agent_extras``), given to each
harness where and how that harness reads them, as Harbor's installed agents give them:

- skills: the contents of ``[environment] skills_dir`` (a directory of the sandbox) are
  copied, inside the sandbox as the agent's user before the harness starts, to the
  harness's own skills folder under its HOME (``AgentCommand.setup``). A skills_dir the
  sandbox lacks fails setup (env_setup_failed) naming the field; Harbor copies nothing then.
- MCP servers: written into the harness's config format by its adapter (helpers here).

A harness that cannot take one is refused at trial start by name (``refuse``).
"""

from __future__ import annotations

import asyncio
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from services.sandbox.common.errors import EnvSetupError
from services.sandbox.task import dockerfile
from services.sandbox.task.agent_extras import McpServer

if TYPE_CHECKING:
    from services.sandbox.backends.base import Backend, Sandbox
    from services.sandbox.harnesses.base import AgentCommand, AgentContext

SETUP_TIMEOUT_S = 120.0
# $1 the task's skills_dir (relative to the working directory, as in Harbor), $2 the harness's folder.
_COPY_SKILLS = (
    'if [ ! -d "$1" ]; then echo "task.toml: environment.skills_dir: $1 is not a directory in the sandbox '
    '(the image must hold it, e.g. COPY it in the Dockerfile)" >&2; exit 3; fi; '
    'mkdir -p "$2" && cp -R "$1"/. "$2"/'
)


def skills_dir(ctx: AgentContext) -> str | None:
    return ctx.task.config.environment.skills_dir


def mcp_servers(ctx: AgentContext) -> list[McpServer]:
    return list(ctx.task.config.environment.mcp_servers)


def copy_skills(ctx: AgentContext, home_rel: str) -> list[str] | None:
    """The setup argv copying the task's skills to ``$HOME/<home_rel>`` (None without skills)."""
    source = skills_dir(ctx)
    if source is None:
        return None
    return ["/bin/sh", "-c", _COPY_SKILLS, "sh", source, str(PurePosixPath(ctx.paths.home) / home_rel)]


def refuse(harness: str, ctx: AgentContext, *, skills: str | None = None, mcp: str | None = None) -> None:
    """EnvSetupError naming the field a harness cannot take (``skills``/``mcp``: why), when the task sets it."""
    if skills is not None and skills_dir(ctx) is not None:
        raise EnvSetupError(f"harness {harness!r} cannot take task.toml environment.skills_dir: {skills}")
    if mcp is not None and mcp_servers(ctx):
        raise EnvSetupError(f"harness {harness!r} cannot take task.toml environment.mcp_servers: {mcp}")


def refuse_headers(harness: str, ctx: AgentContext) -> None:
    for server in mcp_servers(ctx):
        if server.headers:
            raise EnvSetupError(
                f"harness {harness!r} cannot send HTTP headers to an MCP server (task.toml environment.mcp_servers "
                f"{server.name!r} headers), as in Harbor"
            )


def claude_mcp_config(servers: list[McpServer]) -> dict[str, Any]:
    """Claude Code's ``--mcp-config`` file: ``{"mcpServers": {NAME: {...}}}``."""
    entries: dict[str, Any] = {}
    for s in servers:
        if s.transport == "stdio":
            entries[s.name] = {"type": "stdio", "command": s.command, "args": s.args}
        else:
            entry: dict[str, Any] = {"type": "http" if s.transport == "streamable-http" else "sse", "url": s.url}
            if s.headers:
                entry["headers"] = s.headers
            entries[s.name] = entry
    return {"mcpServers": entries}


def opencode_mcp_config(servers: list[McpServer]) -> dict[str, Any]:
    """OpenCode's ``mcp`` table: ``local`` (a command list) or ``remote`` (a URL, OAuth off as in Harbor)."""
    entries: dict[str, Any] = {}
    for s in servers:
        if s.transport == "stdio":
            entries[s.name] = {"type": "local", "command": [s.command, *s.args], "enabled": True}
        else:
            entry: dict[str, Any] = {"type": "remote", "url": s.url, "oauth": False, "enabled": True}
            if s.headers:
                entry["headers"] = s.headers
            entries[s.name] = entry
    return entries


def openhands_mcp_config(servers: list[McpServer]) -> dict[str, Any]:
    """The OpenHands SDK's ``Agent(mcp_config=...)``: a flat ``{NAME: server}`` dict, as Harbor's runner builds it."""
    entries: dict[str, Any] = {}
    for s in servers:
        if s.transport == "stdio":
            entries[s.name] = {"command": s.command, "args": s.args}
        else:
            entries[s.name] = {"url": s.url, "transport": s.transport}
    return entries


def mini_instruction(instruction: str, servers: list[McpServer]) -> str:
    """Harbor's mini-swe-agent has no MCP client: it appends the servers to the instruction, in these words."""
    if not servers:
        return instruction
    info = "\n\nMCP Servers:\nThe following MCP servers are available for this task.\n"
    for s in servers:
        if s.transport == "stdio":
            info += f"- {s.name}: stdio transport, command: {s.command} {' '.join(s.args)}\n"
        else:
            info += f"- {s.name}: {s.transport} transport, url: {s.url}\n"
    return instruction + info


async def run_setup(backend: Backend, sandbox: Sandbox, command: AgentCommand) -> None:
    """Runs ``command.setup`` in the sandbox (agent phase, the agent's user, no network); a failure
    is EnvSetupError with its output, so the trial ends env_setup_failed, never with a reward."""
    if not command.setup:
        return
    from services.sandbox.backends.base import ExecRequest, Phase

    request = ExecRequest(
        argv=command.setup,
        phase=Phase.AGENT,
        env={"PATH": dockerfile.DEFAULT_PATH, **sandbox.env, "HOME": str(sandbox.paths.home)},
        cwd=str(sandbox.paths.workdir),
        timeout_s=SETUP_TIMEOUT_S,
    )
    result = await backend.exec(sandbox, request, asyncio.Event())
    if result.exit_code != 0 or result.timed_out:
        output = result.output.decode(errors="replace").strip()[-800:]
        raise EnvSetupError(f"harness setup in the sandbox failed (exit {result.exit_code}): {output}")
