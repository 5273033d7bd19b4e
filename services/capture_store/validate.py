"""Validation of incoming requests: everything a request can get wrong on its
own (bad ids, arrays of disagreeing lengths, oversized parts) is refused here
with INVALID_ARGUMENT, before anything is written. What depends on stored
state (gaps, conflicts) is decided in :mod:`rules`."""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from harnessrl import arrays
from harnessrl.errors import InvalidArgument
from harnessrl.v1 import capture_pb2, records_pb2
from services.capture_store import codec
from services.capture_store.settings import Settings

# A run id names directories, S3 prefixes and Redis hash tags: keep it plain.
RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Other ids are percent-encoded into keys; refuse only what is never an id.
ID_RE = re.compile(r"^[^\x00-\x20\x7f]{1,256}$")
THREAD_KINDS = ("main", "subagent", "side", "abandoned")  # abandoned: never trainable (proxy turn.py)
MAX_TEXT = 256
MAX_SUMMARY = 16 * 1024
MAX_METADATA = 64
MAX_REWARDS = 64
MAX_TASK_STEPS = 64
MAX_GROUP_SIZE = 4096
VALID_REASONS = set(records_pb2.TerminationReason.values()) - {records_pb2.TERMINATION_REASON_UNSPECIFIED}


def check_run(run_id: str) -> str:
    if not RUN_RE.match(run_id):
        raise InvalidArgument(f"run_id {run_id!r} must match {RUN_RE.pattern} (letters, digits, '.', '_', '-')")
    return run_id


def check_id(value: str, field: str) -> str:
    if not ID_RE.match(value):
        raise InvalidArgument(f"{field} {value!r} must be 1-256 characters without spaces or control characters")
    return value


def check_text(value: str, field: str, limit: int = MAX_TEXT) -> None:
    if len(value) > limit:
        raise InvalidArgument(f"{field} has {len(value)} characters; the limit is {limit}")


def digest(msg: capture_pb2.AppendSegmentRequest | capture_pb2.FinalizeTrajectoryRequest) -> str:
    """Identifies a request's content: a retry is a duplicate iff its digest matches."""
    return hashlib.blake2b(msg.SerializeToString(deterministic=True), digest_size=16).hexdigest()


@dataclass
class PreparedAppend:
    """A validated append with its decoded arrays; ``write`` is unique per call."""

    req: capture_pb2.AppendSegmentRequest
    part: codec.Part
    digest: str
    write: str
    n_sampled: int
    versions: list[int]


SAMPLING_MODES = ("pin", "honour")
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p")


def _check_sampling(req: capture_pb2.AppendSegmentRequest, where: str) -> None:
    """A segment's sampling: on part 0 only (it holds for every part), in the engine's bounds."""
    s = req.sampling
    if req.part_index != 0:
        raise InvalidArgument(f"{where}: sampling belongs on part 0 only (a segment has one)")
    if not (0 <= s.temperature <= 100 and 0 <= s.top_p <= 1 and s.top_k >= 0 and 0 <= s.min_p <= 1):
        raise InvalidArgument(
            f"{where}: sampling out of bounds (temperature {s.temperature}, top_p {s.top_p}, top_k {s.top_k}, "
            f"min_p {s.min_p})"
        )
    if s.mode not in SAMPLING_MODES:
        raise InvalidArgument(f"{where}: sampling.mode {s.mode!r} must be one of {SAMPLING_MODES}")
    for name in (*s.from_harness, *s.overridden):
        if name not in SAMPLING_FIELDS:
            raise InvalidArgument(f"{where}: sampling names an unknown field {name!r} (known: {SAMPLING_FIELDS})")


def prepare_append(req: capture_pb2.AppendSegmentRequest, settings: Settings) -> PreparedAppend:
    key = req.key
    check_run(key.run_id)
    check_id(key.trial_id, "key.trial_id")
    check_id(key.thread, "key.thread")
    where = f"part {req.part_index} of segment {key.segment_index} of thread {key.thread!r}"
    if req.thread_kind not in THREAD_KINDS:
        raise InvalidArgument(f"{where}: thread_kind {req.thread_kind!r} must be one of {THREAD_KINDS}")
    for field in ("finish_reason", "model", "chat_template_sha256"):
        check_text(getattr(req, field), field)
    if req.group_id:
        check_id(req.group_id, "group_id")
    prompt = None
    if req.part_index == 0:
        if not req.task_id:
            raise InvalidArgument(f"{where}: task_id is required on part 0")
        check_id(req.task_id, "task_id")
        prompt = arrays.unpack_i32(req.prompt_ids, "prompt_ids")
        if prompt.size == 0:
            raise InvalidArgument(f"{where}: part 0 must carry the segment's prompt_ids")
        if prompt.size > settings.max_prompt_tokens:
            limit = settings.max_prompt_tokens
            raise InvalidArgument(f"{where}: prompt has {prompt.size} tokens; the limit is {limit}")
    elif req.prompt_ids:
        raise InvalidArgument(f"{where}: prompt_ids belong on part 0 only")
    if req.HasField("sampling"):
        _check_sampling(req, where)
    n = arrays.validate_tokens(req.tokens)
    if n > settings.max_part_tokens:
        raise InvalidArgument(f"{where}: {n} tokens in one part; the limit is {settings.max_part_tokens}")
    part = codec.Part(
        ids=arrays.unpack_i32(req.tokens.ids),
        mask=np.frombuffer(req.tokens.mask, dtype=np.uint8),
        logprobs=arrays.unpack_f32(req.tokens.logprobs),
        versions=arrays.unpack_i32(req.tokens.policy_versions, "policy_versions"),
        routes=arrays.unpack_routes(req.tokens.routed_experts),
        prompt=prompt,
    )
    n_sampled, versions = _check_arrays(part, where)
    if req.HasField("usage") and req.usage.completion_tokens != n_sampled:
        raise InvalidArgument(
            f"{where}: usage.completion_tokens is {req.usage.completion_tokens} but the part holds "
            f"{n_sampled} sampled (mask 1) tokens"
        )
    return PreparedAppend(req, part, digest(req), uuid.uuid4().hex, n_sampled, versions)


def _check_arrays(part: codec.Part, where: str) -> tuple[int, list[int]]:
    if part.mask.size and int(part.mask.max()) > 1:
        raise InvalidArgument(f"{where}: mask entries must be 0 or 1")
    if part.routes is not None and (part.routes.shape[1] == 0 or part.routes.shape[2] == 0):
        raise InvalidArgument(f"{where}: routed_experts needs num_layers >= 1 and top_k >= 1")
    sampled = part.mask.astype(bool)
    if not np.all(np.isfinite(part.logprobs[sampled])):
        raise InvalidArgument(f"{where}: logprobs must be finite where mask is 1")
    versions = part.versions[sampled]
    if versions.size and int(versions.min()) < 0:
        raise InvalidArgument(f"{where}: policy_versions must be >= 0 where mask is 1")
    return int(sampled.sum()), [int(v) for v in np.unique(versions)]


def check_finalize(req: capture_pb2.FinalizeTrajectoryRequest) -> None:
    check_run(req.run_id)
    check_id(req.trial_id, "trial_id")
    check_id(req.task_id, "task_id")
    check_id(req.group_id, "group_id")
    if not 1 <= req.group_size <= MAX_GROUP_SIZE:
        raise InvalidArgument(f"group_size {req.group_size} must be between 1 and {MAX_GROUP_SIZE}")
    if req.termination_reason not in VALID_REASONS:
        raise InvalidArgument(f"termination_reason {req.termination_reason} is not a valid TerminationReason")
    if req.has_reward and not math.isfinite(req.reward):
        raise InvalidArgument(f"reward {req.reward} is not finite")
    t = req.timings
    for name in ("setup_s", "agent_s", "verify_s", "teardown_s"):
        value = getattr(t, name)
        if not (math.isfinite(value) and value >= 0):
            raise InvalidArgument(f"timings.{name} {value} must be finite and >= 0")
    check_text(req.harness, "harness")
    check_text(req.verifier_summary, "verifier_summary", MAX_SUMMARY)
    if len(req.metadata) > MAX_METADATA:
        raise InvalidArgument(f"metadata has {len(req.metadata)} entries; the limit is {MAX_METADATA}")
    for k, v in req.metadata.items():
        check_text(k, "metadata key")
        check_text(v, f"metadata[{k!r}]", 4096)
    check_rewards(req.rewards, "rewards")
    if len(req.task_steps) > MAX_TASK_STEPS:
        raise InvalidArgument(f"task_steps has {len(req.task_steps)} entries; the limit is {MAX_TASK_STEPS}")
    for i, step in enumerate(req.task_steps):
        check_text(step.name, f"task_steps[{i}].name")
        check_rewards(step.rewards, f"task_steps[{i}].rewards")


def check_rewards(rewards: Mapping[str, float], field: str) -> None:
    """A rewards map: bounded, named keys, finite values."""
    if len(rewards) > MAX_REWARDS:
        raise InvalidArgument(f"{field} has {len(rewards)} entries; the limit is {MAX_REWARDS}")
    for k, v in rewards.items():
        if not k:
            raise InvalidArgument(f"{field} has an empty key")
        check_text(k, f"{field} key")
        if not math.isfinite(v):
            raise InvalidArgument(f"{field}[{k!r}] {v} is not finite")
