"""Index records and their keys, shared by both backends.

Both backends are a transactional key-value index (SQLite table or Redis
strings) plus a blob store; the records below are its values, serialized as
compact JSON. Every key starts with its run, so one run's data can never be
addressed through another run (the per-run namespace) and a run deletes as a
prefix.

Keys: ``trial/<t>``, ``final/<t>`` (the FinalizeTrajectoryRequest bytes),
``seg/<t>/<thread>/<s>``, ``part/<t>/<thread>/<s>/<p>``, ``group/<g>``;
components are percent-encoded so no id can forge another key.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote

from harnessrl.v1 import records_pb2


class Key(NamedTuple):
    run: str
    name: str


def _q(value: str) -> str:
    return quote(value, safe="")


def trial_key(run: str, trial: str) -> Key:
    return Key(run, f"trial/{_q(trial)}")


def final_key(run: str, trial: str) -> Key:
    return Key(run, f"final/{_q(trial)}")


def seg_key(run: str, trial: str, thread: str, segment: int) -> Key:
    return Key(run, f"seg/{_q(trial)}/{_q(thread)}/{segment}")


def part_key(run: str, trial: str, thread: str, segment: int, part: int) -> Key:
    return Key(run, f"part/{_q(trial)}/{_q(thread)}/{segment}/{part}")


def group_key(run: str, group: str) -> Key:
    return Key(run, f"group/{_q(group)}")


R = TypeVar("R", bound="_Record")


class _Record:
    def dumps(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()  # type: ignore[call-overload]

    @classmethod
    def loads(cls: type[R], data: bytes) -> R:
        raw: dict[str, Any] = json.loads(data)
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass
class ThreadRec:
    kind: str
    trainable: bool
    num_segments: int


@dataclass
class TrialRec(_Record):
    """A trial: created by its first append (or by a finalize that needs no segments)."""

    task_id: str
    group_id: str
    created_at: float
    seq: int = 0
    threads: dict[str, list[Any]] = field(default_factory=dict)  # name -> [kind, trainable, num_segments]
    versions: list[int] = field(default_factory=list)
    final_digest: str = ""
    final_write: str = ""
    finalized_at: float = 0.0
    completed_group: bool = False

    @property
    def finalized(self) -> bool:
        return bool(self.final_digest)

    def thread(self, name: str) -> ThreadRec | None:
        raw = self.threads.get(name)
        return None if raw is None else ThreadRec(str(raw[0]), bool(raw[1]), int(raw[2]))

    def set_thread(self, name: str, rec: ThreadRec) -> None:
        self.threads[name] = [rec.kind, rec.trainable, rec.num_segments]


@dataclass
class SegRec(_Record):
    """A segment's metadata; its tokens live in the blobs of its parts."""

    kind: str
    trainable: bool
    n_prompt: int
    started_at: float
    updated_at: float
    n_parts: int = 0
    n_turns: int = 0  # parts that carried sampled tokens: model calls (a close-only part is none)
    n_tokens: int = 0  # response tokens (all parts)
    n_sampled: int = 0
    finish_reason: str = ""
    usage: list[int] = field(default_factory=lambda: [0, 0, 0])  # prompt, completion, cached: summed over calls
    model: str = ""
    template: str = ""
    closed: bool = False
    layers: int = 0  # routed-experts shape, 0 when no part carried routes
    top_k: int = 0
    # records_pb2.SegmentSampling's fields as part 0 carried them; empty when it carried none.
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass
class PartRec(_Record):
    """Where a part's blob lives and what identifies its content."""

    digest: str
    write: str  # id of the append attempt that stored it: tells our own retry from a caller's
    obj: str = ""  # blob object (pack file or S3 key), offset and length
    off: int = 0
    len: int = 0
    n: int = 0
    cum: int = 0  # tokens in the segment (prompt included) after this part


@dataclass
class GroupRec(_Record):
    task_id: str
    group_size: int
    step: int
    trials: list[str] = field(default_factory=list)  # finalized trial ids, in finalize order

    @property
    def ready(self) -> bool:
        return len(self.trials) >= self.group_size


def sampling_proto(data: dict[str, Any]) -> records_pb2.SegmentSampling:
    known = {f.name for f in records_pb2.SegmentSampling.DESCRIPTOR.fields}
    return records_pb2.SegmentSampling(**{k: v for k, v in data.items() if k in known})
