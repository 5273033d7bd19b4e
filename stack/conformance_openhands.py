"""Runs the OpenHands SDK agent (terminal + file editor) against a base URL;
executed by the OpenHands venv's own Python (3.12), not the project's."""

import sys

from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool
from pydantic import SecretStr

base_url, token, model, workdir, task = sys.argv[1:6]
llm = LLM(model=f"openai/{model}", base_url=base_url, api_key=SecretStr(token), usage_id="agent", num_retries=0)
agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name)])
conversation = Conversation(agent=agent, workspace=workdir, visualizer=None)
conversation.send_message(task)
conversation.run()
print("FINISHED", conversation.state.execution_status)
