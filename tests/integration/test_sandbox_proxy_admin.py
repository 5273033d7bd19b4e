"""The sandbox's client of the proxy's admin API over a real socket: a close whose
kept-alive connection the server drops under it (the server's keep-alive timeout
firing as the request goes out) is sent again on a fresh connection, since closing is
idempotent on the proxy; a register, which is not, is never sent twice."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from harnessrl.errors import Unavailable
from services.sandbox.trial.endpoints import ProxyAdmin
from services.sandbox.trial.lifecycle import TrialSpec

SUMMARY = {"trial_id": "t1", "num_turns": 1, "num_segments": 1}


class DroppingServer:
    """HTTP/1.1 on 127.0.0.1: answers the first request of each connection with keep-alive,
    then closes the connection without an answer when a second request arrives on it."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.dropped = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                length = next((int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                if served:
                    self.dropped += 1
                    writer.close()  # the keep-alive timeout firing as this request arrived
                    return
                self.requests.append(lines[0])
                path = lines[0].split()[1]
                body = SUMMARY if path.endswith("/close") else {"trial_id": "t1", "token": "k", "base_path": "/t"}
                data = json.dumps(body).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest_asyncio.fixture
async def server() -> AsyncIterator[DroppingServer]:
    s = DroppingServer()
    await s.start()
    yield s
    assert s.server is not None
    s.server.close()
    await s.server.wait_closed()


@pytest.mark.asyncio
async def test_a_close_on_a_connection_the_proxy_drops_is_sent_again(server: DroppingServer) -> None:
    admin = ProxyAdmin(f"http://127.0.0.1:{server.port}", None)
    try:
        first = await admin.close("t1")  # a fresh connection, kept alive afterwards
        second = await admin.close("t1")  # reuses it; the server drops it; sent again
    finally:
        await admin.aclose()
    assert first.num_turns == second.num_turns == 1
    assert server.dropped == 1
    assert server.requests == ["POST /admin/trials/t1/close HTTP/1.1"] * 2


@pytest.mark.asyncio
async def test_a_register_is_not_sent_twice(server: DroppingServer) -> None:
    admin = ProxyAdmin(f"http://127.0.0.1:{server.port}", None)
    spec = TrialSpec(trial_id="t1", run_id="r", group_id="g", task_path="/nowhere", harness="nop")
    try:
        await admin.register(spec, "task")
        with pytest.raises(Unavailable, match="unreachable"):
            await admin.register(spec, "task")  # the dropped connection: an error, not a second trial
    finally:
        await admin.aclose()
    assert server.dropped == 1 and len(server.requests) == 1


def test_idle_connections_expire_before_the_proxy_server_drops_them() -> None:
    # uvicorn closes a connection idle for 5 s (timeout_keep_alive); the client must stop reusing it first.
    import uvicorn

    admin = ProxyAdmin("http://127.0.0.1:9", None)
    pool = admin._client._transport._pool  # type: ignore[attr-defined]
    assert pool._keepalive_expiry < uvicorn.Config(app=None).timeout_keep_alive
    asyncio.run(admin.aclose())
