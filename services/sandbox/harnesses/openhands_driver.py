"""Runs inside the sandbox with the OpenHands SDK's venv: the SDK's own Agent
with its terminal and file-editor tools, pointed at the trial's proxy. Only
public SDK APIs are used; configuration comes from HARNESSRL_* variables."""

import json
import os
import sys

from openhands.sdk import LLM, Agent, AgentContext, Conversation, Tool
from openhands.sdk.skills import load_skills_from_dir
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool
from pydantic import SecretStr


def main() -> int:
    llm = LLM(
        model=os.environ["HARNESSRL_MODEL"],
        base_url=os.environ["HARNESSRL_BASE_URL"],
        api_key=SecretStr(os.environ["HARNESSRL_API_KEY"]),
        usage_id="agent",
    )
    tools = [Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name)]
    extra: dict = {}
    if os.environ.get("HARNESSRL_SKILLS_DIR"):  # the task's skills_dir, copied there
        loaded = load_skills_from_dir(os.environ["HARNESSRL_SKILLS_DIR"])
        extra["agent_context"] = AgentContext(skills=[s for group in loaded for s in group.values()])
    if os.environ.get("HARNESSRL_MCP_CONFIG"):  # the task's MCP servers, {name: server}
        extra["mcp_config"] = json.loads(os.environ["HARNESSRL_MCP_CONFIG"])
    agent = Agent(llm=llm, tools=tools, **extra)
    conversation = Conversation(
        agent=agent,
        workspace=os.environ["HARNESSRL_WORKDIR"],
        max_iteration_per_run=int(os.environ["HARNESSRL_MAX_TURNS"]),
        persistence_dir=os.environ.get("HARNESSRL_LOG_DIR"),
    )
    conversation.send_message(os.environ["HARNESSRL_INSTRUCTION"])
    conversation.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
