"""Codex 0.171's sub-agent tools reach the policy and work through the proxy: Codex
offers them as the Responses namespace ``multi_agent_v1`` (on by default: the
deprecated-but-enabled ``multi_agent`` feature, no flag needed), the proxy offers
``multi_agent_v1__spawn_agent`` to the model, and the model's call of it, answered as
(``spawn_agent``, ``multi_agent_v1``), makes real Codex spawn a sub-agent whose own
request (its task as the last user message) reaches the policy.

The capture files the sub-agent under its own trainable ``subagent-1`` thread, though
its requests start with main's first message under main's instructions: Codex names
each agent thread in ``client_metadata["x-codex-turn-metadata"]`` (thread_id,
thread_source "subagent"), and that identity decides the thread (capture/state.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harnessrl.paths import default_model_dir
from stack.conformance.drivers import DRIVERS
from stack.conformance.matrix import Outcome, Scenario, run_scenario

pytestmark = pytest.mark.harness
TASK = "Write hello.txt containing hello, then report"
SPAWN = {
    "content": "Delegating.",
    "tool_calls": [{"name": "multi_agent_v1__spawn_agent", "arguments": {"message": TASK}}],
}
# Enough turns for main and the sub-agent whichever thread the capture files the sub-agent under.
THREADS: dict[str, list[dict[str, Any]]] = {
    "main": [SPAWN, {"content": "Done."}, {"content": "Done."}],
    "subagent-1": [{"content": "Sub-agent done."}],
    "*": [{"content": "Title"}],
}


def test_the_policy_spawns_a_codex_sub_agent_through_the_namespaced_tool(tmp_path: Path) -> None:
    driver = DRIVERS["codex"]
    if not driver.installed():
        pytest.skip(f"codex is not installed ({driver.path}); scripts/setup installs it")
    from services.proxy.chat.tokenizer import Tokenizer  # loading it costs a second

    seen: list[Outcome] = []
    run_scenario(driver, Scenario(THREADS, seen.append), tmp_path)
    outcome = seen[0]
    assert outcome.proc.returncode == 0, outcome.proc.stderr[-3000:]
    assert outcome.summary["refused_requests"] == 0 and outcome.summary["proxy_errors"] == 0, outcome.summary
    tokenizer = Tokenizer(default_model_dir())
    prompts = [tokenizer.decode(g["prompt_ids"], skip_special_tokens=False) for g in outcome.engine_log]
    assert '"name": "multi_agent_v1__spawn_agent"' in prompts[0], "spawn_agent was not offered"
    spawned = [p for p in prompts if p.endswith(f"<|im_start|>user\n{TASK}<|im_end|>\n<|im_start|>assistant\n")]
    assert spawned, "no request of the spawned sub-agent (its task last) reached the policy"
    # The sub-agent's own tools: Codex gives it no multi_agent_v1 namespace of its own.
    assert "multi_agent_v1__spawn_agent" not in spawned[0]
    threads = outcome.threads()
    sub = threads.get("subagent-1")
    assert sub is not None and sub["kind"] == "subagent" and sub["trainable"], threads
    assert {n for n, t in threads.items() if t["kind"] != "side"} == {"main", "subagent-1"}, threads
    assert outcome.of("main") and outcome.of("subagent-1"), outcome.segments
