"""The proxy's gateway client on a channel the proxy already closed (it is
stopping while requests are in flight): an unavailable engine, no traceback."""

from __future__ import annotations

import pytest

from harnessrl.localservers import free_port
from harnessrl.v1 import gateway_pb2
from services.proxy.errors import EngineUnavailable
from services.proxy.gateway_client import CLOSED, EngineClient


async def test_a_closed_channel_is_an_unavailable_engine(caplog: pytest.LogCaptureFixture) -> None:
    client = EngineClient(f"127.0.0.1:{free_port()}", None, timeout_s=5, tracing=False)
    await client.close()
    with pytest.raises(EngineUnavailable, match=CLOSED):
        async for _ in client.generate(gateway_pb2.GenerateRequest(request_id="r1")):
            pass
    with pytest.raises(EngineUnavailable, match=CLOSED):
        await client.health()
    caplog.set_level("INFO", logger="services.proxy.gateway_client")
    await client.abort("r1")  # logged, not raised
    assert "abort skipped" in caplog.text
