"""The "verl node" of ``test_verl_netns.py``, run inside its own network namespace:
verl's agent-loop build (Hydra, ``stack/verl/agent_loops.yaml``) with the sandbox (and
so the proxy) on the other namespace's address, then the worker's gateway as
``HarnessAgentLoop.run`` starts it. Prints one JSON line (the refusals of the loopback
settings, the gateway's target), serves until a line arrives on stdin, then prints the
request ids verl's server manager was called with and stops.

``python -m tests.integration.verl_netns_gateway SANDBOX_HOST:PORT``
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from stack.verl import agent_loop as val
from tests.verl_support import FakeServerManager, agent_loop


def build(manager: FakeServerManager, tokenizer: Any, **env: str) -> Any:
    """The loop as verl's worker builds it, with these HARNESSRL_VERL_GATEWAY_* variables."""
    for key in ("BIND", "ADDRESS"):
        os.environ.pop(f"HARNESSRL_VERL_GATEWAY_{key}", None)
    os.environ.update({f"HARNESSRL_VERL_GATEWAY_{k}": v for k, v in env.items()})
    return agent_loop(manager, tokenizer, 64, 8, max_model_len=4096)


def refusal(tokenizer: Any, **env: str) -> str:
    from hydra.errors import InstantiationException

    try:
        build(FakeServerManager(), tokenizer, **env)
    except InstantiationException as e:  # Hydra wraps the loop's error: its message is what verl's log shows
        return f"{type(e).__name__}: {e}"
    return ""


async def main(sandbox_target: str) -> None:
    from transformers import AutoTokenizer

    from harnessrl import paths

    os.environ["HARNESSRL_SANDBOX_TARGET"] = os.environ["HARNESSRL_CAPTURE_TARGET"] = sandbox_target
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    refused = {
        "default_bind": refusal(tokenizer),
        "address_127.0.1.1": refusal(tokenizer, BIND="0.0.0.0", ADDRESS="127.0.1.1"),
        "address_localhost": refusal(tokenizer, BIND="0.0.0.0", ADDRESS="localhost"),
    }
    manager = FakeServerManager()
    loop = build(manager, tokenizer, BIND="0.0.0.0")
    target, _ = await val._GATEWAY.ensure(
        manager, len(tokenizer), loop.gateway_bind, loop.gateway_address, context_window=loop.context_window
    )
    print(json.dumps({"refused": refused, "target": target}), flush=True)
    try:
        await asyncio.to_thread(sys.stdin.readline)
        print(json.dumps({"calls": [request_id for request_id, _, _ in manager.calls]}), flush=True)
    finally:
        await val._GATEWAY.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
