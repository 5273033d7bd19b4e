"""Harnesses that need no model: ``shell`` (runs a given script as the agent;
the red-team suite and the benchmark use it), ``oracle`` (the task's
solution) and ``nop`` (does nothing; must score 0)."""

from __future__ import annotations

from pathlib import Path

from services.sandbox.common.errors import EnvSetupError
from services.sandbox.harnesses.base import AgentCommand, AgentContext, HarnessAdapter, ModelAccess, write_text


class ShellHarness(HarnessAdapter):
    """Options: ``script`` (the script text) or ``script_path`` (a host file). The
    script gets the instruction in ``$HARNESSRL_INSTRUCTION`` and, with a proxy,
    ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``."""

    name = "shell"
    model_access = ModelAccess.OPTIONAL

    def prepare(self, ctx: AgentContext) -> AgentCommand:
        script = ctx.options.get("script")
        if script is None and "script_path" in ctx.options:
            try:
                script = Path(ctx.options["script_path"]).read_text()
            except OSError as e:
                raise EnvSetupError(f"harness shell: cannot read script_path: {e}") from e
        if script is None:
            raise EnvSetupError("harness shell: needs the 'script' or 'script_path' option (--agent-script FILE)")
        write_text(ctx.runtime / "agent.sh", script, 0o555)
        env = {"HARNESSRL_INSTRUCTION": ctx.instruction, "HARNESSRL_TRIAL_ID": ctx.trial_id}
        if ctx.base_url and ctx.token:
            env |= {
                "OPENAI_BASE_URL": ctx.base_url,
                "OPENAI_API_KEY": ctx.token,
                "ANTHROPIC_BASE_URL": ctx.proxy_root or "",
                "ANTHROPIC_API_KEY": ctx.token,
                "HARNESSRL_MODEL": ctx.model,
            }
        return AgentCommand(argv=["/bin/bash", str(ctx.paths.runtime / "agent.sh")], env=env)


class OracleHarness(HarnessAdapter):
    """Runs ``solution/solve.sh``, mounted at /solution for this phase only."""

    name = "oracle"
    model_access = ModelAccess.NONE

    def prepare(self, ctx: AgentContext) -> AgentCommand:
        solve = ctx.task.solution_dir / "solve.sh"
        if not solve.is_file():
            raise EnvSetupError(f"task {ctx.task.task_id}: missing solution/solve.sh (needed by the oracle)")
        return AgentCommand(
            argv=["/bin/bash", str(ctx.paths.solution / "solve.sh")],
            env=dict(ctx.task.config.solution.env),
            uploads=[(ctx.task.solution_dir, ctx.paths.solution)],
        )


class NopHarness(HarnessAdapter):
    name = "nop"
    model_access = ModelAccess.NONE

    def prepare(self, ctx: AgentContext) -> AgentCommand:
        return AgentCommand(argv=["/bin/true"])
