"""What the real Codex binary does with Responses state against the proxy
(the scripted engine plays the policy).

Over HTTP Codex sends ``store: false`` and the whole input on every call, never
``previous_response_id`` (the proxy stores nothing for it, and the capture is one
segment either way). It sends ``previous_response_id`` with incremental input
only over its WebSocket transport (``supports_websockets = true`` in the
provider table, ``ws://<base>/responses``), which the proxy does not serve:
Codex then falls back to HTTP and the trial completes the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_proxy_harnesses import CODEX_MAIN, dirs, finish, run, stack, tool
from tests.integration.proxy.stack import MODEL, Stack

pytestmark = pytest.mark.harness
__all__ = ["dirs", "stack"]  # fixtures, imported for this module's tests


@pytest.mark.parametrize(
    "stack", [({"main": CODEX_MAIN, "*": [{"content": "Title"}]}, {"chunk_tokens": 3})], indirect=True
)
@pytest.mark.parametrize("websockets", [False, True])
def test_codex_sends_whole_input_unstored(stack: Stack, dirs: tuple[Path, Path], websockets: bool) -> None:
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
        assert "Falling back from WebSockets to HTTPS" in p.stdout + p.stderr, p.stderr[-3000:]
    live = stack.admin("GET", f"/trials/{trial}").json()
    assert live["stored_responses"] == 0, "Codex sends store=false: if this fails, it now stores and may chain"
    assert live["refused_requests"] == 0, live["refusals"]
    _, segments = finish(stack, trial, 3)
    assert [s["thread"] for s in segments].count("main") == 1, "whole input each call: one main segment"
