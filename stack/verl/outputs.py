"""A captured trajectory as verl's ``AgentLoopOutput`` rows, tokens exactly as captured.

Two shapes, for the two kinds of verl agent-loop worker (verl 0.9.1):

- ``trajectory_to_output``: one output per trial. verl's classic ``AgentLoopWorker``
  (the synchronous and the fully-async trainers) takes exactly one output per
  sample (``_agent_loop_postprocess`` pads one prompt + one response). The
  sample is the main thread's last segment; every other trainable segment
  (earlier segments before a compaction, sub-agent threads) is dropped, counted
  in ``extra_fields["harnessrl_dropped_segments"]`` (a step metric through
  ``verl_hooks``) and carried untrained in ``extra_fields["harnessrl_segments"]``.
- ``trajectory_to_outputs``: every trainable segment of every trainable thread,
  one output each, the main thread's last segment last. verl's v1 trainer
  (``AgentLoopWorkerTQ``, TransferQueue) takes ``list[AgentLoopOutput]`` per
  session: rows keyed ``{uid}_{session}_{i}``, the last output's reward given to
  all, and ``compute_advantage_for_multi_trajectories`` computes GRPO over each
  session's last row and gives every row of the session that advantage, so each
  segment trains with its trajectory's advantage. A segment that cannot be a row
  (longer than verl's lengths, malformed) is dropped and counted the same way.

Policy versions: every row carries ``extra_fields["min_global_steps"]`` and
``["max_global_steps"]`` (ints), the weight versions its sampled tokens came from,
as verl's own server manager reports them per call: verl's ``_postprocess`` fills a
row without them with None and the fully-async trainer's batch assembly
(``detach_utils.assemble_batch_from_rollout_samples``) computes ``abs(max - min)``
over them (a TypeError on None), the v1 trainer's staleness metrics ``int()`` them.
A masked row carries the version it is given (the engine's latest), both equal.

Never raises for one trial's outcome (verl gathers a batch's samples without
``return_exceptions``: one exception fails the whole batch). A trial that cannot
be trained becomes one masked row (``masked_output``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from harnessrl import arrays
from harnessrl.errors import InvalidArgument
from harnessrl.v1 import records_pb2

log = logging.getLogger(__name__)

# A version nobody reported: a masked row of a caller that knows none (the agent loop always
# passes its engine's). Explicit, never 0, which is a real version (verl's first weights).
UNKNOWN_VERSION = -1

POLICY_REASONS = frozenset(
    {
        records_pb2.TERMINATION_REASON_COMPLETED,
        records_pb2.TERMINATION_REASON_MAX_TURNS,
        records_pb2.TERMINATION_REASON_CONTEXT_OVERFLOW,
        records_pb2.TERMINATION_REASON_AGENT_TIMEOUT,
    }
)


def _segment_dict(seg: records_pb2.Segment) -> dict[str, Any]:
    r = seg.response
    return {
        "thread": seg.key.thread,
        "index": seg.key.segment_index,
        "prompt_ids": arrays.unpack_i32(seg.prompt_ids).tolist(),
        "response_ids": arrays.unpack_i32(r.ids).tolist(),
        "response_mask": np.frombuffer(r.mask, dtype=np.uint8).tolist(),
        "response_logprobs": arrays.unpack_f32(r.logprobs).tolist(),
        "policy_versions": arrays.unpack_i32(r.policy_versions).tolist(),
        "temperature": _temperature(seg),
    }


def _temperature(seg: records_pb2.Segment) -> float | None:
    """The temperature the segment was sampled with (None: not recorded). verl's actor
    divides by its one rollout temperature; ``harnessrl verl prepare`` sets it to the
    run's, and a row whose own differs (a harness honoured) shows it here."""
    return round(float(seg.sampling.temperature), 6) if seg.HasField("sampling") else None


def _route_shape(seg: records_pb2.Segment) -> tuple[int, int] | None:
    r = seg.response.routed_experts
    return (int(r.num_layers), int(r.top_k)) if r.data and r.num_layers and r.top_k else None


def _trial_mask(traj: records_pb2.Trajectory, main: list[records_pb2.Segment]) -> str:
    """Why the whole trial is untrainable ('' when it trains)."""
    if traj.termination_reason not in POLICY_REASONS:
        reason = records_pb2.TerminationReason.Name(traj.termination_reason)
        return f"infra:{reason.removeprefix('TERMINATION_REASON_').lower()}"
    if not traj.has_reward:
        return "no_reward"
    return "" if main else "no_trainable_segment"


def _segment_output(
    seg: records_pb2.Segment, traj: records_pb2.Trajectory, response_length: int, prompt_length: int | None
) -> AgentLoopOutput | tuple[str, dict[str, Any]]:
    """One trainable segment as a row, or (why it cannot be one, details)."""
    try:
        arrays.validate_tokens(seg.response)
        d = _segment_dict(seg)
        routes = arrays.unpack_routes(seg.response.routed_experts)
    except InvalidArgument as e:
        return "invalid_capture", {"error": str(e)}
    if len(d["response_ids"]) > response_length:
        return "response_too_long", {"length": len(d["response_ids"])}
    if prompt_length is not None and len(d["prompt_ids"]) > prompt_length:
        return "prompt_too_long", {"length": len(d["prompt_ids"])}
    sampled = [v for v, m in zip(d["policy_versions"], d["response_mask"], strict=True) if m]
    versions = sampled or d["policy_versions"] or [UNKNOWN_VERSION]
    full_routes = None
    if routes is not None:
        # verl indexes routes by absolute position (prompt + response); prompt rows are not captured.
        full_routes = np.zeros((len(d["prompt_ids"]) + len(routes), *routes.shape[1:]), dtype=np.uint8)
        full_routes[len(d["prompt_ids"]) :] = routes
    info = {
        "trial_id": traj.trial_id,
        "termination_reason": records_pb2.TerminationReason.Name(traj.termination_reason),
    }
    return AgentLoopOutput(
        prompt_ids=d["prompt_ids"],
        response_ids=d["response_ids"],
        response_mask=d["response_mask"],
        response_logprobs=d["response_logprobs"],
        routed_experts=full_routes,
        reward_score=float(traj.reward),
        num_turns=int(seg.num_turns) * 2,
        metrics=AgentLoopMetrics(),
        extra_fields=_extra(info | {"reward": traj.reward}, valid=True, masked="")
        | {
            "harnessrl_policy_versions": d["policy_versions"],
            "harnessrl_segment": f"{d['thread']}/{d['index']}",
            "harnessrl_temperature": d["temperature"],
            "harnessrl_segments": [],
            "harnessrl_dropped_segments": 0,
        }
        | version_fields(min(versions), max(versions)),
    )


def version_fields(low: int, high: int) -> dict[str, int]:
    """verl's per-row weight-version span (see the module docstring)."""
    return {"min_global_steps": int(low), "max_global_steps": int(high)}


def trajectory_to_outputs(
    traj: records_pb2.Trajectory,
    response_length: int,
    *,
    prompt_length: int | None = None,
    pad_id: int = 0,
    route_shape: tuple[int, int] | None = None,
    version: int = UNKNOWN_VERSION,
) -> list[AgentLoopOutput]:
    """Every trainable segment as one row, the main thread's last segment last; an
    untrainable trial is ``[masked_output]`` stamped ``version`` (see the module docstring)."""
    main = [s for s in traj.segments if s.trainable and s.key.thread == "main"]
    reason = records_pb2.TerminationReason.Name(traj.termination_reason)
    base = {"trial_id": traj.trial_id, "termination_reason": reason, "reward": traj.reward if traj.has_reward else None}
    if route_shape is None:
        route_shape = next((_route_shape(s) for s in traj.segments if _route_shape(s)), None)
    if why := _trial_mask(traj, main):
        return [masked_output(why, base, pad_id, route_shape, version)]
    final_seg = max(main, key=lambda s: s.key.segment_index)
    final = _segment_output(final_seg, traj, response_length, prompt_length)
    if not isinstance(final, AgentLoopOutput):
        return [masked_output(final[0], base | final[1], pad_id, route_shape, version)]
    rows: list[AgentLoopOutput] = []
    untrained = [_segment_dict(s) for s in traj.segments if not s.trainable]
    # Sub-agent threads first, then main's earlier segments, each thread in order.
    for seg in sorted(
        (s for s in traj.segments if s.trainable and s is not final_seg),
        key=lambda s: (s.key.thread == "main", s.key.thread, s.key.segment_index),
    ):
        out = _segment_output(seg, traj, response_length, prompt_length)
        if isinstance(out, AgentLoopOutput):
            rows.append(out)
            continue
        log.warning("dropped segment", extra={"kv": {"trial": traj.trial_id, "segment": seg.key.thread, "why": out[0]}})
        untrained.append(_segment_dict(seg))
    final.extra_fields["harnessrl_dropped_segments"] = len(untrained) - sum(1 for s in traj.segments if not s.trainable)
    final.extra_fields["harnessrl_segments"] = untrained
    return [*rows, final]


def trajectory_to_output(
    traj: records_pb2.Trajectory,
    response_length: int,
    *,
    prompt_length: int | None = None,
    pad_id: int = 0,
    route_shape: tuple[int, int] | None = None,
    version: int = UNKNOWN_VERSION,
) -> AgentLoopOutput:
    """One row per trial (verl's classic worker): the main thread's last segment; the
    other trainable segments are dropped and counted (see the module docstring)."""
    outs = trajectory_to_outputs(
        traj, response_length, prompt_length=prompt_length, pad_id=pad_id, route_shape=route_shape, version=version
    )
    final = outs[-1]
    if not final.extra_fields["harnessrl_valid"]:
        return final
    kept = final.extra_fields["harnessrl_segment"]
    trainable = sum(1 for s in traj.segments if s.trainable)
    final.extra_fields["harnessrl_dropped_segments"] = trainable - 1
    final.extra_fields["harnessrl_segments"] = [
        d for d in map(_segment_dict, traj.segments) if f"{d['thread']}/{d['index']}" != kept
    ]
    return final


def masked_output(
    why: str,
    info: Mapping[str, Any],
    pad_id: int = 0,
    route_shape: tuple[int, int] | None = None,
    version: int = UNKNOWN_VERSION,
) -> AgentLoopOutput:
    """A well-formed sample that weighs 0 in verl's loss and, with verl_hooks'
    ``harnessrl_grpo`` estimator, is out of its group's statistics.

    The weight is ``response_mask``: verl multiplies its policy loss by it
    (``AgentLoopWorker._agent_loop_postprocess`` makes ``response_mask`` of the
    batch from it; ``core_algos.agg_loss`` sums ``loss_mat * loss_mask`` and its
    ``seq-mean-*`` modes exclude fully masked rows), so an all-zero mask trains
    nothing; the same all-zero mask is how ``harnessrl_grpo`` tells the row from a
    valid one (verl gives estimators no ``non_tensor_batch``). Two pad tokens
    (prompt 1, response 1) keep every tensor non-empty; ``reward_score`` is 0.0 so
    verl's ``rm_scores`` exist for every row. ``routed_experts`` (zeros) are given
    when their (layers, top-k) shape is known, so a batch where others carry
    routes still concatenates.
    """
    log.warning("masked sample", extra={"kv": {"why": why, **{k: v for k, v in info.items() if k != "reward"}}})
    routes = np.zeros((2, *route_shape), dtype=np.uint8) if route_shape else None
    return AgentLoopOutput(
        prompt_ids=[pad_id],
        response_ids=[pad_id],
        response_mask=[0],
        response_logprobs=[0.0],
        routed_experts=routes,
        reward_score=0.0,
        num_turns=0,
        metrics=AgentLoopMetrics(),
        extra_fields=_extra(info, valid=False, masked=why)
        | {
            "harnessrl_policy_versions": [],
            "harnessrl_segment": "",
            "harnessrl_temperature": None,
            "harnessrl_segments": [],
            "harnessrl_dropped_segments": 0,
        }
        | version_fields(version, version),
    )


def _extra(info: Mapping[str, Any], *, valid: bool, masked: str) -> dict[str, Any]:
    return {
        "harnessrl_trial_id": info.get("trial_id", ""),
        "harnessrl_termination_reason": info.get("termination_reason", ""),
        # False: the row weighs 0 (response_mask all 0); verl_hooks' estimator and metrics read it.
        "harnessrl_valid": valid,
        # Why the row is masked ("" when it trains): infra:<reason>, no_reward, no_trainable_segment,
        # response_too_long, prompt_too_long, invalid_capture, sandbox_error, trial_deadline.
        "harnessrl_masked": masked,
        # The verifier's reward (None when it gave none): reported, trained only when valid.
        "harnessrl_reward": info.get("reward"),
        # verl's v1 worker copies the last row's into a session's other rows (KeyError without
        # it); the reward is the verifier's, so verl's reward loop adds nothing.
        "reward_extra_info": {},
    }
