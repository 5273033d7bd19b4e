"""gRPC server factory of the capture_store service."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import grpc

from harnessrl.errors import Unavailable
from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import capture_pb2, capture_pb2_grpc
from services.capture_store.auth import RunGuard
from services.capture_store.backend import Backend
from services.capture_store.service import CaptureService
from services.capture_store.servicer import CaptureServicer
from services.capture_store.settings import Settings

if TYPE_CHECKING:
    from services.capture_store.distributed import DistributedBackend

log = logging.getLogger(__name__)

SERVICE_NAME = capture_pb2.DESCRIPTOR.services_by_name["CaptureStore"].full_name


def open_backend(settings: Settings, *, writer: bool = True) -> Backend:
    """The backend named by ``settings.backend``, checked before anything is served."""
    if settings.backend == "distributed":
        from services.capture_store.distributed import DistributedBackend

        backend = DistributedBackend(settings)
        _check_until_reachable(backend, settings.startup_wait_s)
        return backend
    from services.capture_store.embedded import EmbeddedBackend

    return EmbeddedBackend(settings, writer=writer)


def _check_until_reachable(backend: DistributedBackend, wait_s: float) -> None:
    """``backend.check()``, again every second while Redis or S3 does not answer, up to
    ``wait_s``: in a compose stack or a pod the store can start before them. A wrong
    bucket or wrong credentials (ConfigError) fails at once."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            backend.check()
            return
        except Unavailable as e:
            if time.monotonic() >= deadline:
                raise
            log.warning("%s; waiting (startup_wait_s %g)", e, wait_s)
            time.sleep(1.0)


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
