"""One trajectory, for people: its outcome row (metadata only), its digest
(tool-call mix, malformed calls, turns; needs tokens) and the full view of the
trajectory page (transcript, token-level arrays, boundaries)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harnessrl.arrays import unpack_f32, unpack_i32
from harnessrl.captured import segment_sampling
from harnessrl.v1 import records_pb2
from services.dashboard.text import IM_END, Decoder, ToolParser, transcript

INFRA_REASONS = frozenset(
    {"verifier_timeout", "env_setup_failed", "verifier_error", "engine_error", "proxy_error", "cancelled"}
)
POLICY_REASONS = frozenset({"completed", "max_turns", "context_overflow", "agent_timeout"})
# Where a trial that did not succeed failed: (stage, infra?) by termination reason.
STAGES = {
    "env_setup_failed": "setup",
    "agent_timeout": "agent",
    "max_turns": "agent",
    "context_overflow": "agent",
    "engine_error": "agent",
    "proxy_error": "agent",
    "cancelled": "agent",
    "verifier_timeout": "verifier",
    "verifier_error": "verifier",
    "completed": "verifier",  # the harness finished; the tests did not pass
}


# A trial "submitted" when its agent ended the episode itself, read from the captured
# tokens (never from the harness's logs): for a harness with a submit command, a
# sampled reply of the main thread carries it; for the others, the main thread's
# last reply is a final answer (no tool call, nothing malformed). A trial cut off by
# a turn limit or a timeout mid-work did not submit.
SUBMIT_MARKERS = {"mini-swe-agent": "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}


def reason_name(reason: int) -> str:
    if reason == records_pb2.TERMINATION_REASON_UNSPECIFIED:
        return "unspecified"
    return records_pb2.TerminationReason.Name(reason).removeprefix("TERMINATION_REASON_").lower()


def row(traj: records_pb2.Trajectory) -> dict[str, Any]:
    """The listing row of a trajectory: everything but tokens."""
    reason = reason_name(traj.termination_reason) if traj.finalized else "running"
    t = traj.timings
    return {
        "run_id": traj.run_id,
        "trial_id": traj.trial_id,
        "task_id": traj.task_id,
        "group_id": traj.group_id,
        "group_size": traj.group_size,
        "step": traj.step,
        "harness": traj.harness,
        "reward": traj.reward if traj.has_reward else None,
        "rewards": dict(traj.rewards),
        # A multi-step task's steps, each with its own rewards ("rewards" combines them).
        "task_steps": [{"name": s.name, "rewards": dict(s.rewards), "verified": s.verified} for s in traj.task_steps],
        "termination_reason": reason,
        "infra": reason in INFRA_REASONS,
        "finalized": traj.finalized,
        "finalized_at": traj.finalized_at or None,
        "timings": {"setup_s": t.setup_s, "agent_s": t.agent_s, "verify_s": t.verify_s, "teardown_s": t.teardown_s},
        "segments": len(traj.segments),
        "threads": [
            {"name": th.name, "kind": th.kind, "trainable": th.trainable, "segments": th.num_segments}
            for th in traj.threads
        ],
        "turns": sum(s.num_turns for s in traj.segments),
        "main_turns": sum(s.num_turns for s in traj.segments if s.thread_kind == "main"),
        "completion_tokens": sum(s.usage.completion_tokens for s in traj.segments),
        "policy_versions": list(traj.policy_versions_seen),
        "harness_exit_code": traj.harness_exit_code,
        "verifier_summary": traj.verifier_summary,
        "metadata": dict(traj.metadata),
    }


@dataclass
class Digest:
    """What the behaviour panels need from a trajectory's tokens."""

    tool_calls: Counter[str] = field(default_factory=Counter)
    malformed: int = 0
    sampled_tokens: int = 0
    calls: int = 0  # model calls (sampled runs); a segment's num_turns also counts a closing part
    main_calls: int = 0
    decoded: bool = False
    submitted: bool | None = None  # None: no decoder, or no main-thread reply

    def as_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "main_calls": self.main_calls,
            "tool_calls": dict(self.tool_calls),
            "malformed": self.malformed,
            "sampled_tokens": self.sampled_tokens,
            "decoded": self.decoded,
            "submitted": self.submitted,
        }


def sampled_runs(seg: records_pb2.Segment) -> list[list[int]]:
    """The sampled (mask 1) runs of a segment's response: one per model call."""
    ids = unpack_i32(seg.response.ids)
    mask = np.frombuffer(seg.response.mask, dtype=np.uint8)
    return [ids[a:b].tolist() for a, b in _runs(mask, 1)]


def _runs(mask: np.ndarray, value: int) -> list[tuple[int, int]]:
    hit = np.concatenate([[0], (mask == value).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(hit))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def digest(traj: records_pb2.Trajectory, decoder: Decoder | None, parser: ToolParser) -> Digest:
    """Tool calls by name, malformed calls and the harness's submit, parsed from each
    sampled reply.

    The proxy's own count (``malformed_tool_calls`` in the trajectory's metadata,
    when the sandbox recorded it) wins over the dashboard's parse."""
    d = Digest()
    marker = SUBMIT_MARKERS.get(traj.harness)
    marked, last_main = False, None
    for seg in traj.segments:
        for ids in sampled_runs(seg):
            d.sampled_tokens += len(ids)
            d.calls += 1
            d.main_calls += seg.thread_kind == "main"
            if decoder is None:
                continue
            text = decoder.text(ids).split(IM_END)[0]
            parsed = parser.parse(text)
            d.tool_calls.update(c.name for c in parsed.calls)
            d.malformed += parsed.malformed
            if seg.thread_kind == "main":
                marked = marked or (marker is not None and marker in text)
                last_main = not parsed.calls and not parsed.malformed
    d.decoded = decoder is not None
    if d.decoded and last_main is not None:
        d.submitted = marked if marker is not None else last_main
    recorded = traj.metadata.get("malformed_tool_calls")
    if recorded is not None and recorded.isdigit():
        d.malformed = int(recorded)
    return d


def view(traj: records_pb2.Trajectory, decoder: Decoder | None, parser: ToolParser, max_tokens: int) -> dict[str, Any]:
    """The trajectory page: row + per segment its transcript and token arrays."""
    ordered = sorted(traj.segments, key=lambda s: (s.thread_kind != "main", s.key.thread, s.key.segment_index))
    segments = [_segment_view(seg, decoder, parser, max_tokens) for seg in ordered]
    return {**row(traj), "segments_detail": segments, "decoded": decoder is not None}


def _segment_view(
    seg: records_pb2.Segment, decoder: Decoder | None, parser: ToolParser, max_tokens: int
) -> dict[str, Any]:
    prompt = unpack_i32(seg.prompt_ids)
    ids = unpack_i32(seg.response.ids)
    mask = np.frombuffer(seg.response.mask, dtype=np.uint8)
    logprobs = unpack_f32(seg.response.logprobs)
    versions = unpack_i32(seg.response.policy_versions)
    out: dict[str, Any] = {
        "thread": seg.key.thread,
        "index": seg.key.segment_index,
        "kind": seg.thread_kind,
        "trainable": seg.trainable,
        "turns": seg.num_turns,
        "calls": len(_runs(mask, 1)),
        "finish_reason": seg.finish_reason,
        "closed": seg.closed,
        "model": seg.model,
        "template_sha256": seg.chat_template_sha256,
        "sampling": segment_sampling(seg),
        "prompt_tokens": len(prompt),
        "response_tokens": len(ids),
        "sampled_tokens": int(mask.sum()),
        "usage": {
            "prompt": seg.usage.prompt_tokens,
            "completion": seg.usage.completion_tokens,
            "cached": seg.usage.cached_prompt_tokens,
        },
        "tokens": _token_arrays(prompt, ids, mask, logprobs, versions, decoder, max_tokens),
        "transcript": None,
    }
    if decoder is not None:
        chunks = [("prompt", decoder.text(prompt.tolist()))]
        for value, (a, b) in sorted([(0, r) for r in _runs(mask, 0)] + [(1, r) for r in _runs(mask, 1)], key=_start):
            chunks.append(("sampled" if value else "context", decoder.text(ids[a:b].tolist())))
        out["transcript"] = [m.as_json() for m in transcript(chunks, parser)]
    return out


def _start(item: tuple[int, tuple[int, int]]) -> int:
    return item[1][0]


def _token_arrays(
    prompt: np.ndarray,
    ids: np.ndarray,
    mask: np.ndarray,
    logprobs: np.ndarray,
    versions: np.ndarray,
    decoder: Decoder | None,
    max_tokens: int,
) -> dict[str, Any]:
    """Prompt then response, one entry per token; over ``max_tokens`` the middle is elided
    (the prompt's head and the response's tail stay: that is where turns end)."""
    all_ids = np.concatenate([prompt, ids])
    kind = np.concatenate([np.full(len(prompt), 2, np.uint8), mask])  # 2 = prompt, 1 = sampled, 0 = context
    lp = np.concatenate([np.zeros(len(prompt), np.float32), logprobs])
    ver = np.concatenate([np.full(len(prompt), -1, np.int32), versions])
    n = len(all_ids)
    keep = np.arange(n)
    elided_at, elided = None, 0
    if n > max_tokens:
        head = max_tokens // 4
        keep = np.concatenate([np.arange(head), np.arange(n - (max_tokens - head), n)])
        elided_at, elided = head, n - max_tokens
    # Turn boundaries: a context run starting after a sampled one opens the next model call.
    starts = [int(i) for i in np.flatnonzero((kind[1:] == 0) & (kind[:-1] == 1)) + 1]
    sel = all_ids[keep].tolist()
    return {
        "ids": sel,
        "pieces": decoder.pieces(sel) if decoder is not None else None,
        "kind": kind[keep].tolist(),
        "logprobs": [round(float(x), 4) for x in lp[keep]],
        "versions": ver[keep].tolist(),
        "positions": keep.tolist() if elided else None,
        "prompt_len": len(prompt),
        "turn_starts": starts,
        "elided_at": elided_at,
        "elided": elided,
    }
