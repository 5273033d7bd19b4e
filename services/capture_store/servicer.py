"""The gRPC face of the capture store: parse, authorize the run, call the
service, map the result. Errors are HarnessErrors, mapped to statuses by the
common interceptor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from opentelemetry import trace

from harnessrl.errors import InvalidArgument
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.capture_store import validate
from services.capture_store.auth import RunGuard
from services.capture_store.service import CaptureService
from services.capture_store.watch import Subscription


class CaptureServicer(capture_pb2_grpc.CaptureStoreServicer):
    def __init__(self, service: CaptureService, guard: RunGuard) -> None:
        self._service = service
        self._guard = guard

    def _enter(self, context: grpc.aio.ServicerContext, run_id: str, **attributes: str | int) -> None:
        """Tags the RPC's span (joined to the caller's trace) and checks the run's namespace."""
        span = trace.get_current_span()
        span.set_attribute("harnessrl.run_id", run_id)
        for name, value in attributes.items():
            span.set_attribute(f"harnessrl.{name}", value)
        validate.check_run(run_id)
        self._guard.check(context, run_id)

    async def AppendSegment(
        self, request: capture_pb2.AppendSegmentRequest, context: grpc.aio.ServicerContext
    ) -> capture_pb2.AppendSegmentResponse:
        k = request.key
        self._enter(
            context, k.run_id, trial_id=k.trial_id, thread=k.thread, segment_index=k.segment_index,
            part_index=request.part_index,
        )  # fmt: skip
        return await self._service.append(request)

    async def FinalizeTrajectory(
        self, request: capture_pb2.FinalizeTrajectoryRequest, context: grpc.aio.ServicerContext
    ) -> capture_pb2.FinalizeTrajectoryResponse:
        self._enter(context, request.run_id, trial_id=request.trial_id, group_id=request.group_id)
        return await self._service.finalize(request)

    async def GetTrajectory(
        self, request: capture_pb2.GetTrajectoryRequest, context: grpc.aio.ServicerContext
    ) -> records_pb2.Trajectory:
        self._enter(context, request.run_id, trial_id=request.trial_id)
        return await self._service.get(request.run_id, request.trial_id, request.include_tokens)

    async def ListTrajectories(
        self, request: capture_pb2.ListTrajectoriesRequest, context: grpc.aio.ServicerContext
    ) -> capture_pb2.ListTrajectoriesResponse:
        self._enter(context, request.run_id)
        return await self._service.list_trajectories(request)

    async def DeleteRun(
        self, request: capture_pb2.DeleteRunRequest, context: grpc.aio.ServicerContext
    ) -> capture_pb2.DeleteRunResponse:
        self._enter(context, request.run_id)
        return capture_pb2.DeleteRunResponse(trajectories_deleted=await self._service.delete_run(request.run_id))

    async def WatchReady(
        self, request_iterator: AsyncIterator[capture_pb2.WatchReadyRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[capture_pb2.ReadyGroup]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "subscribe":
            raise InvalidArgument("the first WatchReady message must be a subscribe")
        self._enter(context, first.subscribe.run_id, consumer_group=first.subscribe.consumer_group)
        sub = Subscription(self._service, first.subscribe)
        await sub.open()
        acks = asyncio.create_task(sub.consume_requests(request_iterator))
        try:
            async for group in sub.groups():
                yield group
        finally:
            acks.cancel()
            await sub.close()
