"""Makes every part durable in the capture store: one ordered queue per trial,
AppendSegment over gRPC with the service credential, retried (the RPC is
idempotent by key and part index) until it is acknowledged."""

from __future__ import annotations

import asyncio
import logging

import grpc

from harnessrl.logs import kv
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc

log = logging.getLogger(__name__)

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}


class TrialWriter:
    """Appends the parts of one trial in order, in the background; ``flush`` waits
    until every submitted part is durable or reports the first failure."""

    def __init__(self, stub: capture_pb2_grpc.CaptureStoreStub, trial_id: str, retries: int) -> None:
        self._stub = stub
        self._trial_id = trial_id
        self._retries = retries
        self._queue: asyncio.Queue[capture_pb2.AppendSegmentRequest | None] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run())
        self.error: str | None = None
        self.appended = 0

    def submit(self, request: capture_pb2.AppendSegmentRequest) -> None:
        self._queue.put_nowait(request)

    async def flush(self) -> None:
        await self._queue.join()

    async def stop(self) -> None:
        await self.flush()
        self._queue.put_nowait(None)
        await self._task

    async def _run(self) -> None:
        while True:
            request = await self._queue.get()
            try:
                if request is None:
                    return
                if self.error is None:
                    await self._append(request)
            finally:
                self._queue.task_done()

    async def _append(self, request: capture_pb2.AppendSegmentRequest) -> None:
        delay = 0.05
        for attempt in range(self._retries + 1):
            try:
                await self._stub.AppendSegment(request, timeout=30)
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
    def __init__(self, target: str, token: str | None, retries: int, tracing: bool = True) -> None:
        self._channel = connect(target, token, tracing=tracing)
        self._stub = capture_pb2_grpc.CaptureStoreStub(self._channel)
        self._retries = retries

    def writer(self, trial_id: str) -> TrialWriter:
        return TrialWriter(self._stub, trial_id, self._retries)

    async def close(self) -> None:
        await self._channel.close()
