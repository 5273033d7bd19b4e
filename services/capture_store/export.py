"""Trajectory export for offline analysis: JSONL (one object per segment, the
fields training code reads) and Parquet (one row of metadata per trajectory,
for notebooks). Pure functions over ``Trajectory`` messages; callers do I/O."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harnessrl import arrays
from harnessrl.captured import segment_sampling
from harnessrl.v1 import records_pb2


def task_steps(traj: records_pb2.Trajectory) -> list[dict[str, Any]]:
    """A multi-step task's steps (``Trajectory.task_steps``) as plain data."""
    return [{"name": s.name, "rewards": dict(s.rewards), "verified": s.verified} for s in traj.task_steps]


def reason_name(value: int) -> str:
    """``TERMINATION_REASON_MAX_TURNS`` -> ``max_turns``."""
    return records_pb2.TerminationReason.Name(value).removeprefix("TERMINATION_REASON_").lower()


def segment_objects(traj: records_pb2.Trajectory, with_routes: bool = False) -> Iterator[dict[str, Any]]:
    """One JSON-ready object per segment of ``traj`` (read with tokens)."""
    outcome = {
        "reward": traj.reward if traj.has_reward else None,
        # Every value the verifier wrote; "reward" above is the one the run trained on.
        "rewards": dict(traj.rewards),
        # A multi-step task's steps, each with its own rewards ("rewards" combines them).
        "task_steps": task_steps(traj),
        "termination_reason": reason_name(traj.termination_reason) if traj.finalized else None,
        "finalized": traj.finalized,
    }
    for seg in traj.segments:
        r = seg.response
        obj: dict[str, Any] = {
            "run_id": traj.run_id,
            "trial_id": traj.trial_id,
            "task_id": traj.task_id,
            "group_id": traj.group_id,
            "step": traj.step,
            "thread": seg.key.thread,
            "thread_kind": seg.thread_kind,
            "trainable": seg.trainable,
            "segment_index": seg.key.segment_index,
            "num_turns": seg.num_turns,
            "finish_reason": seg.finish_reason,
            "closed": seg.closed,
            "model": seg.model,
            "chat_template_sha256": seg.chat_template_sha256,
            # temperature, top_p, top_k, min_p, mode (pin|honour), from_harness, overridden; null if unrecorded
            "sampling": segment_sampling(seg),
            "prompt_ids": arrays.unpack_i32(seg.prompt_ids).tolist(),
            "response_ids": arrays.unpack_i32(r.ids).tolist(),
            "response_mask": np.frombuffer(r.mask, np.uint8).tolist(),
            "response_logprobs": arrays.unpack_f32(r.logprobs).tolist(),
            "policy_versions": arrays.unpack_i32(r.policy_versions, "policy_versions").tolist(),
            **outcome,
        }
        routes = arrays.unpack_routes(r.routed_experts) if with_routes else None
        if routes is not None:
            obj["routed_experts"] = routes.tolist()
        yield obj


PARQUET_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("trial_id", pa.string()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("group_size", pa.int32()),
        ("step", pa.int64()),
        ("harness", pa.string()),
        ("finalized", pa.bool_()),
        ("finalized_at", pa.float64()),
        ("reward", pa.float64()),  # null when the verifier gave none
        ("rewards", pa.map_(pa.string(), pa.float64())),  # every value the verifier wrote
        # A multi-step task's steps, in order, each with its own rewards (empty: single-step).
        (
            "task_steps",
            pa.list_(
                pa.struct(
                    [
                        ("name", pa.string()),
                        ("rewards", pa.map_(pa.string(), pa.float64())),
                        ("verified", pa.bool_()),
                    ]
                )
            ),
        ),
        ("termination_reason", pa.string()),
        ("harness_exit_code", pa.int32()),
        ("setup_s", pa.float64()),
        ("agent_s", pa.float64()),
        ("verify_s", pa.float64()),
        ("teardown_s", pa.float64()),
        ("num_threads", pa.int32()),
        ("num_segments", pa.int32()),
        ("num_turns", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cached_prompt_tokens", pa.int64()),
        ("policy_versions_seen", pa.list_(pa.int64())),
        # Per segment, in order: what the engine sampled it with (null fields: not recorded).
        (
            "segment_sampling",
            pa.list_(
                pa.struct(
                    [
                        ("thread", pa.string()),
                        ("segment_index", pa.int32()),
                        ("temperature", pa.float64()),
                        ("top_p", pa.float64()),
                        ("top_k", pa.int32()),
                        ("min_p", pa.float64()),
                        ("mode", pa.string()),
                        ("from_harness", pa.list_(pa.string())),
                        ("overridden", pa.list_(pa.string())),
                    ]
                )
            ),
        ),
        ("verifier_summary", pa.string()),
        ("metadata", pa.map_(pa.string(), pa.string())),
    ]
)


def metadata_row(traj: records_pb2.Trajectory) -> dict[str, Any]:
    t = traj.timings
    return {
        "run_id": traj.run_id,
        "trial_id": traj.trial_id,
        "task_id": traj.task_id,
        "group_id": traj.group_id,
        "group_size": traj.group_size,
        "step": traj.step,
        "harness": traj.harness,
        "finalized": traj.finalized,
        "finalized_at": traj.finalized_at if traj.finalized else None,
        "reward": traj.reward if traj.has_reward else None,
        "rewards": sorted(traj.rewards.items()),
        "task_steps": [{**s, "rewards": sorted(s["rewards"].items())} for s in task_steps(traj)],
        "termination_reason": reason_name(traj.termination_reason) if traj.finalized else None,
        "harness_exit_code": traj.harness_exit_code,
        "setup_s": t.setup_s,
        "agent_s": t.agent_s,
        "verify_s": t.verify_s,
        "teardown_s": t.teardown_s,
        "num_threads": len(traj.threads),
        "num_segments": len(traj.segments),
        "num_turns": sum(s.num_turns for s in traj.segments),
        "prompt_tokens": sum(s.usage.prompt_tokens for s in traj.segments),
        "completion_tokens": sum(s.usage.completion_tokens for s in traj.segments),
        "cached_prompt_tokens": sum(s.usage.cached_prompt_tokens for s in traj.segments),
        "policy_versions_seen": list(traj.policy_versions_seen),
        "segment_sampling": [
            {"thread": seg.key.thread, "segment_index": seg.key.segment_index, **(segment_sampling(seg) or {})}
            for seg in traj.segments
        ],
        "verifier_summary": traj.verifier_summary,
        "metadata": sorted(traj.metadata.items()),
    }


def metadata_table(trajectories: Iterable[records_pb2.Trajectory]) -> pa.Table:
    return pa.Table.from_pylist([metadata_row(t) for t in trajectories], schema=PARQUET_SCHEMA)


def atomic_path(out: Path) -> tuple[int, Path]:
    """A temporary file next to ``out``; the caller renames it into place when complete,
    so an interrupted export never leaves a half-written file under the final name."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    return fd, Path(tmp)


def write_jsonl(objects: Iterable[dict[str, Any]], out: Path) -> int:
    fd, tmp = atomic_path(out)
    count = 0
    try:
        with os.fdopen(fd, "w") as f:
            for obj in objects:
                f.write(json.dumps(obj, separators=(",", ":")) + "\n")
                count += 1
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def write_parquet(table: pa.Table, out: Path) -> None:
    fd, tmp = atomic_path(out)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
