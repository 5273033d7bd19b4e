"""gRPC server factory of the trainer service: thin handlers over ``TrainerService``."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import trainer_pb2, trainer_pb2_grpc
from services.trainer.service import TrainerService
from services.trainer.settings import Settings

SERVICE_NAME = trainer_pb2.DESCRIPTOR.services_by_name["Trainer"].full_name


class TrainerServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, service: TrainerService) -> None:
        self._service = service

    async def Status(
        self, request: trainer_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> trainer_pb2.TrainerStatus:
        return self._service.status()

    async def Metrics(
        self, request: trainer_pb2.MetricsRequest, context: grpc.aio.ServicerContext
    ) -> trainer_pb2.MetricsResponse:
        return self._service.metrics(request.since_step)


async def create_server(settings: Settings, service: TrainerService | None = None) -> RunningServer:
    """Serves ``service`` (a fresh, idle one when not given: status and metrics only)."""
    servicer = TrainerServicer(service or TrainerService(settings.run_id))

    def register(server: grpc.aio.Server) -> Iterable[str]:
        trainer_pb2_grpc.add_TrainerServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return await start_server(settings, "trainer", register)
