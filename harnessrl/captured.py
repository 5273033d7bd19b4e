"""A capture store's trajectory listing over gRPC, page by page: one loop for
every client that walks ``ListTrajectories`` (the launcher, evaluations, the
trainer's offline tools, benchmarks)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2


async def list_trajectories(
    stub: capture_pb2_grpc.CaptureStoreStub,
    request: capture_pb2.ListTrajectoriesRequest,
    page_timeout_s: float | None = None,
) -> AsyncIterator[records_pb2.Trajectory]:
    """Every trajectory (metadata) matching ``request``, following its page tokens;
    each page is one RPC with deadline ``page_timeout_s``; gRPC errors propagate."""
    req = capture_pb2.ListTrajectoriesRequest()
    req.CopyFrom(request)
    while True:
        page = await stub.ListTrajectories(req, timeout=page_timeout_s)
        for trajectory in page.trajectories:
            yield trajectory
        req.page_token = page.next_page_token
        if not req.page_token:
            return
