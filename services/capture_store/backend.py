"""The storage interface both backends implement, and the bounded retry loop.

A backend is (1) a transactional key-value index whose keys all start with a
run (:mod:`records`), (2) a blob store of encoded parts, one object per
part-batch, and (3) per-run ready streams with consumer groups. The append,
finalize and readiness rules live once, in :mod:`rules`, and run inside
:meth:`Backend.transaction`, so the two backends cannot drift apart.
"""

from __future__ import annotations

import abc
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TypeVar

from harnessrl.errors import Unavailable
from services.capture_store.records import Key
from services.capture_store.settings import RetryPolicy

log = logging.getLogger(__name__)
T = TypeVar("T")


class Conflict(Exception):
    """Another writer changed what a transaction read (Redis WATCH); rerun it."""


class BlobMissing(Exception):
    """A referenced blob object is gone: compaction moved its parts after the refs were read."""


@dataclass(frozen=True)
class BlobRef:
    obj: str
    off: int
    len: int


@dataclass(frozen=True)
class Delivery:
    """One ready group handed to a consumer; ``entry`` is the backend's id for acks."""

    entry: str
    payload: bytes  # a serialized ReadyGroup without ``redeliveries``
    redeliveries: int


class View(abc.ABC):
    """Reads and buffered writes of one index transaction."""

    @abc.abstractmethod
    def prefetch(self, keys: Iterable[Key]) -> None:
        """Loads ``keys`` in one round trip (and, in Redis, watches them)."""

    @abc.abstractmethod
    def get(self, key: Key) -> bytes | None: ...

    @abc.abstractmethod
    def put(self, key: Key, value: bytes) -> None: ...

    @abc.abstractmethod
    def add_trial(self, run: str, trial: str) -> int:
        """Appends ``trial`` to the run's listing order; returns its sequence number."""

    @abc.abstractmethod
    def add_ready(self, run: str, group_id: str, payload: bytes) -> None:
        """Appends a ready group to the run's ready stream (committed with the rest)."""

    def add_refs(self, run: str, obj: str, delta: int) -> None:  # noqa: B027 - only compacting backends count
        """Changes the number of parts that reference blob object ``obj``."""


class Backend(abc.ABC):
    name: str
    # Whether finalized trajectories are rewritten into one object per segment:
    # worth it where each blob read is a network round trip (S3), not for local files.
    compacts: bool = False

    @abc.abstractmethod
    def transaction(self) -> AbstractContextManager[View]:
        """A transaction: commits on a clean exit, raises :class:`Conflict` if it lost a race."""

    @abc.abstractmethod
    def get_many(self, keys: list[Key]) -> list[bytes | None]:
        """Reads outside a transaction (consistent per key)."""

    @abc.abstractmethod
    def write_blobs(self, run: str, blobs: list[bytes], kind: str = "parts") -> list[BlobRef]:
        """Stores ``blobs`` durably as one object of ``run`` before returning their refs."""

    def release_objects(self, run: str, objs: list[str]) -> list[str]:
        """Deletes the objects no part references any more; returns them (compacting backends)."""
        return []

    def delete_objects(self, run: str, objs: list[str]) -> None:  # noqa: B027 - only compacting backends
        """Deletes blob objects unconditionally (an unused compaction result)."""

    @abc.abstractmethod
    def read_blobs(self, run: str, refs: list[BlobRef]) -> list[bytes]: ...

    @abc.abstractmethod
    def list_trials(self, run: str, after_seq: int, limit: int) -> list[tuple[int, str]]:
        """``(seq, trial_id)`` of the run's trials with ``seq > after_seq``, in order."""

    @abc.abstractmethod
    def count_trials(self, run: str) -> int: ...

    @abc.abstractmethod
    def runs_with_trial(self, trial: str) -> list[str]:
        """Runs holding a trial of that id (operator tools; scans the index)."""

    @abc.abstractmethod
    def delete_run(self, run: str) -> None:
        """Deletes every record and blob of ``run``; idempotent."""

    @abc.abstractmethod
    def runs_updated_before(self, cutoff: float) -> list[tuple[str, float]]:
        """Runs whose last write is older than ``cutoff`` (unix seconds), with that time."""

    # Ready streams with consumer groups.
    @abc.abstractmethod
    def ready_subscribe(self, run: str, group: str, consumer: str, lease_s: float) -> None:
        """Creates the consumer group if needed (from the start of the stream); marks the consumer alive."""

    @abc.abstractmethod
    def ready_claim(self, run: str, group: str, consumer: str, own: bool) -> list[Delivery]:
        """Moves unacked deliveries of dead consumers (and, if ``own``, this consumer's) to it."""

    @abc.abstractmethod
    def ready_read(self, run: str, group: str, consumer: str, count: int) -> list[Delivery]:
        """New entries never delivered to this consumer group (non-blocking)."""

    @abc.abstractmethod
    def ready_find(self, run: str, group_id: str) -> str | None:
        """The stream entry of a ready group, or None if the group was never ready."""

    @abc.abstractmethod
    def ready_ack(self, run: str, group: str, entry: str) -> None: ...

    @abc.abstractmethod
    def ready_heartbeat(self, run: str, group: str, consumer: str, lease_s: float) -> None: ...

    @abc.abstractmethod
    def ready_leave(self, run: str, group: str, consumer: str) -> None:
        """Marks the consumer dead now, so its unacked groups go to the next subscriber."""

    @abc.abstractmethod
    def is_transient(self, exc: BaseException) -> bool:
        """True for errors worth retrying: connection refused, server loading, 5xx, locks."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class Retrier:
    """Runs an operation until it succeeds, retrying transient backend errors
    and transaction conflicts with exponential backoff and jitter, for at most
    ``policy.total_s``; then raises Unavailable naming the last error."""

    def __init__(self, policy: RetryPolicy, is_transient: Callable[[BaseException], bool], what: str) -> None:
        self._policy = policy
        self._is_transient = is_transient
        self._what = what

    def delays(self) -> Iterator[float]:
        delay = self._policy.initial_s
        while True:
            yield delay * (0.5 + random.random() / 2)
            delay = min(delay * 2, self._policy.max_s)

    def call(self, fn: Callable[[], T], op: str) -> T:
        deadline = time.monotonic() + self._policy.total_s
        delays = self.delays()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except Conflict:
                if time.monotonic() > deadline:
                    raise Unavailable(f"{self._what}: {op} kept conflicting with other writers") from None
                time.sleep(random.random() * 0.01)  # let the other writer finish
                continue
            except Exception as e:
                if not self._is_transient(e):
                    raise
                delay = next(delays)
                if time.monotonic() + delay > deadline:
                    raise Unavailable(
                        f"{self._what} unavailable: {op} failed {attempt} times over "
                        f"{self._policy.total_s:g}s; last error: {type(e).__name__}: {e}"
                    ) from e
                log.warning(
                    "backend error, retrying",
                    extra={"kv": {"op": op, "attempt": attempt, "delay_s": round(delay, 3), "error": repr(e)[:200]}},
                )
                time.sleep(delay)
