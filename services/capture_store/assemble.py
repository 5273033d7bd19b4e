"""Builds ``Trajectory``/``Segment`` messages from index records and decoded parts.

A segment is its prompt (carried by part 0) followed by every part's tokens
in part order; arrays are concatenated in numpy and cross into the message
as bytes, never as Python lists.
"""

from __future__ import annotations

import numpy as np

from harnessrl.v1 import capture_pb2, records_pb2
from services.capture_store import codec
from services.capture_store import records as rec

SegEntry = tuple[str, int, rec.SegRec]  # thread, segment index, record


def segment_entries(trial: rec.TrialRec) -> list[tuple[str, int]]:
    """Every (thread, segment index) of a trial, threads in the order they opened."""
    return [(name, i) for name, raw in trial.threads.items() for i in range(int(raw[2]))]


def segment_proto(
    run: str, trial_id: str, thread: str, index: int, seg: rec.SegRec, parts: list[codec.Part] | None
) -> records_pb2.Segment:
    msg = records_pb2.Segment(
        key=records_pb2.SegmentKey(run_id=run, trial_id=trial_id, thread=thread, segment_index=index),
        thread_kind=seg.kind,
        trainable=seg.trainable,
        num_turns=seg.n_turns,
        finish_reason=seg.finish_reason,
        usage=records_pb2.Usage(
            prompt_tokens=seg.usage[0], completion_tokens=seg.usage[1], cached_prompt_tokens=seg.usage[2]
        ),
        model=seg.model,
        chat_template_sha256=seg.template,
        started_at=seg.started_at,
        updated_at=seg.updated_at,
        closed=seg.closed,
    )
    if seg.sampling:
        msg.sampling.CopyFrom(rec.sampling_proto(seg.sampling))
    if parts is not None:
        _fill_tokens(msg, seg, parts)
    return msg


def _fill_tokens(msg: records_pb2.Segment, seg: rec.SegRec, parts: list[codec.Part]) -> None:
    if parts and parts[0].prompt is not None:
        msg.prompt_ids = parts[0].prompt.tobytes()
    arrays = msg.response
    if not parts:
        return
    arrays.ids = np.concatenate([p.ids for p in parts]).tobytes()
    arrays.mask = np.concatenate([p.mask for p in parts]).tobytes()
    arrays.logprobs = np.concatenate([p.logprobs for p in parts]).tobytes()
    arrays.policy_versions = np.concatenate([p.versions for p in parts]).tobytes()
    if seg.layers:
        shape = (seg.layers, seg.top_k)
        routes = [p.routes if p.routes is not None else np.zeros((p.n, *shape), np.uint8) for p in parts]
        flat = np.concatenate(routes)
        arrays.routed_experts.data = flat.tobytes()
        arrays.routed_experts.num_tokens = flat.shape[0]
        arrays.routed_experts.num_layers, arrays.routed_experts.top_k = shape


def trajectory_proto(
    run: str,
    trial_id: str,
    trial: rec.TrialRec,
    final: capture_pb2.FinalizeTrajectoryRequest | None,
    segments: list[records_pb2.Segment],
) -> records_pb2.Trajectory:
    msg = records_pb2.Trajectory(
        run_id=run,
        trial_id=trial_id,
        task_id=trial.task_id,
        group_id=trial.group_id,
        segments=segments,
        policy_versions_seen=trial.versions,
        finalized=trial.finalized,
        finalized_at=trial.finalized_at,
    )
    for name, raw in trial.threads.items():
        msg.threads.add(name=name, kind=str(raw[0]), trainable=bool(raw[1]), num_segments=int(raw[2]))
    if final is not None:
        msg.group_size = final.group_size
        msg.step = final.step
        msg.harness = final.harness
        msg.reward = final.reward
        msg.has_reward = final.has_reward
        msg.termination_reason = final.termination_reason
        msg.timings.CopyFrom(final.timings)
        msg.verifier_summary = final.verifier_summary
        msg.harness_exit_code = final.harness_exit_code
        msg.metadata.update(final.metadata)
        msg.rewards.update(final_rewards(final))
        msg.task_steps.extend(final.task_steps)
    return msg


def final_rewards(final: capture_pb2.FinalizeTrajectoryRequest) -> dict[str, float]:
    """Every value the verifier wrote; a finalize from before ``rewards`` existed
    (wire-compatible: the field is simply absent) reads as ``{"reward": reward}``."""
    if final.rewards:
        return dict(final.rewards)
    return {"reward": final.reward} if final.has_reward else {}


def estimated_bytes(seg: rec.SegRec) -> int:
    """Upper bound of a segment's token arrays on the wire."""
    return seg.n_prompt * 4 + seg.n_tokens * (13 + seg.layers * seg.top_k)
