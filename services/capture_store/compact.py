"""Compaction of finalized trajectories into one blob object per segment.

Appends store each batch of parts as one object, so a long segment's parts
sit in as many objects as it had turns; reading it from S3 costs one ranged
GET per part. Once a trial is final its segments no longer change, so each is
rewritten into a single object (the encoded part blobs, concatenated as they
are), the part records are repointed in one transaction, and batch objects no
part references any more are deleted (parts count references per object).
A reader that raced a deletion rereads the refs (:class:`BlobMissing`).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter

from services.capture_store import assemble, rules
from services.capture_store import records as rec
from services.capture_store.backend import Backend, BlobRef, Retrier

log = logging.getLogger(__name__)


class _Changed(Exception):
    """The segment's part records moved meanwhile (another compaction, a deleted run)."""


def compact_trial(backend: Backend, retry: Retrier, run: str, trial: str) -> int:
    """Compacts every segment of a finalized trial; returns how many were rewritten."""
    raw = backend.get_many([rec.trial_key(run, trial)])[0]
    if raw is None:
        return 0
    record = rec.TrialRec.loads(raw)
    if not record.finalized:
        return 0
    done = 0
    for thread, index in assemble.segment_entries(record):
        done += retry.call(functools.partial(_compact_segment, backend, run, trial, thread, index), "compact")
    if done:
        log.info("compacted", extra={"kv": {"run": run, "trial": trial, "segments": done}})
    return done


def _compact_segment(backend: Backend, run: str, trial: str, thread: str, index: int) -> int:
    raw = backend.get_many([rec.seg_key(run, trial, thread, index)])[0]
    if raw is None:
        return 0
    seg = rec.SegRec.loads(raw)
    keys = [rec.part_key(run, trial, thread, index, p) for p in range(seg.n_parts)]
    raws = backend.get_many(keys)
    if any(r is None for r in raws):
        return 0
    parts = [rec.PartRec.loads(r) for r in raws if r is not None]
    if len({p.obj for p in parts}) <= 1:
        return 0
    blobs = backend.read_blobs(run, [BlobRef(p.obj, p.off, p.len) for p in parts])
    new = backend.write_blobs(run, blobs, kind="segments")
    try:
        _repoint(backend, run, keys, parts, new)
    except Exception:
        backend.delete_objects(run, [new[0].obj])  # unused; a retry writes its own
        raise
    old = sorted({p.obj for p in parts})
    backend.release_objects(run, old)
    return 1


def _repoint(backend: Backend, run: str, keys: list[rec.Key], parts: list[rec.PartRec], new: list[BlobRef]) -> None:
    try:
        with backend.transaction() as view:
            state = rules.State(view)
            state.prefetch(keys)
            for key, before, ref in zip(keys, parts, new, strict=True):
                current = state.get(key, rec.PartRec)
                if current is None or (current.obj, current.off) != (before.obj, before.off):
                    raise _Changed
                rules.set_ref(current, ref)
                state.put(key, current)
            view.add_refs(run, new[0].obj, len(new))
            for obj, count in Counter(p.obj for p in parts).items():
                view.add_refs(run, obj, -count)
            state.flush()
    except _Changed:
        backend.delete_objects(run, [new[0].obj])
