"""Training samples built from captured trajectories, exactly as captured.

A segment becomes one sample: ``prompt_ids + response.ids`` is the model input,
token for token what the engine saw (invariants 1-2); nothing is re-rendered
or retokenized. Only the arrays' bytes are viewed as numpy arrays.

Bad input never crashes a step: a segment whose arrays disagree, whose
sampled tokens have non-finite logprobs, that has no sampled token, ... is
skipped with a counter (``skipped/<reason>``) and one log line. Trajectories
that ended for an infrastructure reason get weight 0: they are counted and
kept out of the group statistics (invariant 5).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from harnessrl import arrays
from harnessrl.errors import InvalidArgument
from harnessrl.v1 import records_pb2
from services.trainer.inputs import Sample as Sample  # the type lives apart: torch-only hosts import it

log = logging.getLogger(__name__)

TR = records_pb2.TerminationReason
# Policy outcomes keep their reward; everything else is infrastructure (weight 0).
POLICY_REASONS = frozenset(
    {
        TR.TERMINATION_REASON_COMPLETED,
        TR.TERMINATION_REASON_MAX_TURNS,
        TR.TERMINATION_REASON_CONTEXT_OVERFLOW,
        TR.TERMINATION_REASON_AGENT_TIMEOUT,
    }
)
# A sampled token's logprob is <= 0; a little above 0 is float noise from the engine.
MAX_LOGPROB = 1e-3


def reason_name(reason: int) -> str:
    """``TERMINATION_REASON_MAX_TURNS`` -> ``max_turns``."""
    try:
        return TR.Name(reason).removeprefix("TERMINATION_REASON_").lower()
    except ValueError:
        return f"unknown_{reason}"


@dataclass
class StepCounters:
    """What a step saw and skipped; every bad input lands here, never in a crash."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def skip(self, reason: str, what: str, **fields: object) -> None:
        """Counts a skipped input and logs one line saying which and why."""
        self.counts[f"skipped/{reason}"] += 1
        kv = " ".join(f"{k}={v}" for k, v in fields.items())
        log.warning("skipped %s: %s %s", what, reason, kv)

    def as_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in sorted(self.counts.items())}


@dataclass(frozen=True)
class TrajectoryRow:
    """One trajectory: its outcome and the samples of its trainable segments."""

    trial_id: str
    group_id: str
    reward: float
    valid: bool
    samples: tuple[Sample, ...]

    @property
    def num_policy_tokens(self) -> int:
        return sum(s.num_policy_tokens for s in self.samples)

    @property
    def min_version(self) -> int | None:
        versions = [int(s.versions[s.mask].min()) for s in self.samples if s.num_policy_tokens]
        return min(versions) if versions else None


def build_sample(seg: records_pb2.Segment, trial_id: str, counters: StepCounters, max_seq_len: int) -> Sample | None:
    """One segment -> one sample, or None (counted and logged) if it cannot be trained on."""
    where = {"trial": trial_id, "segment": f"{seg.key.thread}/{seg.key.segment_index}"}
    if not seg.trainable:
        counters.add("segments/not_trainable")
        return None
    try:
        n = arrays.validate_tokens(seg.response)
        prompt = arrays.unpack_i32(seg.prompt_ids, "prompt_ids")
        routes = arrays.unpack_routes(seg.response.routed_experts)
    except InvalidArgument as e:
        counters.skip("bad_lengths", "segment", error=e, **where)
        return None
    r = seg.response
    mask = np.frombuffer(r.mask, dtype=np.uint8) != 0
    logprobs = arrays.unpack_f32(r.logprobs)
    versions = arrays.unpack_i32(r.policy_versions, "policy_versions")
    ids = arrays.unpack_i32(r.ids)
    reason = _why_bad(prompt, ids, mask, logprobs, versions, n, max_seq_len)
    if reason:
        counters.skip(reason, "segment", **where)
        return None
    counters.add("segments/used")
    return Sample(
        trial_id=trial_id,
        segment=where["segment"],
        input_ids=np.concatenate([prompt, ids]).astype(np.int64),
        prompt_len=len(prompt),
        mask=mask,
        rollout_logprobs=np.where(mask, logprobs, 0.0).astype(np.float32),
        versions=versions.astype(np.int32),
        routes=routes,
        temperature=_temperature(seg, counters),
    )


def _temperature(seg: records_pb2.Segment, counters: StepCounters) -> float | None:
    """The segment's own sampling temperature for the trainer's forward, or None (the
    run's) for a capture that recorded none. Greedy (0) reported raw logprobs: 1.0."""
    if not seg.HasField("sampling"):
        counters.add("segments/sampling_unrecorded")
        return None
    s = seg.sampling
    if (0 < s.top_p < 1) or s.top_k > 0 or s.min_p > 0:
        # The engine's logprobs are of the truncated distribution; the forward divides by
        # the temperature only, so these tokens' ratios are off where truncation mattered.
        counters.add("segments/truncated_sampling")
    return float(s.temperature) if s.temperature > 0 else 1.0


def _why_bad(
    prompt: npt.NDArray[np.int32],
    ids: npt.NDArray[np.int32],
    mask: npt.NDArray[np.bool_],
    logprobs: npt.NDArray[np.float32],
    versions: npt.NDArray[np.int32],
    n: int,
    max_seq_len: int,
) -> str | None:
    if n == 0 or not mask.any():
        return "all_masked"
    if len(prompt) == 0:
        return "empty_prompt"  # the first response token would have no context to be scored in
    if len(prompt) + n > max_seq_len:
        return "too_long"
    if (prompt < 0).any() or (ids < 0).any():
        return "bad_token_ids"
    sampled = logprobs[mask]
    if not np.isfinite(sampled).all() or (sampled > MAX_LOGPROB).any():
        return "bad_logprobs"
    if (versions[mask] < 0).any():
        return "bad_versions"
    return None


def build_rows(
    trajectories: Sequence[records_pb2.Trajectory], counters: StepCounters, max_seq_len: int
) -> list[TrajectoryRow]:
    """Every trajectory of one group -> rows; invalid ones keep ``valid=False`` and no samples."""
    rows: list[TrajectoryRow] = []
    for traj in trajectories:
        counters.add(f"termination/{reason_name(traj.termination_reason)}")
        valid = traj.termination_reason in POLICY_REASONS
        if valid and not traj.has_reward:
            counters.skip("missing_reward", "trajectory", trial=traj.trial_id)
            valid = False
        elif valid and not np.isfinite(traj.reward):
            counters.skip("bad_reward", "trajectory", trial=traj.trial_id)
            valid = False
        if not valid:
            counters.add("trajectories/invalid")
        samples = tuple(
            s
            for seg in (traj.segments if valid else ())
            if (s := build_sample(seg, traj.trial_id, counters, max_seq_len)) is not None
        )
        rows.append(TrajectoryRow(traj.trial_id, traj.group_id, float(traj.reward), valid, samples))
    return rows
