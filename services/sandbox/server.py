"""gRPC server of the sandbox service: a thin servicer over SandboxService.
With the in-process queue (``memory://``) the server also runs a worker, since
nothing else could reach its queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import grpc

from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import sandbox_pb2, sandbox_pb2_grpc
from services.sandbox.common.settings import Settings
from services.sandbox.queue.base import TrialQueue, create_queue
from services.sandbox.service import SandboxService

SERVICE_NAME = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].full_name


class SandboxServicer(sandbox_pb2_grpc.SandboxServicer):
    def __init__(self, service: SandboxService) -> None:
        self.service = service

    async def SubmitTrial(
        self, request: sandbox_pb2.SubmitTrialRequest, context: object
    ) -> sandbox_pb2.SubmitTrialResponse:
        spec = self.service.parse_spec(request.spec)
        record, created = await self.service.submit(spec)
        return sandbox_pb2.SubmitTrialResponse(trial_id=record.trial_id, created=created)

    async def GetTrial(self, request: sandbox_pb2.GetTrialRequest, context: object) -> sandbox_pb2.TrialStatus:
        return (await self.service.get(request.trial_id)).to_status()

    async def WatchTrials(
        self, request: sandbox_pb2.WatchTrialsRequest, context: object
    ) -> AsyncIterator[sandbox_pb2.TrialStatus]:
        async for record in self.service.watch(request.run_id, list(request.trial_ids)):
            yield record.to_status()

    async def CancelTrial(
        self, request: sandbox_pb2.CancelTrialRequest, context: object
    ) -> sandbox_pb2.CancelTrialResponse:
        return sandbox_pb2.CancelTrialResponse(cancelled=await self.service.cancel(request.trial_id))


class SandboxServer:
    """The running gRPC server plus, for the in-process queue, its worker."""

    def __init__(
        self, running: RunningServer, queue: TrialQueue, worker_task: asyncio.Task[None] | None, stop: asyncio.Event
    ) -> None:
        self.running = running
        self.port = running.port
        self.queue = queue
        self._worker_task = worker_task
        self._stop = stop

    async def stop(self, grace: float | None = None) -> None:
        self._stop.set()
        await self.running.stop(grace)
        if self._worker_task is not None:
            await self._worker_task
        await self.queue.close()


async def create_server(settings: Settings) -> RunningServer:
    """The factory ``harnessrl sandbox serve`` uses."""
    return (await create_sandbox_server(settings)).running


async def create_sandbox_server(settings: Settings, queue: TrialQueue | None = None) -> SandboxServer:
    queue = queue or create_queue(settings.queue_url)
    servicer = SandboxServicer(SandboxService(queue))

    def register(server: grpc.aio.Server) -> Iterable[str]:
        sandbox_pb2_grpc.add_SandboxServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    running = await start_server(settings, "sandbox", register)
    stop = asyncio.Event()
    worker_task = None
    if settings.queue_url.startswith("memory://"):
        from services.sandbox.factory import build_worker

        worker = build_worker(settings, queue)
        worker_task = asyncio.ensure_future(worker.run(stop))
    return SandboxServer(running, queue, worker_task, stop)
