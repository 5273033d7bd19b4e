"""gRPC server of the remote front: the Sandbox contract (thin servicer) over
RemoteSandbox, with the shared plumbing (health, auth, errors, tracing)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import grpc

from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import sandbox_pb2, sandbox_pb2_grpc
from services.sandbox_remote.capture import CaptureFinalizer
from services.sandbox_remote.executor_client import ExecutorClient
from services.sandbox_remote.service import RemoteSandbox
from services.sandbox_remote.settings import Settings

SERVICE_NAME = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].full_name


class RemoteSandboxServicer(sandbox_pb2_grpc.SandboxServicer):
    def __init__(self, service: RemoteSandbox) -> None:
        self.service = service

    async def SubmitTrial(
        self, request: sandbox_pb2.SubmitTrialRequest, context: object
    ) -> sandbox_pb2.SubmitTrialResponse:
        trial_id, created = await self.service.submit(request.spec)
        return sandbox_pb2.SubmitTrialResponse(trial_id=trial_id, created=created)

    async def GetTrial(self, request: sandbox_pb2.GetTrialRequest, context: object) -> sandbox_pb2.TrialStatus:
        return self.service.get(request.trial_id)

    async def WatchTrials(
        self, request: sandbox_pb2.WatchTrialsRequest, context: object
    ) -> AsyncIterator[sandbox_pb2.TrialStatus]:
        async for status in self.service.watch(request.run_id, list(request.trial_ids)):
            yield status

    async def CancelTrial(
        self, request: sandbox_pb2.CancelTrialRequest, context: object
    ) -> sandbox_pb2.CancelTrialResponse:
        return sandbox_pb2.CancelTrialResponse(cancelled=await self.service.cancel(request.trial_id))


class RemoteSandboxServer:
    """The running gRPC server and the front's trial drivers."""

    def __init__(self, running: RunningServer, service: RemoteSandbox) -> None:
        self.running = running
        self.port = running.port
        self.service = service

    async def stop(self, grace: float | None = None) -> None:
        await self.running.stop(grace)
        await self.service.close()

    async def wait_for_signal(self, stop: asyncio.Event | None = None) -> None:
        try:
            await self.running.wait_for_signal(stop)
        finally:
            await self.service.close()


async def create_remote_server(settings: Settings) -> RemoteSandboxServer:
    token = settings.executor_token.get_secret_value() if settings.executor_token else None
    client = ExecutorClient(settings.executor_url, token, settings.request_timeout_s, settings.tls)
    capture = None
    if settings.capture_target:
        capture_token = settings.capture_token.get_secret_value() if settings.capture_token else None
        capture = CaptureFinalizer(settings.capture_target, capture_token)
    service = RemoteSandbox(settings, client, capture)
    servicer = RemoteSandboxServicer(service)

    def register(server: grpc.aio.Server) -> Iterable[str]:
        sandbox_pb2_grpc.add_SandboxServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return RemoteSandboxServer(await start_server(settings, "sandbox", register), service)
