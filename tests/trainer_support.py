"""Builders of captured records for the trainer's tests (capture format, real bytes)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harnessrl import arrays
from harnessrl.v1 import records_pb2

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
