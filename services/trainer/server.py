"""gRPC server factory of the trainer service."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import trainer_pb2, trainer_pb2_grpc
from services.trainer.settings import Settings

SERVICE_NAME = trainer_pb2.DESCRIPTOR.services_by_name["Trainer"].full_name


async def create_server(settings: Settings) -> RunningServer:
    servicer = trainer_pb2_grpc.TrainerServicer()

    def register(server: grpc.aio.Server) -> Iterable[str]:
        trainer_pb2_grpc.add_TrainerServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return await start_server(settings, "trainer", register)
