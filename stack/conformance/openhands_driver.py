"""Runs the OpenHands SDK agent (terminal + file editor) against a base URL;
executed by the OpenHands venv's own Python (3.12), not the project's.

argv: base_url token model workdir task [condenser_max_size [task]]; a size > 0
adds the SDK's LLMSummarizingCondenser, which compacts the history past that many
events; ``task`` adds its task tool (blocking sub-agents, the built-in agents)."""

import sys

from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool
from pydantic import SecretStr

base_url, token, model, workdir, task = sys.argv[1:6]
max_size = int(sys.argv[6]) if len(sys.argv) > 6 else 0
with_task = len(sys.argv) > 7 and sys.argv[7] == "task"
llm = LLM(model=f"openai/{model}", base_url=base_url, api_key=SecretStr(token), usage_id="agent", num_retries=0)
kwargs = {}
if max_size > 0:
    from openhands.sdk.context.condenser import LLMSummarizingCondenser

    summarizer = llm.model_copy(update={"usage_id": "condenser"})
    kwargs["condenser"] = LLMSummarizingCondenser(llm=summarizer, max_size=max_size, keep_first=1)
tools = [Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name)]
if with_task:
    from openhands.tools.preset.default import register_builtins_agents
    from openhands.tools.task import TaskToolSet

    register_builtins_agents(enable_browser=False)
    tools.append(Tool(name=TaskToolSet.name))
agent = Agent(llm=llm, tools=tools, **kwargs)
conversation = Conversation(agent=agent, workspace=workdir, visualizer=None)
conversation.send_message(task)
conversation.run()
print("FINISHED", conversation.state.execution_status)
