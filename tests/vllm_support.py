"""One real vLLM CPU server per test session (the ``vllm`` marked suite): a server takes
60-90 s and most of both cores to start, and every test that only talks to a plain
server on the default model (``VllmServer``'s defaults) shares this one.

A test that needs another configuration (other flags, TLS), or that kills, restarts or
otherwise breaks its server, starts its own ``VllmServer`` and says why. A test that
changes the shared server's state (weights, weight version, pause) puts it back before
the next test (see ``tests/integration/test_gateway_vllm.py``'s ``restores_the_server``).

The fixture is registered in ``tests/conftest.py``; it is only set up when a test asks
for it, so the default suite never starts vLLM."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from harnessrl import paths

if TYPE_CHECKING:
    from stack.bench.vllm_server import VllmServer


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The session's plain vLLM server on the default model (fp32, the gateway's required
    flags), stopped with its whole process group at the session's end."""
    from stack.bench.vllm_server import VllmServer

    server = VllmServer(paths.default_model_dir(), tmp_path_factory.mktemp("vllm") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def check_usable(server: VllmServer) -> VllmServer:
    """The shared server as the next module expects it: alive and not paused. An earlier
    test that broke it shows here by name, rather than as a later test's timeout."""
    if server.proc.poll() is not None:
        raise RuntimeError(f"the session's vLLM server exited with {server.proc.returncode}; see {server.log.name}")
    with urllib.request.urlopen(f"{server.url}/is_paused", timeout=30) as response:
        paused = json.load(response)["is_paused"]
    if paused:
        raise RuntimeError(f"the session's vLLM server {server.url} was left paused by an earlier test")
    return server
