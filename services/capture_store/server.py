"""gRPC server factory of the capture_store service."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import capture_pb2, capture_pb2_grpc
from services.capture_store.settings import Settings

SERVICE_NAME = capture_pb2.DESCRIPTOR.services_by_name["CaptureStore"].full_name


async def create_server(settings: Settings) -> RunningServer:
    servicer = capture_pb2_grpc.CaptureStoreServicer()

    def register(server: grpc.aio.Server) -> Iterable[str]:
        capture_pb2_grpc.add_CaptureStoreServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return await start_server(settings, "capture_store", register)
