"""Runs inside the sandbox with the OpenHands SDK's venv: the SDK's own Agent
with its terminal and file-editor tools, pointed at the trial's proxy. Only
public SDK APIs are used; configuration comes from HARNESSRL_* variables."""

import os
import sys

from openhands.sdk import LLM, Agent, Conversation, Tool
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
    agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name)])
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
