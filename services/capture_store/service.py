"""The capture store service: appends with group commit, finalization,
reads, listing and retention over one :class:`Backend`.

Group commit: appends that arrive while a batch is being made durable wait
and go together in the next batch (one blob object, one index transaction,
one fsync or S3 PUT), so 64 concurrent writers cost a handful of fsyncs a
batch, not 64. Every caller waits until its own part is durable.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

from harnessrl.errors import FailedPrecondition, HarnessError, InvalidArgument, NotFound, Unavailable
from harnessrl.v1 import capture_pb2, records_pb2
from services.capture_store import assemble, codec, compact, rules, validate
from services.capture_store import records as rec
from services.capture_store.backend import Backend, BlobMissing, BlobRef, Retrier
from services.capture_store.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_PAGE = 100
MAX_PAGE = 1000
SCAN_LIMIT = 10_000  # trials examined per ListTrajectories page at most


class CaptureService:
    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        self.retry = Retrier(settings.retry, backend.is_transient, f"capture store ({backend.name} backend)")
        self._pending: list[tuple[validate.PreparedAppend, asyncio.Future[rules.AppendOutcome]]] = []
        self._wake = asyncio.Event()
        self._committer: asyncio.Task[None] | None = None
        self._ready_waiters: set[asyncio.Event] = set()
        self._closing = False
        self._compactions: set[asyncio.Task[int]] = set()

    async def start(self) -> None:
        self._committer = asyncio.create_task(self._commit_loop(), name="capture-committer")

    async def close(self) -> None:
        """Commits what is pending, then closes the backend."""
        self._closing = True
        self._wake.set()
        if self._committer is not None:
            await self._committer
        await asyncio.gather(*self._compactions, return_exceptions=True)
        await asyncio.to_thread(self.backend.close)

    async def call(self, fn: Any, op: str) -> Any:
        """Runs a blocking backend operation in a thread, with the bounded retry."""
        return await asyncio.to_thread(self.retry.call, fn, op)

    # Appends -------------------------------------------------------------
    async def append(self, req: capture_pb2.AppendSegmentRequest) -> capture_pb2.AppendSegmentResponse:
        prepared = validate.prepare_append(req, self.settings)
        if self._closing:
            raise Unavailable("capture store is shutting down")
        future: asyncio.Future[rules.AppendOutcome] = asyncio.get_running_loop().create_future()
        self._pending.append((prepared, future))
        self._wake.set()
        outcome = await asyncio.shield(future)  # a cancelled caller must not cancel the batch
        if outcome.error is not None:
            raise outcome.error
        return capture_pb2.AppendSegmentResponse(duplicate=outcome.duplicate, segment_tokens=outcome.segment_tokens)

    async def _commit_loop(self) -> None:
        while not self._closing or self._pending:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._pending[: self.settings.max_batch_parts]
                del self._pending[: len(batch)]
                try:
                    outcomes = await asyncio.to_thread(self._commit_parts, [p for p, _ in batch])
                except Exception as e:  # broad: every waiter of the batch gets the error, the writer loop goes on
                    if not isinstance(e, HarnessError):
                        log.exception("append batch failed", extra={"kv": {"parts": len(batch)}})
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                for (_, fut), outcome in zip(batch, outcomes, strict=True):
                    if not fut.done():
                        fut.set_result(outcome)

    def _commit_parts(self, items: list[validate.PreparedAppend]) -> list[rules.AppendOutcome]:
        """Decides, stores blobs, then indexes one batch; blobs written by an
        attempt that lost a race or hit an outage are reused by the next."""
        refs: dict[str, BlobRef] = {}  # survive retries: a blob written once is reused
        level, f16 = self.settings.zstd_level, self.settings.logprob_dtype == "float16"

        def attempt() -> list[rules.AppendOutcome]:
            with self.backend.transaction() as view:
                state = rules.State(view)
                state.prefetch([k for p in items for k in rules.append_keys(p)])
                now = time.time()
                outcomes = [rules.apply_append(state, p, now) for p in items]
                todo: dict[str, list[validate.PreparedAppend]] = defaultdict(list)
                for p, o in zip(items, outcomes, strict=True):
                    if o.part is not None and p.write not in refs:
                        todo[p.req.key.run_id].append(p)
                for run, parts in todo.items():
                    blobs = [codec.encode(p.part, float16=f16, level=level) for p in parts]
                    refs.update(zip((p.write for p in parts), self.backend.write_blobs(run, blobs), strict=True))
                counts: Counter[tuple[str, str]] = Counter()
                for p, o in zip(items, outcomes, strict=True):
                    if o.part is not None:
                        rules.set_ref(o.part, refs[p.write])
                        counts[(p.req.key.run_id, o.part.obj)] += 1
                if self.backend.compacts:
                    for (run, obj), n in counts.items():
                        view.add_refs(run, obj, n)
                state.flush()
            return outcomes

        return self.retry.call(attempt, "append")

    # Finalize ------------------------------------------------------------
    async def finalize(self, req: capture_pb2.FinalizeTrajectoryRequest) -> capture_pb2.FinalizeTrajectoryResponse:
        validate.check_finalize(req)
        digest, write = validate.digest(req), uuid.uuid4().hex

        def attempt() -> capture_pb2.FinalizeTrajectoryResponse:
            with self.backend.transaction() as view:
                state = rules.State(view)
                resp = rules.apply_finalize(state, req, digest, write)
                state.flush()
            return resp

        resp: capture_pb2.FinalizeTrajectoryResponse = await self.call(attempt, "finalize")
        if self.backend.compacts and not resp.duplicate:
            self._spawn_compaction(req.run_id, req.trial_id)
        if resp.group_ready and not resp.duplicate:
            log.info("group ready", extra={"kv": {"run": req.run_id, "group": req.group_id}})
            for event in self._ready_waiters:
                event.set()
        return resp

    def _spawn_compaction(self, run: str, trial: str) -> None:
        task = asyncio.create_task(asyncio.to_thread(compact.compact_trial, self.backend, self.retry, run, trial))
        self._compactions.add(task)
        task.add_done_callback(self._compaction_done)

    def _compaction_done(self, task: asyncio.Task[int]) -> None:
        self._compactions.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The trajectory stays readable as it was; only its read cost is higher.
            log.warning("compaction failed", extra={"kv": {"error": repr(task.exception())[:300]}})

    def add_ready_waiter(self, event: asyncio.Event) -> None:
        self._ready_waiters.add(event)

    def remove_ready_waiter(self, event: asyncio.Event) -> None:
        self._ready_waiters.discard(event)

    # Reads ---------------------------------------------------------------
    async def get(self, run: str, trial_id: str, include_tokens: bool) -> records_pb2.Trajectory:
        validate.check_run(run)
        validate.check_id(trial_id, "trial_id")
        return await self.call(lambda: self._get(run, trial_id, include_tokens), "get")  # type: ignore[no-any-return]

    def _get(self, run: str, trial_id: str, include_tokens: bool) -> records_pb2.Trajectory:
        raw_trial, raw_final = self.backend.get_many([rec.trial_key(run, trial_id), rec.final_key(run, trial_id)])
        if raw_trial is None:
            raise NotFound(f"no trial {trial_id!r} in run {run!r}")
        trial = rec.TrialRec.loads(raw_trial)
        entries = assemble.segment_entries(trial)
        seg_raws = self.backend.get_many([rec.seg_key(run, trial_id, t, i) for t, i in entries])
        segs = [rec.SegRec.loads(r) for r in seg_raws if r is not None]
        if len(segs) != len(entries):
            raise FailedPrecondition(f"trial {trial_id!r} of run {run!r}: segment records missing from the index")
        parts: list[list[codec.Part] | None] = [None] * len(segs)
        if include_tokens:
            size = sum(assemble.estimated_bytes(s) for s in segs)
            if size > self.settings.max_response_bytes:
                raise FailedPrecondition(
                    f"trial {trial_id!r} has ~{size / 2**20:.0f} MiB of token arrays, over the "
                    f"{self.settings.max_response_bytes / 2**20:.0f} MiB limit; read it without tokens or export it"
                )
            parts = self._read_parts_retrying(run, trial_id, entries, segs)
        segments = [
            assemble.segment_proto(run, trial_id, t, i, seg, p)
            for (t, i), seg, p in zip(entries, segs, parts, strict=True)
        ]
        final = capture_pb2.FinalizeTrajectoryRequest.FromString(raw_final) if raw_final else None
        return assemble.trajectory_proto(run, trial_id, trial, final, segments)

    def _read_parts_retrying(
        self, run: str, trial_id: str, entries: list[tuple[str, int]], segs: list[rec.SegRec]
    ) -> list[list[codec.Part] | None]:
        """Reads the segments' parts; rereads the part records if compaction moved them meanwhile."""
        for attempt in range(3):
            try:
                return list(self._read_parts(run, trial_id, entries, segs))
            except BlobMissing:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _read_parts(
        self, run: str, trial_id: str, entries: list[tuple[str, int]], segs: list[rec.SegRec]
    ) -> list[list[codec.Part]]:
        keys = [
            rec.part_key(run, trial_id, t, i, p)
            for (t, i), s in zip(entries, segs, strict=True)
            for p in range(s.n_parts)
        ]
        raws = self.backend.get_many(keys)
        if any(r is None for r in raws):
            raise FailedPrecondition(f"trial {trial_id!r} of run {run!r}: part records missing from the index")
        part_recs = [rec.PartRec.loads(r) for r in raws if r is not None]
        blobs = self.backend.read_blobs(run, [BlobRef(p.obj, p.off, p.len) for p in part_recs])
        decoded = [codec.decode(b) for b in blobs]
        out, pos = [], 0
        for s in segs:
            out.append(decoded[pos : pos + s.n_parts])
            pos += s.n_parts
        return out

    async def list_trajectories(self, req: capture_pb2.ListTrajectoriesRequest) -> capture_pb2.ListTrajectoriesResponse:
        validate.check_run(req.run_id)
        if req.page_size > MAX_PAGE:
            raise InvalidArgument(f"page_size {req.page_size} is over the limit of {MAX_PAGE}")
        fingerprint = _filter_fingerprint(req)
        after = _decode_page_token(req.page_token, fingerprint)
        return await self.call(lambda: self._list(req, after, fingerprint), "list")  # type: ignore[no-any-return]

    def _list(
        self, req: capture_pb2.ListTrajectoriesRequest, after: int, fingerprint: str
    ) -> capture_pb2.ListTrajectoriesResponse:
        page = req.page_size or DEFAULT_PAGE
        resp = capture_pb2.ListTrajectoriesResponse()
        examined = 0
        while len(resp.trajectories) < page and examined < SCAN_LIMIT:
            rows = self.backend.list_trials(req.run_id, after, min(page * 2, SCAN_LIMIT - examined))
            if not rows:
                return resp
            keys = [k for _, t in rows for k in (rec.trial_key(req.run_id, t), rec.final_key(req.run_id, t))]
            raws = self.backend.get_many(keys)
            for i, (seq, trial_id) in enumerate(rows):
                examined, after = examined + 1, seq
                raw_trial, raw_final = raws[2 * i], raws[2 * i + 1]
                if raw_trial is None:
                    continue  # deleted meanwhile
                trial = rec.TrialRec.loads(raw_trial)
                final = capture_pb2.FinalizeTrajectoryRequest.FromString(raw_final) if raw_final else None
                if _matches(req, trial, final):
                    resp.trajectories.append(self._metadata(req.run_id, trial_id, trial, final))
                    if len(resp.trajectories) == page:
                        break
        if self.backend.list_trials(req.run_id, after, 1):
            resp.next_page_token = _encode_page_token(after, fingerprint)
        return resp

    def _metadata(
        self, run: str, trial_id: str, trial: rec.TrialRec, final: capture_pb2.FinalizeTrajectoryRequest | None
    ) -> records_pb2.Trajectory:
        entries = assemble.segment_entries(trial)
        raws = self.backend.get_many([rec.seg_key(run, trial_id, t, i) for t, i in entries])
        segments = [
            assemble.segment_proto(run, trial_id, t, i, rec.SegRec.loads(r), None)
            for (t, i), r in zip(entries, raws, strict=True)
            if r is not None
        ]
        return assemble.trajectory_proto(run, trial_id, trial, final, segments)

    # Retention -----------------------------------------------------------
    async def delete_run(self, run: str) -> int:
        validate.check_run(run)

        def delete() -> int:
            count = self.backend.count_trials(run)
            self.backend.delete_run(run)
            return count

        count: int = await self.call(delete, "delete_run")
        log.warning("deleted run", extra={"kv": {"run": run, "trajectories": count, "backend": self.backend.name}})
        return count

    async def sweep(self, older_than_s: float, dry_run: bool = False) -> list[tuple[str, float, int]]:
        """Deletes every run whose last write is older than ``older_than_s``; returns (run, last write, trials)."""
        cutoff = time.time() - older_than_s
        stale = await self.call(lambda: self.backend.runs_updated_before(cutoff), "sweep")
        done = []
        for run, updated in stale:
            if dry_run:
                count = await self.call(lambda r=run: self.backend.count_trials(r), "sweep")
            else:
                count = await self.delete_run(run)
            log.warning(
                "swept run" if not dry_run else "would sweep run",
                extra={"kv": {"run": run, "last_write": round(updated), "trajectories": count}},
            )
            done.append((run, updated, count))
        return done


def _matches(
    req: capture_pb2.ListTrajectoriesRequest, trial: rec.TrialRec, final: capture_pb2.FinalizeTrajectoryRequest | None
) -> bool:
    if req.finalized_only and final is None:
        return False
    if req.task_id and trial.task_id != req.task_id:
        return False
    if req.group_id and trial.group_id != req.group_id:
        return False
    needs_final = req.HasField("step") or req.termination_reason or req.HasField("min_reward")
    if final is None:
        return not (needs_final or req.HasField("max_reward"))
    if req.HasField("step") and final.step != req.step:
        return False
    if req.termination_reason and final.termination_reason != req.termination_reason:
        return False
    if (req.HasField("min_reward") or req.HasField("max_reward")) and not final.has_reward:
        return False
    if req.HasField("min_reward") and final.reward < req.min_reward:
        return False
    return not (req.HasField("max_reward") and final.reward > req.max_reward)


def _filter_fingerprint(req: capture_pb2.ListTrajectoriesRequest) -> str:
    probe = capture_pb2.ListTrajectoriesRequest()
    probe.CopyFrom(req)
    probe.page_size, probe.page_token = 0, ""
    return hashlib.blake2b(probe.SerializeToString(deterministic=True), digest_size=6).hexdigest()


def _encode_page_token(after: int, fingerprint: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([after, fingerprint]).encode()).decode()


def _decode_page_token(token: str, fingerprint: str) -> int:
    if not token:
        return 0
    try:
        after, issued_for = json.loads(base64.urlsafe_b64decode(token.encode()))
        after = int(after)
    except (ValueError, TypeError) as e:
        raise InvalidArgument(f"page_token {token[:40]!r} is not one this store issued") from e
    if issued_for != fingerprint:
        raise InvalidArgument("page_token belongs to a listing with other filters; keep the filters across pages")
    return after
