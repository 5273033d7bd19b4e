"""A warm pool for the Docker backend (``[sandbox.docker] warm_pool``): containers created
and started from a task's prepared image before a trial asks for one, so a trial's start is
a directory rename, not a container create and start (~0.4-0.5 s of the engine's time
here), and removed behind it, so its stop returns once its relay is closed.

Each warm container is handed to exactly one trial and never taken back: the trial's
``stop`` removes it (and the verifier's container, the commits) as before, but in the
background (``behind``: the outcome was read before, nothing of the trial runs after; at
most ``2 * size + 2`` at once, then stop waits), and the pool starts a new one. No trial
sees what another did.

Whatever the container fixes at create time is the trial's exactly, so the pool keeps one
queue per ``PoolKey``: the prepared image (by id), the workdir, the read-only mounts (the
harness's install paths, and which directory each is: a reinstall replaced in place is a
new key), the limits, the disk quota and root's setup script (which the pool runs at
start, as ``DockerBackend.start`` does). Every other create argument is the backend's own
(``docker_specs.container_spec``: ``--network none``, the agent user's capabilities,
no-new-privileges, the /tmp tmpfs, init), identical for every trial.

What is the trial's own is bound at take: a warm container mounts a pool slot's
directories (HOME, the runtime dir, /logs/agent, /logs/artifacts); the trial adopts the
slot by renaming the slot's directory to its own trial directory (a bind mount follows
the directory, not its path; the mounts are empty until then); the container is renamed to
the trial's name in the background (for people: nothing reads it). Its env, its user and
its relay to the proxy are per exec, as before.

Which keys: the pool learns them from the trials it sees (the first trial of a task starts
a container the usual way and asks the pool to keep ``size`` ready for the next), keeping
the ``keys`` most recently asked for; a key pushed out is drained. A compose task's
container joins its services' namespace, made per trial: never pooled.

Warm containers carry the worker's identity like every other (a dead worker's are reaped
by ``cleanup_orphans``, their slot directories with them); ``drain`` removes them all at
shutdown and when a worker stops, after the releases under way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docker.errors import APIError
from requests.exceptions import RequestException

from services.sandbox.backends.base import Limits, SandboxSpec
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import TrialDirs

log = logging.getLogger(__name__)

# What a launch, a rename or a removal raises when the engine or the disk refuses.
_REFUSED = (APIError, RequestException, EnvSetupError, OSError)
# A slot's directory under the work dir (the trial directories' filesystem: a rename, not a copy).
SLOT_PREFIX = "warm-"


@dataclass(frozen=True)
class PoolKey:
    """Everything a trial's container fixes at create time but its own directories and name."""

    image: str
    workdir: str
    # (path, st_dev, st_ino, st_ctime_ns) of each read-only mount: a directory replaced under its
    # path is a new key (its inode number may be the old one's, reused; its ctime is its own).
    mounts: tuple[tuple[str, int, int, int], ...]
    limits: Limits
    disk_quota: bool
    setup: str

    @classmethod
    def of(cls, spec: SandboxSpec, image: str, workdir: str, *, disk_quota: bool, setup: str) -> PoolKey:
        mounts = []
        for path in spec.ro_mounts:
            st = os.stat(path)
            mounts.append((str(path), st.st_dev, st.st_ino, st.st_ctime_ns))
        return cls(image, workdir, tuple(mounts), spec.limits, disk_quota, setup)


@dataclass
class Warm:
    container: Any
    dirs: TrialDirs


# Starts one container for a slot's spec (``DockerBackend._launch``); removes one (force).
Launch = Callable[[SandboxSpec, PoolKey], Awaitable[Any]]
Remove = Callable[[Any], Awaitable[None]]


@dataclass
class _Queue:
    template: SandboxSpec
    ready: deque[Warm] = field(default_factory=deque)
    filler: asyncio.Task[None] | None = None


class WarmPool:
    def __init__(self, work_dir: Path, size: int, keys: int, launch: Launch, remove: Remove) -> None:
        self.work_dir, self.size, self.keys = work_dir, size, keys
        self._launch, self._remove = launch, remove
        self._queues: OrderedDict[PoolKey, _Queue] = OrderedDict()
        self._closed = False
        # Renames and releases under way (``behind``); drain waits for them.
        self._pending: set[asyncio.Future[None]] = set()
        self.hits = 0
        self.misses = 0

    def ready(self, key: PoolKey | None = None) -> int:
        """Warm containers waiting (for ``key``, or in all)."""
        if key is None:
            return sum(len(q.ready) for q in self._queues.values())
        queue = self._queues.get(key)
        return len(queue.ready) if queue else 0

    async def settled(self) -> None:
        """Returns once the refills under way are done (the bench and tests wait on it)."""
        fillers = [q.filler for q in self._queues.values() if q.filler is not None]
        await asyncio.gather(*fillers, *self._pending, return_exceptions=True)

    async def take(self, key: PoolKey, spec: SandboxSpec, rename: Callable[[Any], Awaitable[None]]) -> Warm | None:
        """A warm container for ``spec``'s trial, its slot adopted as ``spec.dirs`` (``Warm.dirs``:
        the slot's, now a link) and renamed (``rename``: the container to the trial's name); None
        when none is ready (the trial starts one itself). Either way the key's queue is refilled
        in the background."""
        if self._closed:
            return None
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _Queue(template=spec)
            await self._evict()
        self._queues.move_to_end(key)
        warm = queue.ready.popleft() if queue.ready else None
        self._fill(key, queue)
        if warm is None:
            self.misses += 1
            return None
        try:
            await asyncio.to_thread(_adopt, warm.dirs.root, spec.dirs.root)
        except OSError as e:  # the trial's directory is in use: it starts one the usual way
            log.warning("warm container not adopted", extra={"kv": {"trial": spec.trial_id, "error": str(e)}})
            if spec.dirs.root.exists() and not warm.dirs.root.exists():  # renamed, not linked: give it back
                await asyncio.to_thread(os.rename, spec.dirs.root, warm.dirs.root)
            await self._discard(warm)
            self.misses += 1
            return None
        spec.dirs.create()
        self.hits += 1
        # The name is for people (docker ps); the trial needs nothing of it: off its path.
        self._background(rename(warm.container), f"renaming {spec.trial_id}'s container")
        return warm

    async def behind(self, release: Callable[[], Awaitable[None]]) -> None:
        """Runs a stopped trial's ``release`` (its containers' removal) in the background:
        its outcome is read, nothing of it runs after. Inline when the pool is drained or
        ``2 * size + 2`` releases are under way already (the engine falls behind: wait)."""
        if self._closed or len(self._pending) >= 2 * self.size + 2:
            await release()
            return
        self._background(release(), "releasing a trial's containers")

    def _background(self, work: Awaitable[None], what: str) -> None:
        task = asyncio.ensure_future(work)
        self._pending.add(task)

        def done(task: asyncio.Future[None]) -> None:
            self._pending.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.warning(f"{what} failed", extra={"kv": {"error": repr(task.exception())}})

        task.add_done_callback(done)

    def _fill(self, key: PoolKey, queue: _Queue) -> None:
        if queue.filler is None or queue.filler.done():
            queue.filler = asyncio.ensure_future(self._refill(key, queue))

    async def _refill(self, key: PoolKey, queue: _Queue) -> None:
        """One container at a time (the engine's CPU is the trials' too), up to ``size``."""
        while not self._closed and self._queues.get(key) is queue and len(queue.ready) < self.size:
            slot = self.work_dir / f"{SLOT_PREFIX}{uuid.uuid4().hex[:12]}"
            spec = queue.template.model_copy(
                update={"trial_id": slot.name, "dirs": TrialDirs(slot), "proxy_socket": None}
            )
            try:
                container = await self._launch(spec, key)
            except _REFUSED as e:  # no retry loop against an engine that refuses: the next take tries again
                log.warning("warm container not started", extra={"kv": {"image": key.image, "error": str(e)}})
                await asyncio.to_thread(unlink_slot, slot)
                return
            warm = Warm(container, spec.dirs)
            if self._closed or self._queues.get(key) is not queue:  # drained or evicted meanwhile
                await self._discard(warm)
                return
            queue.ready.append(warm)

    async def _evict(self) -> None:
        while len(self._queues) > self.keys:
            _, queue = self._queues.popitem(last=False)
            await self._drain_queue(queue)

    async def drain(self) -> None:
        """Removes every warm container and its slot; the pool starts no more. Idempotent."""
        self._closed = True
        queues = list(self._queues.values())
        self._queues.clear()
        for queue in queues:
            await self._drain_queue(queue)
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def _drain_queue(self, queue: _Queue) -> None:
        if queue.filler is not None:
            # A launch under way finishes (cancelled mid-create it could leave a container behind),
            # then sees the queue gone and removes what it started.
            with contextlib.suppress(Exception):
                await queue.filler
        while queue.ready:
            await self._discard(queue.ready.popleft())

    async def _discard(self, warm: Warm) -> None:
        try:
            await self._remove(warm.container)
        except _REFUSED as e:  # the engine is gone: cleanup_orphans reaps it later
            log.warning("warm container not removed", extra={"kv": {"error": str(e)}})
        await asyncio.to_thread(unlink_slot, warm.dirs.root)


def _adopt(slot: Path, trial_dir: Path) -> None:
    """The slot becomes the trial's directory: rename(2) onto a path that is absent or an
    empty directory (nothing of the trial is written before its sandbox starts). The engine
    keeps the slot's paths as its mounts' sources and mounts them again by path for every
    copy in or out (its archive API), creating what is missing: the slot's path becomes a
    link to the trial's directory, removed with the trial's containers (``unlink_slot``)."""
    trial_dir.parent.mkdir(parents=True, exist_ok=True)
    os.rename(slot, trial_dir)
    os.symlink(trial_dir, slot)


def unlink_slot(path: Path) -> None:
    """Removes a slot's path: the link an adopted slot left, or a slot never adopted."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
