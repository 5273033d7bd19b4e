"""What every reader of a capture store shares: its trajectory listing over gRPC, page by
page (one loop for every client that walks ``ListTrajectories``: the launcher, evaluations,
the trainer's offline tools, benchmarks), and a segment's sampling as plain values (the
store's index record, the exports and the dashboard show the same fields)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

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


def sampling_fields(msg: records_pb2.SegmentSampling) -> dict[str, Any]:
    """A segment's sampling as plain JSON values."""
    return {
        "temperature": round(msg.temperature, 6),  # float32 on the wire: 0.7, not 0.699999988
        "top_p": round(msg.top_p, 6),
        "top_k": msg.top_k,
        "min_p": round(msg.min_p, 6),
        "mode": msg.mode,
        "from_harness": list(msg.from_harness),
        "overridden": list(msg.overridden),
    }


def segment_sampling(seg: records_pb2.Segment) -> dict[str, Any] | None:
    """What the engine sampled ``seg`` with; None for a capture made before it was recorded."""
    return sampling_fields(seg.sampling) if seg.HasField("sampling") else None
