"""gRPC server factory of the capture_store service."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import grpc

from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import capture_pb2, capture_pb2_grpc
from services.capture_store.auth import RunGuard
from services.capture_store.backend import Backend
from services.capture_store.service import CaptureService
from services.capture_store.servicer import CaptureServicer
from services.capture_store.settings import Settings

SERVICE_NAME = capture_pb2.DESCRIPTOR.services_by_name["CaptureStore"].full_name


def open_backend(settings: Settings, *, writer: bool = True) -> Backend:
    """The backend named by ``settings.backend``, checked before anything is served."""
    if settings.backend == "distributed":
        from services.capture_store.distributed import DistributedBackend

        backend = DistributedBackend(settings)
        backend.check()
        return backend
    from services.capture_store.embedded import EmbeddedBackend

    return EmbeddedBackend(settings, writer=writer)


class CaptureServer(RunningServer):
    """A running capture store: stopping it drains the server, then commits and closes the store."""

    def __init__(self, running: RunningServer, service: CaptureService) -> None:
        super().__init__(running.server, running.port, running.health, running.services, running.grace)
        self.service = service

    async def stop(self, grace: float | None = None) -> None:
        await super().stop(grace)
        await self.service.close()


async def create_server(settings: Settings, *, writer: bool = True) -> CaptureServer:
    """``writer=False`` serves an embedded store read-only (no writer lock), e.g. a live run's
    directory held by its own writer process."""
    backend = await asyncio.to_thread(open_backend, settings, writer=writer)
    service = CaptureService(settings, backend)
    await service.start()
    guard = RunGuard(settings.run_token_key.get_secret_value() if settings.run_token_key else None)
    servicer = CaptureServicer(service, guard)

    def register(server: grpc.aio.Server) -> Iterable[str]:
        capture_pb2_grpc.add_CaptureStoreServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    try:
        running = await start_server(settings, "capture_store", register)
    except BaseException:
        await service.close()
        raise
    return CaptureServer(running, service)
