"""Registry of harness adapters by name; an unknown name lists the valid ones. The built-in
adapters (Python), then the declared ones (TOML files: ``declared.py``)."""

from __future__ import annotations

from services.sandbox.common.errors import UnknownName
from services.sandbox.harnesses.base import AgentCommand, AgentContext, HarnessAdapter, ModelAccess
from services.sandbox.harnesses.builtin import NopHarness, OracleHarness, ShellHarness
from services.sandbox.harnesses.declared import declared_harnesses
from services.sandbox.harnesses.npm_harnesses import ClaudeCode, Codex, OpenCode
from services.sandbox.harnesses.python_harnesses import MiniSweAgent, OpenHandsSdk

BUILTIN: dict[str, type[HarnessAdapter]] = {
    cls.name: cls
    for cls in (ClaudeCode, OpenCode, Codex, MiniSweAgent, OpenHandsSdk, ShellHarness, OracleHarness, NopHarness)
}
HARNESSES: dict[str, type[HarnessAdapter]] = {**BUILTIN, **declared_harnesses(frozenset(BUILTIN))}


def get_harness(name: str) -> HarnessAdapter:
    try:
        return HARNESSES[name]()
    except KeyError:
        raise UnknownName(f"unknown harness {name!r}; valid harnesses: {sorted(HARNESSES)}") from None


__all__ = ["BUILTIN", "HARNESSES", "AgentCommand", "AgentContext", "HarnessAdapter", "ModelAccess", "get_harness"]
