"""Makes every part durable in the capture store: one ordered queue per trial,
AppendSegment over gRPC with the service credential, retried (the RPC is
idempotent by key and part index) until it is acknowledged."""

from __future__ import annotations

import asyncio
import logging

import grpc
from opentelemetry import context as otel_context
from opentelemetry.context import Context

from harnessrl.logs import kv
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc

log = logging.getLogger(__name__)

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}


class TrialWriter:
    """Appends the parts of one trial in order, in the background; ``flush`` waits
    until every submitted part is durable or reports the first failure."""

    def __init__(
        self, stub: capture_pb2_grpc.CaptureStoreStub, trial_id: str, retries: int, try_timeout_s: float = 15.0
    ) -> None:
        self._stub = stub
        self._trial_id = trial_id
        self._retries = retries
        self._try_timeout_s = try_timeout_s
        # Each part travels with the trace context of the model call that made it.
        self._queue: asyncio.Queue[tuple[capture_pb2.AppendSegmentRequest, Context] | None] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run())
        self.error: str | None = None
        self.appended = 0

    def submit(self, request: capture_pb2.AppendSegmentRequest) -> None:
        self._queue.put_nowait((request, otel_context.get_current()))

    async def flush(self) -> None:
        await self._queue.join()

    async def stop(self) -> None:
        await self.flush()
        self._queue.put_nowait(None)
        await self._task

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if item is None:
                    return
                if self.error is None:
                    token = otel_context.attach(item[1])
                    try:
                        await self._append(item[0])
                    finally:
                        otel_context.detach(token)
            finally:
                self._queue.task_done()

    async def _append(self, request: capture_pb2.AppendSegmentRequest) -> None:
        delay = 0.05
        for attempt in range(self._retries + 1):
            try:
                # wait_for_ready: a store that is restarting is waited for (up to the try's deadline),
                # not failed at once: a capture store restart loses nothing.
                await self._stub.AppendSegment(request, timeout=self._try_timeout_s, wait_for_ready=True)
                self.appended += 1
                return
            except grpc.aio.AioRpcError as e:
                retry = e.code() in _RETRYABLE and attempt < self._retries
                log.warning(
                    "append failed",
                    extra=kv(trial=self._trial_id, code=e.code().name, attempt=attempt, retry=retry, error=e.details()),
                )
                if not retry:
                    self.error = f"AppendSegment failed ({e.code().name}): {e.details()}"
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


class CaptureClient:
    def __init__(
        self, target: str, token: str | None, retries: int, tracing: bool = True, try_timeout_s: float = 15.0
    ) -> None:
        self._channel = connect(target, token, tracing=tracing, service="proxy")
        self._stub = capture_pb2_grpc.CaptureStoreStub(self._channel)
        self._retries = retries
        self._try_timeout_s = try_timeout_s

    def writer(self, trial_id: str) -> TrialWriter:
        return TrialWriter(self._stub, trial_id, self._retries, self._try_timeout_s)

    async def close(self) -> None:
        await self._channel.close()
