"""What the real Codex binary does with Responses state against the proxy
(the scripted engine plays the policy).

Over HTTP Codex sends ``store: false`` and the whole input on every call, never
``previous_response_id`` (the proxy stores nothing for it). Over its WebSocket
transport (``supports_websockets = true`` in the provider table, it dials
``ws://<base>/responses``) it sends ``store: false`` too, but each call after the
first names the previous response and carries only the new input: the proxy's
connection cache resolves the chain (``responses/ws.py``). Either way the trial
completes with one main segment, token-faithful to what the engine sampled."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stack.conformance.drivers import DRIVERS
from stack.conformance.matrix import Scenario, codex_scenarios, run_scenario
from tests.e2e.test_proxy_harnesses import CODEX_MAIN, dirs, finish, run, stack, tool
from tests.integration.proxy.stack import MODEL, Stack

pytestmark = pytest.mark.harness
__all__ = ["dirs", "stack"]  # fixtures, imported for this module's tests


@pytest.mark.parametrize(
    "stack", [({"main": CODEX_MAIN, "*": [{"content": "Title"}]}, {"chunk_tokens": 3})], indirect=True
)
@pytest.mark.parametrize("websockets", [False, True])
def test_codex_responses_state(stack: Stack, dirs: tuple[Path, Path], websockets: bool) -> None:
    home, work = dirs
    trial = f"codex-state-{int(websockets)}"
    base, token = stack.new_trial(trial, model=MODEL)
    (home / ".codex").mkdir()
    (home / ".codex/config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "hrl"\n\n[model_providers.hrl]\nname = "hrl"\n'
        f'base_url = "{base}"\nwire_api = "responses"\nenv_key = "HRL_API_KEY"\n'
        f"supports_websockets = {str(websockets).lower()}\n"
    )
    cmd = [str(tool("npm/node_modules/.bin/codex")), "exec", "--skip-git-repo-check"]
    p = run(
        [*cmd, "--dangerously-bypass-approvals-and-sandbox", "Create hello.txt containing hello"],
        work,
        {"HOME": str(home), "HRL_API_KEY": token},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert (work / "hello.txt").read_text() == "hello\n"
    if websockets:
        assert "Falling back from WebSockets" not in p.stdout + p.stderr, p.stderr[-3000:]
    live = stack.admin("GET", f"/trials/{trial}").json()
    assert live["stored_responses"] == 0, "Codex sends store=false: if this fails, it now stores"
    assert live["refused_requests"] == 0, live["refusals"]
    assert live["proxy_errors"] == 0, live["refusals"]
    if websockets:
        assert live["websocket_connections"] >= 1, live
        # Every main call continued the one before (the first: Codex's generate=false
        # warm-up) with only its new input.
        assert live["chained_responses"] >= len(CODEX_MAIN) - 1, live
    else:
        assert live["websocket_connections"] == 0 and live["chained_responses"] == 0, live
    _, segments = finish(stack, trial, 3)
    assert [s["thread"] for s in segments].count("main") == 1, "one main segment on either transport"


def test_codex_compacts_over_the_websocket(tmp_path: Path) -> None:
    """Codex's local compaction with the WebSocket on: the chain's new-input calls
    extend main, the compacted request (no longer an extension of the last, so the
    whole input again) opens main's next segment, whose prompt is exactly the
    rewritten context (the conformance compaction check), the summary call a side
    thread."""
    driver = DRIVERS["codex"]
    tool(driver.binary)
    scenario = codex_scenarios()["compaction"]
    assert isinstance(scenario, Scenario)
    outcome = run_scenario(
        driver, dataclasses.replace(scenario, options={**scenario.options, "websockets": True}), tmp_path
    )
    assert "Falling back from WebSockets" not in outcome.proc.stdout + outcome.proc.stderr
    summary = outcome.summary
    assert summary["websocket_connections"] >= 1 and summary["chained_responses"] >= 2, summary
    assert summary["refused_requests"] == 0 and summary["proxy_errors"] == 0, summary["refusals"]
