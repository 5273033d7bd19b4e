"""The module name verl's configs give our agent loop (``_target_:
stack.verl_agent_loop.HarnessAgentLoop`` in users' agent-loop YAML): kept stable; the loop
lives in ``stack/verl/agent_loop.py``."""

from stack.verl.agent_loop import AGENT_NAME, HarnessAgentLoop

__all__ = ["AGENT_NAME", "HarnessAgentLoop"]
