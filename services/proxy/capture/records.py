"""AppendSegment requests from capture parts: the wire form of invariant 1
(context ids mask 0, logprob 0, version -1; sampled ids mask 1 with the
engine's logprobs and policy versions)."""

from __future__ import annotations

import numpy as np

from harnessrl.arrays import F32, I32, U8, make_tokens
from harnessrl.v1 import capture_pb2, records_pb2
from services.proxy.capture.state import Part


def part_tokens(part: Part) -> records_pb2.TokenArrays:
    """context (mask 0, logprob 0, version -1) then sampled (mask 1)."""
    n_ctx = len(part.context) // 4
    s = part.sampled
    if s is None:
        return make_tokens(
            np.frombuffer(part.context, I32), np.zeros(n_ctx, U8), np.zeros(n_ctx, F32), np.full(n_ctx, -1, I32)
        )
    ids = np.frombuffer(part.context + s.ids, I32)
    mask = np.concatenate([np.zeros(n_ctx, U8), np.ones(s.num_tokens, U8)])
    lps = np.concatenate([np.zeros(n_ctx, F32), np.frombuffer(s.logprobs, F32)])
    vers = np.concatenate([np.full(n_ctx, -1, I32), np.frombuffer(s.versions, I32)])
    routes = None
    if s.routes is not None:
        routes = np.concatenate([np.zeros((n_ctx, *s.routes.shape[1:]), U8), s.routes])
    return make_tokens(ids, mask, lps, vers, routes)


def append_request(
    run_id: str,
    trial_id: str,
    task_id: str,
    group_id: str,
    model: str,
    template_sha: str,
    part: Part,
    finish: str,
    usage: records_pb2.Usage,
) -> capture_pb2.AppendSegmentRequest:
    req = capture_pb2.AppendSegmentRequest(
        key=records_pb2.SegmentKey(
            run_id=run_id, trial_id=trial_id, thread=part.thread.name, segment_index=part.segment_index
        ),
        part_index=part.part_index,
        thread_kind=part.thread.kind,
        trainable=part.thread.trainable,
        tokens=part_tokens(part),
        finish_reason=finish,
        model=model,
        chat_template_sha256=template_sha,
        close=part.close,
    )
    if part.part_index == 0:
        req.prompt_ids = part.prompt or b""
        req.task_id = task_id
        req.group_id = group_id
        if part.sampling is not None:
            req.sampling.CopyFrom(part.sampling)
    if part.sampled is not None:
        req.usage.CopyFrom(usage)
    return req
