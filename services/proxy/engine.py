"""The proxy's client of the rollout gateway: streaming Generate over token ids,
with gRPC failures mapped to the proxy's typed errors."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

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
        self._channel = connect(target, token, tracing=tracing, service="proxy")
        self._stub = gateway_pb2_grpc.RolloutGatewayStub(self._channel)
        self._timeout = timeout_s

    async def health(self) -> gateway_pb2.GatewayHealthResponse:
        try:
            return await self._stub.Health(gateway_pb2.GatewayHealthRequest(), timeout=10)
        except RPC_ERRORS as e:
            raise map_rpc_error(e) from e

    async def generate(self, request: gateway_pb2.GenerateRequest) -> AsyncIterator[gateway_pb2.GenerateChunk]:
        """Yields chunks as the engine samples; cancelling the iteration cancels the call."""
        call = None
        try:
            call = self._stub.Generate(request, timeout=self._timeout)
            async for chunk in call:
                yield chunk
        except RPC_ERRORS as e:
            raise map_rpc_error(e) from e
        finally:
            if call is not None and not call.done():
                call.cancel()

    async def abort(self, request_id: str) -> None:
        try:
            await self._stub.Abort(gateway_pb2.AbortRequest(request_id=request_id), timeout=5)
        except grpc.aio.AioRpcError as e:
            log.info("abort failed", extra=kv(request_id=request_id, error=str(e.code())))
        except grpc.aio.UsageError:
            log.info("abort skipped", extra=kv(request_id=request_id, error=CLOSED))

    async def close(self) -> None:
        await self._channel.close()
