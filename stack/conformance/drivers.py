"""How each real harness is pointed at a proxy trial and run, unmodified:
its binary under ``tools_dir()``, its version, its wire protocol,
and the knobs a scenario turns (tools allowed, a small compaction window)."""

from __future__ import annotations

import json
import os
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.paths import tools_dir

# Run as a script by the OpenHands venv's Python: its folder is first on sys.path there, so the
# file must not be named after a package it imports (``openhands.py`` shadowed ``openhands``).
OPENHANDS_DRIVER = Path(__file__).with_name("openhands_driver.py")


@dataclass(frozen=True)
class Target:
    """One trial a harness is run against."""

    base_url: str  # OpenAI-style, ends in /v1
    token: str
    model: str
    work: Path  # the harness's working directory
    home: Path  # its own HOME


def run_process(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    return subprocess.run(
        cmd, cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def _package_version(rel: str) -> str:
    path = tools_dir() / rel / "package.json"
    return str(json.loads(path.read_text())["version"]) if path.exists() else "?"


def _dist_version(venv: str, dist: str) -> str:
    found = sorted((tools_dir() / venv).glob(f"lib/python*/site-packages/{dist}-*.dist-info"))
    return found[-1].name.removeprefix(f"{dist}-").removesuffix(".dist-info") if found else "?"


class Driver(ABC):
    name: str
    protocol: str  # the wire protocol the harness speaks to the proxy
    streaming: bool
    binary: str  # relative to tools_dir()

    @property
    def path(self) -> Path:
        return tools_dir() / self.binary

    def installed(self) -> bool:
        return self.path.exists()

    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def run(self, t: Target, task: str, options: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
        """Runs the harness on ``task`` against ``t``; ``options`` are scenario knobs."""


class ClaudeCode(Driver):
    name, protocol, streaming, binary = "claude-code", "anthropic messages", True, "npm/node_modules/.bin/claude"

    def version(self) -> str:
        return _package_version("npm/node_modules/@anthropic-ai/claude-code")

    def run(self, t: Target, task: str, options: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
        env = {
            "HOME": str(t.home),
            "ANTHROPIC_BASE_URL": t.base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": t.token,
            "ANTHROPIC_SMALL_FAST_MODEL": t.model,
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            **options.get("env", {}),
        }
        cmd = [str(self.path), "-p", task, "--output-format", "json", "--model", t.model]
        for name in options.get("allowed_tools", ("Bash",)):
            cmd += ["--allowedTools", name]
        return run_process(cmd, t.work, env, timeout)


class OpenCode(Driver):
    name, protocol, streaming, binary = "opencode", "openai chat", True, "npm/node_modules/.bin/opencode"

    def version(self) -> str:
        return _package_version("npm/node_modules/opencode-ai")

    def run(self, t: Target, task: str, options: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "name": "hrl",
            "options": {"baseURL": t.base_url, "apiKey": t.token},
        }
        model: dict[str, Any] = {"name": t.model}
        if "context_limit" in options:  # OpenCode compacts when a turn nears limit.context - limit.output
            model["limit"] = {"context": options["context_limit"], "output": 4096}
        config = {
            "autoupdate": False,
            "share": "disabled",
            "model": f"hrl/{t.model}",
            "provider": {"hrl": {**provider, "models": {t.model: model}}},
        }
        env = {
            "HOME": str(t.home),
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            **{f"XDG_{k}_HOME": str(t.home / k.lower()) for k in ("CONFIG", "DATA", "CACHE", "STATE")},
        }
        return run_process([str(self.path), "run", task], t.work, env, timeout)


class Codex(Driver):
    name, protocol, streaming, binary = "codex", "openai responses", True, "npm/node_modules/.bin/codex"

    def version(self) -> str:
        return _package_version("npm/node_modules/@openai/codex")

    def run(self, t: Target, task: str, options: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
        config = f'model = "{t.model}"\nmodel_provider = "hrl"\n'
        if "auto_compact_token_limit" in options:  # Codex compacts locally past this many tokens
            limit = int(options["auto_compact_token_limit"])
            config += f"model_context_window = 200000\nmodel_auto_compact_token_limit = {limit}\n"
        config += f'\n[model_providers.hrl]\nname = "hrl"\nbase_url = "{t.base_url}"\nwire_api = "responses"\n'
        config += 'env_key = "HRL_API_KEY"\n'
        if options.get("websockets"):  # the Responses WebSocket: previous_response_id, only new input
            config += "supports_websockets = true\n"
        (t.home / ".codex").mkdir(exist_ok=True)
        (t.home / ".codex/config.toml").write_text(config)
        cmd = [str(self.path), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", task]
        return run_process(cmd, t.work, {"HOME": str(t.home), "HRL_API_KEY": t.token}, timeout)


class MiniSweAgent(Driver):
    name, protocol, streaming, binary = "mini-swe-agent", "openai chat", False, "mini-swe-agent/bin/mini"

    def version(self) -> str:
        return _dist_version("mini-swe-agent", "mini_swe_agent")

    def run(self, t: Target, task: str, options: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
        env = {
            "HOME": str(t.home),
            "MSWEA_CONFIGURED": "true",
            "MSWEA_GLOBAL_CONFIG_DIR": str(t.home / "mswea"),
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        cmd = [str(self.path), "-m", f"openai/{t.model}", "-t", task, "--yolo", "--exit-immediately", "-c", "mini.yaml"]
        cmd += ["-c", f"model.model_kwargs.api_base={t.base_url}", "-c", f"model.model_kwargs.api_key={t.token}"]
        cmd += ["-c", f"environment.cwd={t.work}", "-o", str(t.home / "traj.json")]
        return run_process(cmd, t.work, env, timeout)


class OpenHandsSdk(Driver):
    name, protocol, streaming, binary = "openhands-sdk", "openai chat", False, "openhands/bin/python"

    def version(self) -> str:
        return _dist_version("openhands", "openhands_sdk")

    def run(self, t: Target, task: str, options: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.path), str(OPENHANDS_DRIVER), t.base_url, t.token, t.model, str(t.work), task]
        cmd.append(str(options.get("condenser_max_size", 0)))
        if options.get("task_tool"):
            cmd.append("task")
        env = {"HOME": str(t.home), "OPENHANDS_SUPPRESS_BANNER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        return run_process(cmd, t.work, env, timeout)


DRIVERS: dict[str, Driver] = {d.name: d for d in (ClaudeCode(), OpenCode(), Codex(), MiniSweAgent(), OpenHandsSdk())}
