"""The proxy's clients of rollout gateways: streaming Generate over token ids,
with gRPC failures mapped to the proxy's typed errors; one client per gateway
target, the proxy's own and those trials name (``EnginePool``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from harnessrl.logs import kv
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc
from services.proxy.errors import EngineFailure, EngineUnavailable

log = logging.getLogger(__name__)

_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


class EngineContextOverflow(Exception):
    """The engine refused the prompt as longer than its window."""


CLOSED = "engine channel closed: the proxy is stopping"
# A failed call, or a call on a channel the proxy already closed (it is stopping
# under in-flight requests): both are mapped by ``map_rpc_error``.
RPC_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError)


def map_rpc_error(e: grpc.aio.AioRpcError | grpc.aio.UsageError) -> Exception:
    if isinstance(e, grpc.aio.UsageError):
        return EngineUnavailable(CLOSED)
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.OUT_OF_RANGE or (
        code == grpc.StatusCode.INVALID_ARGUMENT and "context" in details.lower()
    ):
        return EngineContextOverflow(details)
    if code in _RETRYABLE:
        return EngineUnavailable(f"engine unavailable ({code.name}): {details}")
    return EngineFailure(f"engine error ({code.name}): {details}")


class EngineClient:
    def __init__(self, target: str, token: str | None, timeout_s: float, tracing: bool = True) -> None:
        self.target = target
        self._channel = connect(target, token, tracing=tracing, service="proxy")
        self._stub = gateway_pb2_grpc.RolloutGatewayStub(self._channel)
        self._timeout = timeout_s
        self._window: int | None = None

    async def context_window(self) -> int:
        """The window this gateway reports (asked once)."""
        if self._window is None:
            health = await self.health()
            self._window = int(health.context_window) or 8192
        return self._window

    async def health(self) -> gateway_pb2.GatewayHealthResponse:
        try:
            return await self._stub.Health(gateway_pb2.GatewayHealthRequest(), timeout=10)
        except RPC_ERRORS as e:
            raise map_rpc_error(e) from e

    async def generate(self, request: gateway_pb2.GenerateRequest) -> AsyncIterator[gateway_pb2.GenerateChunk]:
        """Yields chunks as the engine samples; cancelling the iteration cancels the call.

        The timeout (``engine_timeout_s``) bounds the wait for the *next* chunk, not the
        call: a long reply that keeps streaming never hits it, and a silence while the
        gateway reports itself paused (a weight update holding the reply, partial
        rollout) does not count. Only a silence of the timeout with the gateway not
        paused fails the call (EngineUnavailable, as a gRPC deadline did)."""
        call = None
        read: asyncio.Future[Any] | None = None
        try:
            call = self._stub.Generate(request)
            while True:
                read = asyncio.ensure_future(call.read())
                while not (await asyncio.wait({read}, timeout=self._timeout))[0]:
                    if not await self._paused():
                        raise EngineUnavailable(
                            f"engine unavailable: no token for {self._timeout:g} s (engine_timeout_s) "
                            "and the gateway is not paused"
                        )
                chunk, read = read.result(), None
                if chunk is grpc.aio.EOF:
                    return
                yield chunk
        except RPC_ERRORS as e:
            raise map_rpc_error(e) from e
        finally:
            if read is not None:
                read.cancel()
            if call is not None and not call.done():
                call.cancel()

    async def _paused(self) -> bool:
        """Whether the gateway holds replies for a weight update (unreachable: not paused)."""
        try:
            return bool((await self.health()).paused)
        except (EngineUnavailable, EngineFailure):
            return False

    async def abort(self, request_id: str) -> None:
        try:
            await self._stub.Abort(gateway_pb2.AbortRequest(request_id=request_id), timeout=5)
        except grpc.aio.AioRpcError as e:
            log.info("abort failed", extra=kv(request_id=request_id, error=str(e.code())))
        except grpc.aio.UsageError:
            log.info("abort skipped", extra=kv(request_id=request_id, error=CLOSED))

    async def close(self) -> None:
        await self._channel.close()


@dataclass
class _Entry:
    client: EngineClient
    users: int = 0
    idle_timer: asyncio.TimerHandle | None = None


class EnginePool:
    """The proxy's gateway clients by target: the default one (the proxy's own
    gateway, open for the proxy's life) and one per other target a trial names,
    shared by the trials naming it and closed ``idle_s`` after its last trial
    closed, or at shutdown."""

    def __init__(self, default_target: str, token: str | None, timeout_s: float, tracing: bool, idle_s: float) -> None:
        self.default_target = default_target
        self._token, self._timeout, self._tracing, self._idle_s = token, timeout_s, tracing, idle_s
        self._entries: dict[str, _Entry] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self.default = self._entry(default_target).client

    def _entry(self, target: str) -> _Entry:
        entry = self._entries.get(target)
        if entry is None:
            client = EngineClient(target, self._token, self._timeout, self._tracing)
            entry = self._entries[target] = _Entry(client)
        return entry

    @property
    def targets(self) -> list[str]:
        return list(self._entries)

    def acquire(self, target: str) -> EngineClient:
        """The client of ``target`` ("" = the default), held until ``release``."""
        entry = self._entry(target or self.default_target)
        entry.users += 1
        if entry.idle_timer is not None:
            entry.idle_timer.cancel()
            entry.idle_timer = None
        return entry.client

    def release(self, target: str) -> None:
        target = target or self.default_target
        entry = self._entries.get(target)
        if entry is None or entry.users == 0:
            return
        entry.users -= 1
        if entry.users == 0 and target != self.default_target:
            entry.idle_timer = asyncio.get_running_loop().call_later(self._idle_s, self._expire, target)

    def _expire(self, target: str) -> None:
        entry = self._entries.get(target)
        if entry is None or entry.users:
            return
        del self._entries[target]
        log.info("closing idle gateway channel", extra=kv(target=target))
        task = asyncio.ensure_future(entry.client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            if entry.idle_timer is not None:
                entry.idle_timer.cancel()
        await asyncio.gather(*(e.client.close() for e in entries), *self._closing)
