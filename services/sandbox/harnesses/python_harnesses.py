"""Harnesses installed as Python venvs under ``tools/`` (mini-swe-agent,
OpenHands SDK). A venv needs its base interpreter too, so both are mounted."""

from __future__ import annotations

import json
from pathlib import Path

from harnessrl import paths
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.harnesses import agent_extras as extras
from services.sandbox.harnesses.base import AgentCommand, AgentContext, HarnessAdapter, write_text

OPENHANDS_DRIVER = Path(__file__).with_name("openhands_driver.py")
OPENHANDS_SKILLS = ".agents/skills"  # HOME-relative; the SDK's first user skills folder
# mini-swe-agent configs by the harness option ``config`` (None: the package's own mini.yaml).
MINI_CONFIGS: dict[str, Path | None] = {
    "default": None,
    "compact": Path(__file__).with_name("mini_compact.yaml"),
    "tools": Path(__file__).with_name("mini_tools.yaml"),
}


def venv_mounts(venv: Path) -> list[Path]:
    """The venv and the prefix of the interpreter it was made from (``home`` in pyvenv.cfg)."""
    mounts = [venv]
    cfg = venv / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                mounts.append(Path(value.strip()).parent)
    return mounts


def _model(ctx: AgentContext) -> str:
    return ctx.model or "harnessrl-policy"


class MiniSweAgent(HarnessAdapter):
    name = "mini-swe-agent"

    @property
    def venv(self) -> Path:
        return paths.tools_dir() / "mini-swe-agent"

    def install_paths(self) -> list[Path]:
        return venv_mounts(self.venv)

    def _config(self, ctx: AgentContext) -> str:
        """Option ``config``: ``default`` (mini-swe-agent's mini.yaml), ``compact``
        (``mini_compact.yaml``: short, text-based actions, for small models) or ``tools``
        (``mini_tools.yaml``: its tool-calling model class and ``bash`` tool, short)."""
        choice = ctx.options.get("config", "default")
        if choice not in MINI_CONFIGS:
            raise EnvSetupError(f"harness mini-swe-agent: unknown config {choice!r}; valid: {sorted(MINI_CONFIGS)}")
        source = MINI_CONFIGS[choice]
        if source is None:
            return "mini.yaml"
        write_text(ctx.runtime / source.name, source.read_text())
        return str(ctx.paths.runtime / source.name)

    def prepare(self, ctx: AgentContext) -> AgentCommand:
        extras.refuse(self.name, ctx, skills="mini-swe-agent reads no skills (Harbor refuses it too)")
        extras.refuse_headers(self.name, ctx)
        config_dir = ctx.paths.home / ".config" / "mini-swe-agent"
        # It has no MCP client: Harbor lists the task's servers in the instruction, and so do we.
        instruction = extras.mini_instruction(ctx.instruction, extras.mcp_servers(ctx))
        argv = [str(self.venv / "bin" / "mini"), "-m", f"openai/{_model(ctx)}", "-t", instruction]
        argv += ["--yolo", "--exit-immediately", "-c", self._config(ctx)]
        argv += ["-c", f"model.model_kwargs.api_base={ctx.base_url}", "-c", f"model.model_kwargs.api_key={ctx.token}"]
        argv += ["-c", f"environment.cwd={ctx.paths.workdir}"]
        if ctx.max_turns:
            argv += ["-c", f"agent.step_limit={ctx.max_turns}"]
        argv += ["-o", str(ctx.paths.agent_logs / "trajectory.json")]
        env = {
            "MSWEA_CONFIGURED": "true",
            "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir),
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
        }
        return AgentCommand(argv=argv, env=env, stdin=b"")


class OpenHandsSdk(HarnessAdapter):
    """Runs the SDK's own Agent and Conversation through a small driver script
    (the SDK is a library, it has no CLI); nothing in the SDK is changed."""

    name = "openhands-sdk"

    @property
    def venv(self) -> Path:
        return paths.tools_dir() / "openhands"

    def install_paths(self) -> list[Path]:
        return venv_mounts(self.venv)

    def prepare(self, ctx: AgentContext) -> AgentCommand:
        extras.refuse_headers(self.name, ctx)
        write_text(ctx.runtime / "openhands_driver.py", OPENHANDS_DRIVER.read_text())
        argv = [str(self.venv / "bin" / "python"), str(ctx.paths.runtime / "openhands_driver.py")]
        env = {
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "HARNESSRL_MODEL": f"openai/{_model(ctx)}",
            "HARNESSRL_BASE_URL": ctx.base_url or "",
            "HARNESSRL_API_KEY": ctx.token or "",
            "HARNESSRL_INSTRUCTION": ctx.instruction,
            "HARNESSRL_WORKDIR": str(ctx.paths.workdir),
            "HARNESSRL_MAX_TURNS": str(ctx.max_turns or 100),
            "HARNESSRL_LOG_DIR": str(ctx.paths.agent_logs),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        servers = extras.mcp_servers(ctx)
        if servers:
            env["HARNESSRL_MCP_CONFIG"] = json.dumps(extras.openhands_mcp_config(servers))
        # Skills: the SDK's user skills folder, loaded by the driver with the SDK's own loader.
        setup = extras.copy_skills(ctx, OPENHANDS_SKILLS)
        if setup is not None:
            env["HARNESSRL_SKILLS_DIR"] = str(ctx.paths.home / OPENHANDS_SKILLS)
        return AgentCommand(argv=argv, env=env, setup=setup)
