"""verl's integration, one room: the agent loop verl's trainers run (``agent_loop``), its
engine adapter and in-process gateway (``engine``), the rows it hands verl (``outputs``),
the advantage and batch hooks verl loads by module name (``hooks``), the address rules of a
cluster (``address``), the checks run before a run (``checks``) and ``harnessrl verl
prepare`` (``prepare``). The YAML verl reads lies beside them. Names verl's configs use stay
stable: ``stack.verl_agent_loop.HarnessAgentLoop`` and ``stack.verl_hooks`` are kept as
re-exports of ``agent_loop`` and ``hooks``."""
