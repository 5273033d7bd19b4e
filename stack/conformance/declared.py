"""Declared harnesses (TOML files, services/sandbox/harnesses/declared.py) in the conformance
matrix: their driver runs the adapter's own command, env and files on this host (HOME and the
working directory the scenario's, every other sandbox path a folder beside them), and their
scenarios come from the file's ``[conformance]`` table: a two-command tools run (list, then
write hello.txt) ended by a plain answer or the file's ``finish`` tool call; a delegation to its
sub-agent tool; a run whose 2,000-line output makes it compact under the settings of its
``[conformance.compaction]`` table (files written over its own, env added), checked for the
rewrite of main and, when its summary is a call of its own, for that side call."""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from stack.conformance.drivers import Driver, Target, run_process

if TYPE_CHECKING:
    from services.sandbox.harnesses.declared import DeclaredHarness
    from services.sandbox.harnesses.declared_spec import HarnessDeclaration

# The conformance task's own config (no skills, no MCP servers): any built-in task serves.
TASK_DIR = Path(__file__).resolve().parents[2] / "tasks" / "builtin" / "train" / "echo-00"
PROTOCOL_NAMES = {
    "openai-chat": "openai chat",
    "openai-responses": "openai responses",
    "anthropic": "anthropic messages",
    "gemini": "gemini",
}


class DeclaredDriver(Driver):
    """Runs a declared harness outside a sandbox, exactly as its adapter would inside one."""

    def __init__(self, adapter: DeclaredHarness) -> None:
        from services.sandbox.harnesses.declared import entry, install_dir

        self.adapter = adapter
        decl = adapter.declaration
        self.name = adapter.name
        self.protocol = PROTOCOL_NAMES[decl.harness.protocol]
        self.streaming = decl.harness.streaming
        self.binary = str(entry(decl).relative_to(install_dir(decl).parents[1]))

    def version(self) -> str:
        from services.sandbox.harnesses.declared import installed_version

        return installed_version(self.adapter.declaration) or "?"

    def run(self, t: Target, task: str, options: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
        from services.sandbox.common.paths import SandboxPaths
        from services.sandbox.harnesses import AgentContext
        from services.sandbox.harnesses.declared import write_files
        from services.sandbox.harnesses.declared_spec import render
        from services.sandbox.task.model import load_task

        side = t.home.parent / "sandbox"
        runtime, logs = side / "runtime", side / "logs-agent"
        for folder in (runtime, logs):
            folder.mkdir(parents=True, exist_ok=True)
        sandbox_paths = SandboxPaths(
            workdir=PurePosixPath(t.work),
            agent_logs=PurePosixPath(logs),
            runtime=PurePosixPath(runtime),
            home=PurePosixPath(t.home),
        )
        ctx = AgentContext(
            trial_id=f"{self.name}-conformance",
            task=load_task(TASK_DIR),
            instruction=task,
            model=t.model,
            max_turns=int(options.get("max_turns", 0)),
            base_url=t.base_url,
            token=t.token,
            options={},
            paths=sandbox_paths,
            home=t.home,
            runtime=runtime,
        )
        command = self.adapter.prepare(ctx)
        # a cell's own settings (the compaction cell's): files over the declared ones, env added
        values = self.adapter.values(ctx)
        write_files(t.home, options.get("files", []), values)
        cell_env = {k: render(v, values) for k, v in options.get("env", {}).items()}
        env = {"HOME": str(t.home), **command.env, **cell_env}
        return run_process(command.argv, t.work, env, timeout)


def declared_drivers() -> dict[str, Driver]:
    from services.sandbox.harnesses import HARNESSES
    from services.sandbox.harnesses.declared import DeclaredHarness

    return {n: DeclaredDriver(cls()) for n, cls in HARNESSES.items() if issubclass(cls, DeclaredHarness)}


def declared_scenarios(decl: HarnessDeclaration) -> dict[str, Any]:
    """The cells of a declared harness: ``tools`` from its [conformance] table, the others n/a
    with the file's reason (or that the file gives no scripted run for them)."""
    from stack.conformance.matrix import (
        COLUMNS,
        SUMMARY,
        Scenario,
        check_compaction,
        check_compaction_and_side_calls,
        check_sub_agent,
        check_tools_and_side_calls,
        done_file,
    )

    harness = decl.harness.name
    spec = decl.conformance
    if spec is None:
        reason = f"its file ({harness}) has no [conformance] table"
        return dict.fromkeys(COLUMNS, reason)

    def shell(command: str) -> dict[str, Any]:
        arguments = {spec.command_arg: [command] if spec.command_list else command, **spec.extra_args}
        return {"content": "Working on it.", "tool_calls": [{"name": spec.shell_tool, "arguments": arguments}]}

    last: dict[str, Any] = {"content": "Created hello.txt containing hello."}
    if spec.finish is not None:
        last = {"content": "Done.", "tool_calls": [{"name": spec.finish.name, "arguments": spec.finish.arguments}]}
    threads: dict[str, list[dict[str, Any]]] = {"main": [shell("ls -la"), shell("echo hello > hello.txt"), last]}
    if spec.side_thread_reply is not None:
        threads["*"] = [{"content": spec.side_thread_reply}]
    cells: dict[str, Any] = {"tools": Scenario(threads, done_file, script_extra={"chunk_tokens": 3}, min_main_turns=3)}
    for column in COLUMNS[1:]:
        cells[column] = spec.not_applicable.get(column, f"its file ({harness}) scripts no {column} run yet")
    if spec.sub_agent is not None:
        # main delegates, the sub-agent writes the file and answers, main answers
        delegate = {"content": "Delegating.", "tool_calls": [spec.sub_agent.model_dump()]}
        sub_last = last
        if spec.sub_agent_finish is not None:
            sub_last = {"content": "Done.", "tool_calls": [spec.sub_agent_finish.model_dump()]}
        sub = {"main": [delegate, last], "subagent-1": [shell("echo hello > hello.txt"), sub_last]}
        if spec.side_thread_reply is not None:
            sub["*"] = threads["*"]
        cells["sub-agent"] = Scenario(sub, check_sub_agent, min_main_turns=2)
    compaction = spec.compaction
    if compaction is not None:
        # the output (~9k tokens) pushes the context past the cell's threshold; off main, the policy summarises
        compact = {"main": [shell("seq 1 2000"), shell("echo hello > hello.txt"), last], "*": [{"content": SUMMARY}]}
        options = {"files": compaction.files, "env": compaction.env}
        if compaction.main_goes_on:
            cells["compaction"] = Scenario(compact, check_compaction, options=options)
        if compaction.side_call:  # the compaction run again, checked for its summary call
            check = check_compaction_and_side_calls if compaction.main_goes_on else check_tools_and_side_calls
            cells["side calls"] = Scenario(compact, check, options=options)
    return cells
