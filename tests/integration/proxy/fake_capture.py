"""An honest in-memory CaptureStore for the proxy's tests until the real store
lands: AppendSegment with the contract's idempotency (same key and part index
and same content: acknowledged as duplicate, stored once), ordering (parts
0, 1, 2... with no part after a close) and validation; segments are assembled
exactly as the store documents (prompt, then every part's tokens)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from harnessrl.arrays import unpack_f32, unpack_i32, validate_tokens
from harnessrl.config import ServiceSettings
from harnessrl.errors import FailedPrecondition, InvalidArgument
from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import capture_pb2, capture_pb2_grpc


@dataclass
class StoredSegment:
    run_id: str
    trial_id: str
    thread: str
    index: int
    kind: str
    trainable: bool
    prompt_ids: list[int]
    task_id: str
    group_id: str
    template_sha: str
    parts: list[capture_pb2.AppendSegmentRequest] = field(default_factory=list)
    closed: bool = False

    def export(self) -> dict[str, Any]:
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        for p in self.parts:
            ids += unpack_i32(p.tokens.ids).tolist()
            mask += list(p.tokens.mask)
            logprobs += unpack_f32(p.tokens.logprobs).tolist()
            versions += unpack_i32(p.tokens.policy_versions).tolist()
        return {
            "trial_id": self.trial_id,
            "thread": self.thread,
            "thread_kind": self.kind,
            "trainable": self.trainable,
            "segment_index": self.index,
            "prompt_ids": self.prompt_ids,
            "response_ids": ids,
            "response_mask": mask,
            "response_logprobs": logprobs,
            "policy_versions": versions,
            "num_turns": sum(1 for p in self.parts if np.frombuffer(p.tokens.mask, np.uint8).any()),
            "closed": self.closed,
            "finish_reasons": [p.finish_reason for p in self.parts],
            "chat_template_sha256": self.template_sha,
            "task_id": self.task_id,
        }


class FakeCaptureStore(capture_pb2_grpc.CaptureStoreServicer):
    def __init__(self) -> None:
        self.segments: dict[tuple[str, str, str, int], StoredSegment] = {}
        self.calls = 0
        self.fail_next = 0  # inject UNAVAILABLE on the next N appends

    async def AppendSegment(
        self, request: capture_pb2.AppendSegmentRequest, context: grpc.aio.ServicerContext
    ) -> capture_pb2.AppendSegmentResponse:
        self.calls += 1
        if self.fail_next:
            self.fail_next -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "injected failure")
        k = request.key
        key = (k.run_id, k.trial_id, k.thread, k.segment_index)
        validate_tokens(request.tokens)
        seg = self.segments.get(key)
        if request.part_index == 0:
            if seg is not None:
                if seg.parts[0] == request:
                    return capture_pb2.AppendSegmentResponse(duplicate=True)
                raise FailedPrecondition(f"segment {key} part 0 exists with other content")
            if not request.prompt_ids or not request.task_id and not request.trial_id:
                raise InvalidArgument("part 0 needs prompt_ids")
            seg = StoredSegment(
                k.run_id, k.trial_id, k.thread, k.segment_index, request.thread_kind, request.trainable,
                unpack_i32(request.prompt_ids).tolist(), request.task_id, request.group_id, request.chat_template_sha256,
            )
            self.segments[key] = seg
        else:
            if seg is None:
                raise FailedPrecondition(f"segment {key}: part {request.part_index} before part 0")
            if request.part_index < len(seg.parts):
                if seg.parts[request.part_index] == request:
                    return capture_pb2.AppendSegmentResponse(duplicate=True)
                raise FailedPrecondition("part exists with other content")
            if request.part_index != len(seg.parts) or seg.closed:
                raise FailedPrecondition(f"segment {key}: part {request.part_index} out of order or after close")
        seg.parts.append(request)
        seg.closed |= request.close
        return capture_pb2.AppendSegmentResponse(segment_tokens=len(seg.prompt_ids))

    def export(self, trial_id: str) -> list[dict[str, Any]]:
        segs = [s for s in self.segments.values() if s.trial_id == trial_id]
        return [s.export() for s in sorted(segs, key=lambda s: (s.thread, s.index))]


async def start_fake(settings: ServiceSettings) -> tuple[RunningServer, FakeCaptureStore]:
    servicer = FakeCaptureStore()

    def register(server: grpc.aio.Server) -> list[str]:
        capture_pb2_grpc.add_CaptureStoreServicer_to_server(servicer, server)
        return ["harnessrl.v1.CaptureStore"]

    return await start_server(settings, "fake_capture", register), servicer
