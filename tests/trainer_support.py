"""Builders of captured records for the trainer's tests (capture format, real bytes),
and the real capture store to hold them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np

from harnessrl import arrays
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2

TR = records_pb2.TerminationReason


def segment(
    prompt: Sequence[int],
    ids: Sequence[int],
    mask: Sequence[int],
    logprobs: Sequence[float],
    versions: Sequence[int] | None = None,
    *,
    thread: str = "main",
    index: int = 0,
    trainable: bool = True,
    routes: np.ndarray | None = None,
) -> records_pb2.Segment:
    versions = versions if versions is not None else [0 if m else -1 for m in mask]
    seg = records_pb2.Segment(
        key=records_pb2.SegmentKey(thread=thread, segment_index=index),
        thread_kind="main",
        trainable=trainable,
        prompt_ids=arrays.pack_i32(prompt),
    )
    tokens = records_pb2.TokenArrays(
        ids=arrays.pack_i32(ids),
        mask=np.asarray(mask, dtype=np.uint8).tobytes(),
        logprobs=arrays.pack_f32(logprobs),
        policy_versions=arrays.pack_i32(versions),
    )
    if routes is not None:
        tokens.routed_experts.CopyFrom(arrays.pack_routes(routes))
    seg.response.CopyFrom(tokens)
    return seg


def trajectory(
    trial_id: str,
    group_id: str,
    reward: float,
    segments: Sequence[records_pb2.Segment],
    reason: int = TR.TERMINATION_REASON_COMPLETED,
    *,
    has_reward: bool = True,
    run_id: str = "run",
    group_size: int = 0,
) -> records_pb2.Trajectory:
    return records_pb2.Trajectory(
        run_id=run_id,
        trial_id=trial_id,
        task_id=f"task-{group_id}",
        group_id=group_id,
        group_size=group_size,
        reward=reward,
        has_reward=has_reward,
        termination_reason=reason,
        segments=list(segments),
        finalized=True,
    )


@contextlib.asynccontextmanager
async def capture_store(store_dir: Path) -> AsyncIterator[str]:
    """The real capture store (embedded backend, no fsync) on 127.0.0.1; yields host:port."""
    from services.capture_store.server import create_server
    from services.capture_store.settings import Settings

    server = await create_server(Settings(store_dir=store_dir, fsync=False, shutdown_grace_s=0.2))
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(0.2)


# What FinalizeTrajectory carries of a trajectory (the outcome the sandbox reports).
OUTCOME = ("run_id", "trial_id", "task_id", "group_id", "group_size", "reward", "has_reward", "termination_reason")


async def store_trajectory(target: str, traj: records_pb2.Trajectory) -> capture_pb2.FinalizeTrajectoryResponse:
    """Writes ``traj`` the way the proxy and the sandbox do: each segment as one closed
    part (AppendSegment), then the outcome (FinalizeTrajectory)."""
    async with connect(target) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)
        for seg in traj.segments:
            key = records_pb2.SegmentKey(run_id=traj.run_id, trial_id=traj.trial_id)
            key.thread, key.segment_index = seg.key.thread, seg.key.segment_index
            part = capture_pb2.AppendSegmentRequest(key=key, part_index=0, finish_reason="stop", close=True)
            part.thread_kind, part.trainable, part.prompt_ids = seg.thread_kind, seg.trainable, seg.prompt_ids
            part.tokens.CopyFrom(seg.response)
            part.task_id, part.group_id = traj.task_id, traj.group_id
            if seg.HasField("sampling"):
                part.sampling.CopyFrom(seg.sampling)
            await stub.AppendSegment(part)
        outcome = {name: getattr(traj, name) for name in OUTCOME}
        return await stub.FinalizeTrajectory(capture_pb2.FinalizeTrajectoryRequest(**outcome))


def served(service: str, method: str) -> float:
    """How many ``method`` calls of ``service`` the servers in this process answered OK
    (their own request metric: ``harnessrl_requests_total``)."""
    from prometheus_client import REGISTRY

    full = {"capture_store": "CaptureStore", "trainer": "Trainer"}[service]
    labels = {"service": service, "method": f"/harnessrl.v1.{full}/{method}", "code": "OK"}
    return REGISTRY.get_sample_value("harnessrl_requests_total", labels) or 0.0
