"""gRPC server factory of the gateway service."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway.settings import Settings

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["RolloutGateway"].full_name


async def create_server(settings: Settings) -> RunningServer:
    servicer = gateway_pb2_grpc.RolloutGatewayServicer()

    def register(server: grpc.aio.Server) -> Iterable[str]:
        gateway_pb2_grpc.add_RolloutGatewayServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return await start_server(settings, "gateway", register)
