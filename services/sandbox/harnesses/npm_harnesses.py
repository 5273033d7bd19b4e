"""Harnesses installed with npm under ``tools/npm`` (Claude Code, OpenCode,
Codex). Each is pointed at the trial's proxy URL with the trial token through
its own documented settings, with telemetry and update checks off."""

from __future__ import annotations

import json
from pathlib import Path

from harnessrl import paths
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.harnesses import agent_extras as extras
from services.sandbox.harnesses.base import AgentCommand, AgentContext, HarnessAdapter, write_text


def npm_prefix() -> Path:
    return paths.tools_dir() / "npm"


def _bin(name: str) -> Path:
    return npm_prefix() / "node_modules" / ".bin" / name


def node_runtime() -> Path:
    """The self-contained Node.js setup bundles (binary, its libraries, its loader):
    a harness launched by a .js entry runs on it in any task image."""
    return paths.tools_dir() / "runtime" / "node"


def ripgrep_runtime() -> Path:
    """The self-contained ripgrep setup bundles (Debian's ``rg``, its libraries, its loader)."""
    return paths.tools_dir() / "runtime" / "ripgrep"


# Where OpenCode 1.18 looks for rg when none is on PATH, before it downloads one (its
# Global.Path.bin, $XDG_CACHE_HOME/opencode/bin); relative to the trial's HOME (xdg_env).
OPENCODE_RG = ".cache/opencode/bin/rg"


def _model(ctx: AgentContext) -> str:
    return ctx.model or "harnessrl-policy"


class _NpmHarness(HarnessAdapter):
    binary: str

    def install_paths(self) -> list[Path]:
        return [npm_prefix(), node_runtime()] if self._on_node() else [npm_prefix()]

    def check_installed(self) -> None:
        super().check_installed()
        if not _bin(self.binary).exists():
            from services.sandbox.common.errors import EnvSetupError

            raise EnvSetupError(
                f"harness {self.name!r}: {_bin(self.binary)} not found; run `harnessrl harness install {self.name}`"
            )

    def _on_node(self) -> bool:
        """Whether the entry is a node script (``#!/usr/bin/env node``) rather than a native binary."""
        return _bin(self.binary).resolve().suffix in (".js", ".mjs", ".cjs")

    def launcher(self) -> list[str]:
        """The argv prefix that starts the harness: its entry, run by the bundled
        node when it is a script (a task image need not have node)."""
        entry = str(_bin(self.binary))
        return [str(node_runtime() / "bin" / "node"), entry] if self._on_node() else [entry]

    def xdg_env(self, ctx: AgentContext) -> dict[str, str]:
        home = str(ctx.paths.home)
        return {
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_STATE_HOME": f"{home}/.local/state",
            "NO_UPDATE_NOTIFIER": "1",
            "NPM_CONFIG_UPDATE_NOTIFIER": "false",
        }


class ClaudeCode(_NpmHarness):
    name = "claude-code"
    binary = "claude"

    def prepare(self, ctx: AgentContext) -> AgentCommand:
        env = {
            **self.xdg_env(ctx),
            "ANTHROPIC_BASE_URL": ctx.proxy_root or "",
            "ANTHROPIC_API_KEY": ctx.token or "",
            # Side calls (titles, summaries) use the "small fast" model: the policy too.
            "ANTHROPIC_SMALL_FAST_MODEL": _model(ctx),
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": _model(ctx),
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_BUG_COMMAND": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "IS_SANDBOX": "1",
        }
        argv = [*self.launcher(), "-p", ctx.instruction, "--output-format", "json", "--model", _model(ctx)]
        argv += ["--dangerously-skip-permissions"]
        if ctx.max_turns:
            argv += ["--max-turns", str(ctx.max_turns)]
        servers = extras.mcp_servers(ctx)
        if servers:
            write_text(ctx.runtime / "mcp.json", json.dumps(extras.claude_mcp_config(servers), indent=1))
            argv += ["--mcp-config", str(ctx.paths.runtime / "mcp.json")]
        # Skills: its user skills folder (Claude's config dir is ~/.claude here).
        return AgentCommand(argv=argv, env=env, setup=extras.copy_skills(ctx, ".claude/skills"))

    def log_paths(self) -> list[str]:
        return [".claude/projects"]


class OpenCode(_NpmHarness):
    """The turn limit is the proxy's (``max_turns`` at registration): OpenCode has no CLI flag for it."""

    name = "opencode"
    binary = "opencode"

    def install_paths(self) -> list[Path]:
        return [*super().install_paths(), ripgrep_runtime()]

    def check_installed(self) -> None:
        rg = ripgrep_runtime() / "bin" / "rg"
        if not rg.is_file():
            from services.sandbox.common.errors import EnvSetupError

            raise EnvSetupError(
                f"harness 'opencode': ripgrep {rg} not found (its grep, glob and skill tools run rg, and it "
                "cannot download one in a sandbox); run scripts/setup (Debian package ripgrep, bundled by "
                "scripts/setup_harnesses.sh)"
            )
        super().check_installed()

    def prepare(self, ctx: AgentContext) -> AgentCommand:
        # Its search tools run rg: the bundled one, where it looks before downloading one.
        rg = ctx.home / OPENCODE_RG
        rg.parent.mkdir(parents=True, exist_ok=True)
        rg.unlink(missing_ok=True)
        rg.symlink_to(ripgrep_runtime() / "bin" / "rg")
        model = _model(ctx)
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "harnessrl": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "harnessrl",
                    "options": {"baseURL": ctx.base_url, "apiKey": ctx.token},
                    "models": {model: {"name": model}},
                }
            },
            "model": f"harnessrl/{model}",
            "autoupdate": False,
            "share": "disabled",
        }
        servers = extras.mcp_servers(ctx)
        if servers:
            config["mcp"] = extras.opencode_mcp_config(servers)
        write_text(ctx.runtime / "opencode.json", json.dumps(config, indent=1))
        env = {
            **self.xdg_env(ctx),
            "OPENCODE_CONFIG": str(ctx.paths.runtime / "opencode.json"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
        # Skills: its global skills folder under XDG_CONFIG_HOME.
        setup = extras.copy_skills(ctx, ".config/opencode/skills")
        return AgentCommand(argv=[*self.launcher(), "run", ctx.instruction], env=env, setup=setup)

    def log_paths(self) -> list[str]:
        return [".local/share/opencode"]


# Seen with codex-cli 0.171: Codex starts the servers of [mcp_servers.NAME] and offers their
# tools as a Responses 'namespace' tool ({"type": "namespace", "name": "mcp__NAME", "tools": [...]}),
# which the proxy offers to the model as mcp__NAME__TOOL and answers as (namespace, name)
# (services/proxy/responses/tools.py). Its MCP client speaks stdio and streamable HTTP, not sse.
CODEX_MCP_SSE_REFUSAL = "Codex's MCP client speaks stdio and streamable HTTP only"


def _toml_str(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c >= " " or c == "\t" else f"\\u{ord(c):04x}" for c in escaped) + '"'


def codex_mcp_toml(ctx: AgentContext) -> list[str]:
    """Codex's ``[mcp_servers.NAME]`` tables of config.toml (stdio: command/args; HTTP: url/http_headers);
    an sse server is refused by name."""
    lines: list[str] = []
    for s in extras.mcp_servers(ctx):
        if s.transport == "sse":
            raise EnvSetupError(
                f"harness 'codex' cannot reach MCP server {s.name!r} (task.toml environment.mcp_servers "
                f"transport 'sse'): {CODEX_MCP_SSE_REFUSAL}"
            )
        lines.append(f"[mcp_servers.{_toml_str(s.name)}]")
        if s.transport == "stdio":
            lines.append(f"command = {_toml_str(s.command or '')}")
            lines.append("args = [" + ", ".join(_toml_str(a) for a in s.args) + "]")
        else:
            lines.append(f"url = {_toml_str(s.url or '')}")
            if s.headers:
                pairs = ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in s.headers.items())
                lines.append(f"http_headers = {{ {pairs} }}")
        lines.append("")
    return lines


class Codex(_NpmHarness):
    """Codex speaks only the Responses API; the turn limit is the proxy's."""

    name = "codex"
    binary = "codex"

    def prepare(self, ctx: AgentContext) -> AgentCommand:
        mcp = codex_mcp_toml(ctx)
        codex_home = ctx.home / ".codex"
        config = "\n".join(
            [
                f'model = "{_model(ctx)}"',
                'model_provider = "harnessrl"',
                'approval_policy = "never"',
                'sandbox_mode = "danger-full-access"',
                "check_for_update_on_startup = false",
                "",
                "[analytics]",
                "enabled = false",
                "",
                "[model_providers.harnessrl]",
                'name = "harnessrl"',
                f'base_url = "{ctx.base_url}"',
                'wire_api = "responses"',
                'env_key = "HARNESSRL_API_KEY"',
                "",
                *mcp,
            ]
        )
        write_text(codex_home / "config.toml", config)
        env = {
            **self.xdg_env(ctx),
            "CODEX_HOME": str(ctx.paths.home / ".codex"),
            "HARNESSRL_API_KEY": ctx.token or "",
        }
        argv = [*self.launcher(), "exec", "--skip-git-repo-check"]
        argv += ["--dangerously-bypass-approvals-and-sandbox", ctx.instruction]
        # Skills: the user skills folder Harbor installs them to.
        return AgentCommand(argv=argv, env=env, setup=extras.copy_skills(ctx, ".agents/skills"))

    def log_paths(self) -> list[str]:
        return [".codex/sessions"]
