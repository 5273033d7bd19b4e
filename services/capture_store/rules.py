"""The append, finalize and readiness rules, written once for both backends.

They run inside a backend transaction over a :class:`State` (a typed cache
of the transaction's reads and writes). Nothing reaches the index until the
transaction commits, so a refused request leaves nothing half-written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeVar

from harnessrl.captured import sampling_fields
from harnessrl.errors import FailedPrecondition, HarnessError
from harnessrl.v1 import capture_pb2
from services.capture_store import records as rec
from services.capture_store.backend import BlobRef, View
from services.capture_store.validate import PreparedAppend

R = TypeVar("R", bound=rec._Record)


class State:
    """Decoded records of one transaction; ``flush`` writes the changed ones."""

    def __init__(self, view: View) -> None:
        self.view = view
        self._cache: dict[rec.Key, rec._Record | None] = {}
        self._dirty: dict[rec.Key, rec._Record] = {}

    def prefetch(self, keys: list[rec.Key]) -> None:
        self.view.prefetch([k for k in keys if k not in self._cache])

    def get(self, key: rec.Key, cls: type[R]) -> R | None:
        if key not in self._cache:
            raw = self.view.get(key)
            self._cache[key] = None if raw is None else cls.loads(raw)
        return self._cache[key]  # type: ignore[return-value]

    def put(self, key: rec.Key, record: rec._Record) -> None:
        self._cache[key] = record
        self._dirty[key] = record

    def flush(self) -> None:
        for key, record in self._dirty.items():
            self.view.put(key, record.dumps())
        self._dirty.clear()


@dataclass
class AppendOutcome:
    duplicate: bool = False
    segment_tokens: int = 0
    error: HarnessError | None = None
    part: rec.PartRec | None = None  # set when this append stores a new part


def append_keys(p: PreparedAppend) -> list[rec.Key]:
    k = p.req.key
    return [rec.trial_key(k.run_id, k.trial_id), rec.seg_key(k.run_id, k.trial_id, k.thread, k.segment_index)]


def apply_append(state: State, p: PreparedAppend, now: float) -> AppendOutcome:
    """Decides one append against the stored state; errors are returned, not raised,
    so one bad part does not fail the others of its batch."""
    try:
        return _apply_append(state, p, now)
    except HarnessError as e:
        return AppendOutcome(error=e)


def _apply_append(state: State, p: PreparedAppend, now: float) -> AppendOutcome:
    # Every check comes before the first change, so a refused part changes nothing.
    req, k = p.req, p.req.key
    where = f"part {req.part_index} of segment {k.segment_index} of thread {k.thread!r} of trial {k.trial_id!r}"
    trial_k = rec.trial_key(k.run_id, k.trial_id)
    seg_k = rec.seg_key(k.run_id, k.trial_id, k.thread, k.segment_index)
    trial = state.get(trial_k, rec.TrialRec)
    seg = state.get(seg_k, rec.SegRec)
    if seg is not None and req.part_index < seg.n_parts:
        stored = state.get(rec.part_key(k.run_id, k.trial_id, k.thread, k.segment_index, req.part_index), rec.PartRec)
        if stored is None:
            raise FailedPrecondition(f"{where}: index lists the part but its record is missing")
        if stored.digest != p.digest:
            raise FailedPrecondition(f"{where} is already stored with different content")
        return AppendOutcome(duplicate=stored.write != p.write, segment_tokens=stored.cum)
    if trial is not None and trial.finalized:
        raise FailedPrecondition(f"{where}: trial is finalized; it takes no more appends")
    if req.part_index == 0:
        _check_opening(trial, p, where)
        trial, seg = _open_segment(state, p, trial, now)
    elif seg is None or trial is None:
        raise FailedPrecondition(f"{where}: the segment has no part 0 yet")
    elif req.part_index != seg.n_parts:
        raise FailedPrecondition(f"{where}: out of order, the segment has parts 0..{seg.n_parts - 1}")
    elif seg.closed:
        raise FailedPrecondition(f"{where}: the segment is closed")
    else:
        _check_same_thread(seg, p, where)
    _grow_segment(seg, p, now)
    state.put(seg_k, seg)
    new_versions = sorted(set(trial.versions) | set(p.versions))
    if new_versions != trial.versions:
        trial.versions = new_versions
        state.put(trial_k, trial)
    part = rec.PartRec(digest=p.digest, write=p.write, n=p.part.n, cum=seg.n_prompt + seg.n_tokens)
    state.put(rec.part_key(k.run_id, k.trial_id, k.thread, k.segment_index, req.part_index), part)
    return AppendOutcome(segment_tokens=part.cum, part=part)


def _check_opening(trial: rec.TrialRec | None, p: PreparedAppend, where: str) -> None:
    req, k = p.req, p.req.key
    thread = trial.thread(k.thread) if trial is not None else None
    if trial is not None:
        _check_identity(trial, req.task_id, req.group_id, where)
    if thread is not None and (thread.kind, thread.trainable) != (req.thread_kind, req.trainable):
        raise FailedPrecondition(
            f"{where}: thread is {thread.kind!r} trainable={thread.trainable}, "
            f"not {req.thread_kind!r} trainable={req.trainable}"
        )
    expected = thread.num_segments if thread is not None else 0
    if k.segment_index != expected:
        raise FailedPrecondition(
            f"{where}: segment index gap, the thread has {expected} segment(s); the next index is {expected}"
        )


def _open_segment(
    state: State, p: PreparedAppend, trial: rec.TrialRec | None, now: float
) -> tuple[rec.TrialRec, rec.SegRec]:
    req, k = p.req, p.req.key
    if trial is None:
        trial = rec.TrialRec(task_id=req.task_id, group_id=req.group_id, created_at=now)
        trial.seq = state.view.add_trial(k.run_id, k.trial_id)
    trial.group_id = trial.group_id or req.group_id
    thread = trial.thread(k.thread) or rec.ThreadRec(req.thread_kind, req.trainable, 0)
    if k.segment_index > 0:
        # A history rewrite opens segment s+1: segment s is complete.
        prev_k = rec.seg_key(k.run_id, k.trial_id, k.thread, k.segment_index - 1)
        prev = state.get(prev_k, rec.SegRec)
        if prev is not None and not prev.closed:
            prev.closed = True
            state.put(prev_k, prev)
    thread.num_segments += 1
    trial.set_thread(k.thread, thread)
    state.put(rec.trial_key(k.run_id, k.trial_id), trial)
    assert p.part.prompt is not None
    seg = rec.SegRec(
        kind=req.thread_kind, trainable=req.trainable, n_prompt=int(p.part.prompt.size), started_at=now, updated_at=now
    )
    if req.HasField("sampling"):
        seg.sampling = sampling_fields(req.sampling)
    return trial, seg


def _check_identity(trial: rec.TrialRec, task_id: str, group_id: str, where: str) -> None:
    if trial.task_id and task_id and trial.task_id != task_id:
        raise FailedPrecondition(f"{where}: trial belongs to task {trial.task_id!r}, not {task_id!r}")
    if trial.group_id and group_id and trial.group_id != group_id:
        raise FailedPrecondition(f"{where}: trial belongs to group {trial.group_id!r}, not {group_id!r}")


def _check_same_thread(seg: rec.SegRec, p: PreparedAppend, where: str) -> None:
    if (seg.kind, seg.trainable) != (p.req.thread_kind, p.req.trainable):
        raise FailedPrecondition(f"{where}: thread_kind/trainable differ from the segment's part 0")
    routes = p.part.routes
    if routes is not None and seg.layers and (seg.layers, seg.top_k) != routes.shape[1:]:
        raise FailedPrecondition(
            f"{where}: routed_experts shape [_, {routes.shape[1]}, {routes.shape[2]}] differs from the "
            f"segment's [_, {seg.layers}, {seg.top_k}]"
        )


def _grow_segment(seg: rec.SegRec, p: PreparedAppend, now: float) -> None:
    req = p.req
    if p.part.routes is not None:
        seg.layers, seg.top_k = int(p.part.routes.shape[1]), int(p.part.routes.shape[2])
    # Usage is derived from the tokens themselves (a writer's counts are checked in
    # validate): prompt = what the engine saw for this call (the segment so far and
    # the part's context), completion = the part's mask-1 tokens.
    seen = seg.n_prompt + seg.n_tokens + p.part.n - p.n_sampled if p.n_sampled else 0
    seg.usage = [
        seg.usage[0] + seen,
        seg.usage[1] + p.n_sampled,
        seg.usage[2] + min(req.usage.cached_prompt_tokens, seen),
    ]
    seg.n_parts += 1
    seg.n_turns += p.n_sampled > 0
    seg.n_tokens += p.part.n
    seg.n_sampled += p.n_sampled
    seg.finish_reason = req.finish_reason or seg.finish_reason
    seg.model = req.model or seg.model
    seg.template = req.chat_template_sha256 or seg.template
    seg.updated_at = now
    seg.closed = req.close


def set_ref(part: rec.PartRec, ref: BlobRef) -> None:
    part.obj, part.off, part.len = ref.obj, ref.off, ref.len


def apply_finalize(
    state: State, req: capture_pb2.FinalizeTrajectoryRequest, digest: str, write: str
) -> capture_pb2.FinalizeTrajectoryResponse:
    """Records a trial's outcome; completes its group when it is the last of ``group_size``."""
    where = f"trial {req.trial_id!r} of run {req.run_id!r}"
    trial_k = rec.trial_key(req.run_id, req.trial_id)
    group_k = rec.group_key(req.run_id, req.group_id)
    state.prefetch([trial_k, group_k])
    trial = state.get(trial_k, rec.TrialRec)
    if trial is not None and trial.finalized:
        if trial.final_digest != digest:
            raise FailedPrecondition(f"{where} is already finalized with a different outcome")
        return capture_pb2.FinalizeTrajectoryResponse(
            group_ready=trial.completed_group, duplicate=trial.final_write != write
        )
    # A trial may end with no captured segment whatever its reason (a harness
    # that crashed before its first model call, a model-less harness): it is
    # recorded, with no tokens, so its group still completes. The sandbox
    # finalizes only after the proxy's close, so nothing captured is missing.
    if trial is not None:
        _check_identity(trial, req.task_id, req.group_id, where)
    group = state.get(group_k, rec.GroupRec) or rec.GroupRec(req.task_id, req.group_size, req.step)
    if group.group_size != req.group_size or group.task_id != req.task_id:
        raise FailedPrecondition(
            f"{where}: group {req.group_id!r} is task {group.task_id!r} of size {group.group_size}, "
            f"not task {req.task_id!r} of size {req.group_size}"
        )
    if group.ready:
        raise FailedPrecondition(f"{where}: group {req.group_id!r} already has all {group.group_size} trials final")
    if trial is None:
        trial = rec.TrialRec(task_id=req.task_id, group_id=req.group_id, created_at=time.time())
        trial.seq = state.view.add_trial(req.run_id, req.trial_id)
    group.trials.append(req.trial_id)
    state.put(group_k, group)
    if group.ready:
        ready = capture_pb2.ReadyGroup(
            run_id=req.run_id, group_id=req.group_id, task_id=group.task_id, step=group.step, trial_ids=group.trials
        )
        state.view.add_ready(req.run_id, req.group_id, ready.SerializeToString())
    trial.task_id, trial.group_id = req.task_id, req.group_id
    trial.final_digest, trial.final_write, trial.finalized_at = digest, write, time.time()
    trial.completed_group = group.ready
    state.put(trial_k, trial)
    state.view.put(rec.final_key(req.run_id, req.trial_id), req.SerializeToString(deterministic=True))
    return capture_pb2.FinalizeTrajectoryResponse(group_ready=group.ready, duplicate=False)
