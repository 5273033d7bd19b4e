"""gRPC server factory of the sandbox service."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import sandbox_pb2, sandbox_pb2_grpc
from services.sandbox.settings import Settings

SERVICE_NAME = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].full_name


async def create_server(settings: Settings) -> RunningServer:
    servicer = sandbox_pb2_grpc.SandboxServicer()

    def register(server: grpc.aio.Server) -> Iterable[str]:
        sandbox_pb2_grpc.add_SandboxServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return await start_server(settings, "sandbox", register)
