"""What a Harbor task gives its agent beyond the instruction: ``[environment] skills_dir``
and ``[[environment.mcp_servers]]``, read as Harbor reads them (``models/task/config.py``,
``MCPServerConfig``) and checked for what a harnessrl sandbox can reach.

- ``skills_dir`` is a directory *in the environment* (the image puts it there, usually a
  Dockerfile ``COPY``), as in Harbor; a relative path is relative to the working directory.
  Each harness adapter copies its contents, at the start of the agent phase and inside the
  sandbox, to where that harness reads skills (``harnesses/agent_extras.py``).
- An MCP server is ``stdio`` (``command`` + ``args``, started by the harness inside the
  sandbox) or ``sse`` / ``streamable-http`` (``url``; Harbor's default transport is ``sse``
  and ``http`` means ``streamable-http``). The agent phase reaches nothing but the model
  proxy (invariant 6), so a URL is accepted only when its host is the sandbox's own
  loopback or a service of the task's ``environment/docker-compose.yaml``.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

McpTransport = Literal["stdio", "sse", "streamable-http"]
COMPOSE_FILE = "environment/docker-compose.yaml"
LOOPBACK_NAMES = ("localhost",)
# Every harness names a server's tools after it (Claude Code mcp__NAME__tool, Codex's TOML
# table key, OpenCode's JSON key): one safe spelling for all of them.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_HEADER_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class McpServer(BaseModel):
    """One ``[[environment.mcp_servers]]`` entry (Harbor's ``MCPServerConfig``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    transport: McpTransport = "sse"
    url: str | None = None
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(f"must be letters, digits, '_' or '-' (at most 64), got {v!r}")
        return v

    @field_validator("transport", mode="before")
    @classmethod
    def _http_alias(cls, v: Any) -> Any:
        return "streamable-http" if v == "http" else v  # as Harbor

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_RE.match(name):
                raise ValueError(f"invalid HTTP header name {name!r}")
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name!r} must not contain newlines")
            if "${" in value:
                raise ValueError(
                    f"header {name!r}: '${{VAR}}' values are read from the host's environment in Harbor; "
                    "harnessrl never passes the worker's environment into a sandbox (it holds credentials)"
                )
        return headers

    @model_validator(mode="after")
    def _transport_fields(self) -> McpServer:
        if self.transport == "stdio":
            if not self.command:
                raise ValueError(f"server {self.name!r}: 'command' is required for transport 'stdio'")
            if self.url or self.headers:
                raise ValueError(f"server {self.name!r}: 'url' and 'headers' are for the HTTP transports only")
        else:
            if not self.url:
                raise ValueError(f"server {self.name!r}: 'url' is required for transport {self.transport!r}")
            if self.command or self.args:
                raise ValueError(f"server {self.name!r}: 'command' and 'args' are for transport 'stdio' only")
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"server {self.name!r}: url must be http(s)://HOST[:PORT]/..., got {self.url!r}")
        return self

    @property
    def host(self) -> str | None:
        return urlsplit(self.url).hostname if self.url else None


def check_servers(servers: list[McpServer]) -> list[McpServer]:
    """Names are unique (a harness's config is keyed by them)."""
    seen: set[str] = set()
    for server in servers:
        if server.name in seen:
            raise ValueError(f"two servers are named {server.name!r}; each needs its own name")
        seen.add(server.name)
    return servers


def check_skills_dir(value: str | None) -> str | None:
    if value is None or value == "":
        return None  # Harbor treats an empty value as unset
    if "\0" in value or "\n" in value:
        raise ValueError("must be a path (no NUL or newline)")
    return value


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def compose_services(root: Path) -> set[str]:
    """Service names of the task's compose file (none without one)."""
    path = root / COMPOSE_FILE
    if not path.is_file():
        return set()
    import yaml  # only for tasks with a compose file

    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"{COMPOSE_FILE} is not valid YAML: {e}") from e
    services = data.get("services") if isinstance(data, dict) else None
    return {str(name) for name in services} if isinstance(services, dict) else set()


def unreachable_servers(root: Path, servers: list[McpServer]) -> list[str]:
    """One line per URL server the agent phase could not reach, saying why."""
    lines = []
    services: set[str] | None = None
    for i, server in enumerate(servers):
        host = server.host
        if host is None or _is_loopback(host):
            continue
        if services is None:
            try:
                services = compose_services(root)
            except ValueError as e:
                return [f"environment.mcp_servers.{i} ({server.name!r}): {e}"]
        if host in services:
            continue
        lines.append(
            f"environment.mcp_servers.{i} ({server.name!r}): host {host!r} of {server.url!r} cannot be reached: the "
            "agent phase reaches only the model proxy (invariant 6); a URL server must run in the sandbox "
            f"(localhost) or as a service of {COMPOSE_FILE} (known: {sorted(services)})"
        )
    return lines
