"""The gateway service: validation, drain (pause/resume), request tracking,
weight updates and health over a routed pool of engines. The gRPC servicer in
``server.py`` only converts messages and calls this."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from harnessrl import metrics
from harnessrl.errors import AlreadyExists
from services.gateway.engines.base import Chunk, Engine, EngineInfo, GenerateInput, Sampling, join_chunks
from services.gateway.errors import (
    ContextLengthExceeded,
    EngineFailed,
    EngineUnavailable,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Paused,
)
from services.gateway.router import EJECTED, HEALTHY, Replica, Router
from services.gateway.settings import Settings

MAX_TOP_LOGPROBS = 20  # what OpenAI clients may ask for
# Bounds on stop strings: the proxy forwards a client's (OpenAI allows 4) and tool forcing's markers.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1000
SAMPLED = metrics.TOKENS.labels("gateway", "sampled")  # counted per chunk: the labelled child looked up once

log = logging.getLogger(__name__)


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int


@dataclass
class Output:
    """One streamed chunk with the replica that produced it; ``usage`` on the last."""

    chunk: Chunk
    replica: str
    usage: Usage | None = None


@dataclass
class _Tracked:
    trial_id: str
    replica: str | None = None
    # Set by Abort; also wakes a request that waits for Resume.
    aborted: asyncio.Event = field(default_factory=asyncio.Event)

    def route(self, replica: Replica) -> None:
        """Where Abort finds the request: set when the router picks the replica."""
        self.replica = replica.name


@dataclass
class ReplicaStatus:
    name: str
    state: str
    in_flight: int
    policy_version: int
    engine: str
    error: str


@dataclass
class HealthReport:
    model: str
    context_window: int
    policy_version: int
    paused: bool
    replicas: list[ReplicaStatus] = field(default_factory=list)


def validate_sampling(sampling: Sampling, vocab_size: int) -> None:
    """Rejects sampling parameters no engine could honour, naming the field."""
    if not math.isfinite(sampling.temperature) or sampling.temperature < 0:
        raise InvalidArgument(f"sampling.temperature must be finite and >= 0, got {sampling.temperature}")
    if not math.isfinite(sampling.top_p) or not 0 <= sampling.top_p <= 1:
        raise InvalidArgument(f"sampling.top_p must be in [0, 1] (0 or 1 disables it), got {sampling.top_p}")
    if not 0 <= sampling.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidArgument(f"sampling.top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {sampling.top_logprobs}")
    if sampling.top_k < 0:
        raise InvalidArgument(f"sampling.top_k must be >= 0 (0 disables it), got {sampling.top_k}")
    bad = [i for i in sampling.stop_token_ids if not 0 <= i < vocab_size]
    if bad:
        raise InvalidArgument(f"sampling.stop_token_ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    if len(sampling.stop) > MAX_STOP_STRINGS or not all(0 < len(s) <= MAX_STOP_CHARS for s in sampling.stop):
        raise InvalidArgument(
            f"sampling.stop must hold at most {MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_CHARS} "
            f"characters, got {len(sampling.stop)} of lengths {sorted({len(s) for s in sampling.stop})[:5]}"
        )


class _Coalescer:
    """Holds a reply's chunks for ``stream_interval_ms`` (see ``_coalesced``)."""

    def __init__(self, stream: AsyncIterator[tuple[Replica, Chunk]], interval: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.stream, self.interval = stream, interval
        self.held: list[tuple[Replica, Chunk]] = []
        self.sent_at = -math.inf
        self.ready = False  # what is held may go now (or the stream ended)
        self.done = False
        self.error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def wake(self) -> None:
        self.ready = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self) -> None:
        try:
            async for item in self.stream:
                self.held.append(item)
                if item[1].finish_reason or self.loop.time() - self.sent_at >= self.interval:
                    self.wake()
                elif self._timer is None:  # the first held token: the window's end sends it
                    self._timer = self.loop.call_at(self.sent_at + self.interval, self.wake)
        except Exception as e:  # noqa: BLE001 - raised to the caller after what was read
            self.error = e
        finally:
            self.done = True
            self.wake()

    async def take(self) -> list[tuple[Replica, Chunk]]:
        """The next group to send; [] once the stream ended (``error`` raised)."""
        while not self.ready:
            self._waiter = self.loop.create_future()
            await self._waiter
        self.ready = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        group, self.held = self.held, []
        if group:
            self.sent_at = self.loop.time()
        elif self.error is not None:
            raise self.error
        elif not self.done:
            return await self.take()
        return group


async def _coalesced(
    stream: AsyncIterator[tuple[Replica, Chunk]], interval: float
) -> AsyncGenerator[tuple[Replica, list[Chunk]], None]:
    """The engine's chunks in groups to send as one message (``stream_interval_ms``).

    A reader task takes chunks as the engine yields them; a chunk that arrives less
    than ``interval`` after the last send is held, and what is held goes when the
    window ends or with the finish. The first chunk and the finish are never held.
    One wake-up per message, none per held token. ``interval`` 0: each chunk alone."""
    if not interval:
        async for replica, chunk in stream:
            yield replica, [chunk]
        return
    coalescer = _Coalescer(stream, interval)
    reader = coalescer.loop.create_task(coalescer.read())
    try:
        while group := await coalescer.take():
            yield group[-1][0], [chunk for _, chunk in group]
    finally:
        reader.cancel()
        await asyncio.wait((reader,))


async def _whole(stream: AsyncIterator[tuple[Replica, Chunk]]) -> AsyncGenerator[tuple[Replica, list[Chunk]], None]:
    """A reply's chunks as one group, sent when the finish comes (a caller that takes
    the reply only at its end: one message, one wake-up of the caller, however long
    the reply). An error raises with nothing sent, as the caller keeps nothing of a
    reply that failed; a stream that ends without a finish gives what it had."""
    group: list[Chunk] = []
    last: Replica | None = None
    async for replica, chunk in stream:
        last = replica
        group.append(chunk)
        if chunk.finish_reason:
            break
    if last is not None:
        yield last, group


class GatewayService:
    def __init__(self, engines: list[Engine], settings: Settings) -> None:
        self.settings = settings
        self.router = Router(
            engines, max_attempts=settings.max_attempts, eject_after_failures=settings.eject_after_failures
        )
        self.version = settings.initial_version
        self._requests: dict[str, _Tracked] = {}
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._waiting = 0
        self._update_lock = asyncio.Lock()
        self._health_task: asyncio.Task[None] | None = None
        self._last_update: tuple[str, dict[str, str]] | None = None

    # --- life cycle -----------------------------------------------------------

    async def start(self) -> None:
        await asyncio.gather(*(r.engine.start() for r in self.router.replicas))
        await self.router.probe()
        self._health_task = asyncio.create_task(self._health_loop(), name="gateway-health")

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        self._unpaused.set()
        await asyncio.gather(*(r.engine.close() for r in self.router.replicas), return_exceptions=True)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            await self.probe()

    async def probe(self) -> None:
        """Health round; a replica that is up but serves an old policy version loads
        the latest checkpoint before it is routed to again."""
        await self.router.probe()
        for replica in self.router.replicas:
            version = replica.engine.info().policy_version
            if replica.state != HEALTHY or version == self.version:
                continue
            replica.state, replica.error = EJECTED, f"serves policy version {version}, expected {self.version}"
            if self._last_update is not None:
                path, options = self._last_update
                try:
                    async with self._update_lock:
                        await replica.engine.load_weights(self.version, path, options)
                except Exception as e:  # noqa: BLE001 - stays ejected, with the reason
                    replica.error += f"; catching up failed: {e}"
                else:
                    self.router.mark_ok(replica)

    def info(self) -> EngineInfo:
        replica = next(iter(self.router.healthy()), self.router.replicas[0])
        info = replica.engine.info()
        if self.settings.context_window is not None:
            info.context_window = self.settings.context_window
        return info

    # --- generation -----------------------------------------------------------

    def _validate(self, prompt_ids: npt.NDArray[np.int32], sampling: Sampling) -> int:
        """Checks the request against the model; returns the token budget."""
        if not self.router.healthy():
            self.router.pick("")  # raises UNAVAILABLE (retryable) naming each replica's state
        info = self.info()
        n = int(prompt_ids.shape[0])
        if n == 0:
            raise InvalidArgument("prompt_ids is empty")
        low, high = int(prompt_ids.min()), int(prompt_ids.max())
        if low < 0 or high >= info.vocab_size:
            raise InvalidArgument(
                f"prompt_ids holds ids outside the vocabulary [0, {info.vocab_size}): min {low}, max {high}"
            )
        validate_sampling(sampling, info.vocab_size)
        if n >= info.context_window:
            raise ContextLengthExceeded(n, info.context_window)
        room = info.context_window - n
        return min(sampling.max_tokens, room) if sampling.max_tokens else room

    async def _wait_unpaused(self, tracked: _Tracked) -> None:
        """Waits (bounded) for Resume; returns early when the request is aborted."""
        if self._unpaused.is_set():
            return
        if self._waiting >= self.settings.max_waiting:
            raise Paused(f"gateway paused for a weight update and {self._waiting} requests already wait; retry")
        self._waiting += 1
        waiters = {asyncio.ensure_future(self._unpaused.wait()), asyncio.ensure_future(tracked.aborted.wait())}
        try:
            done, _ = await asyncio.wait(waiters, timeout=self.settings.pause_wait_s, return_when="FIRST_COMPLETED")
            if not done:
                raise Paused(f"gateway still paused after {self.settings.pause_wait_s:g} s (weight update); retry")
        finally:
            self._waiting -= 1
            for waiter in waiters:
                waiter.cancel()

    async def generate(
        self,
        request_id: str,
        trial_id: str,
        thread: str,
        prompt_ids: npt.NDArray[np.int32],
        sampling: Sampling,
        *,
        whole: bool = False,
        wide: bool = False,
    ) -> AsyncIterator[Output]:
        """The reply's chunks as they are sampled (coalesced per ``stream_interval_ms``);
        ``whole``: in one message at the end (see ``_whole``); ``wide``: the caller ends
        the reply on no text, so the engine may send wider events."""
        budget = self._validate(prompt_ids, sampling)
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._requests:
            raise AlreadyExists(f"request_id {request_id!r} is already running; request ids must be unique")
        tracked = self._requests[request_id] = _Tracked(trial_id)
        metrics.QUEUE_DEPTH.labels("gateway", "requests").set(len(self._requests))
        try:
            await self._wait_unpaused(tracked)
            request = GenerateInput(request_id, trial_id, thread or "main", prompt_ids, sampling, budget, whole, wide)
            async with contextlib.aclosing(self._stream(request, tracked)) as stream:
                async for out in stream:
                    yield out
        finally:
            del self._requests[request_id]
            metrics.QUEUE_DEPTH.labels("gateway", "requests").set(len(self._requests))

    async def _stream(self, request: GenerateInput, tracked: _Tracked) -> AsyncGenerator[Output, None]:
        n_prompt = int(request.prompt_ids.shape[0])
        if tracked.aborted.is_set():
            yield Output(Chunk.empty("abort"), "", Usage(n_prompt, 0, 0))
            return
        produced, last, name = 0, None, ""
        interval = self.settings.stream_interval_ms / 1000
        async with (
            contextlib.aclosing(self.router.generate(request, tracked.route)) as chunks_in,
            contextlib.aclosing(_whole(chunks_in) if request.whole else _coalesced(chunks_in, interval)) as stream,
        ):
            async for replica, chunks in stream:
                if replica is not last:
                    last, name = replica, replica.name
                *before, chunk = join_chunks(chunks)
                for one in before:  # chunks that could not be joined (routes or top logprobs on some), in order
                    produced += len(one)
                    yield Output(one, name, None)
                n = len(chunk)
                produced += n
                SAMPLED.inc(sum(len(c) for c in chunks))
                usage = Usage(n_prompt, produced, chunk.cached_prompt_tokens) if chunk.finish_reason else None
                yield Output(chunk, name, usage)
                if chunk.finish_reason:
                    return
        raise EngineFailed("the engine ended the reply without a finish reason")

    async def abort(self, request_id: str, trial_id: str) -> int:
        if request_id:
            tracked = self._requests.get(request_id)
            if tracked is None:
                raise NotFound(f"no running request {request_id!r}")
            return int(await self._abort_one(request_id, tracked))
        if not trial_id:
            raise InvalidArgument("Abort needs a request_id or a trial_id")
        matching = [(rid, t) for rid, t in list(self._requests.items()) if t.trial_id == trial_id]
        results = await asyncio.gather(*(self._abort_one(rid, t) for rid, t in matching))
        # The trial is over: what the engines keep for its next turns (KV caches) goes too,
        # after the aborts (an aborted generation's cache is kept by its abort).
        await asyncio.gather(*(r.engine.forget_trial(trial_id) for r in self._serving()), return_exceptions=True)
        return sum(results)

    async def _abort_one(self, request_id: str, tracked: _Tracked) -> bool:
        tracked.aborted.set()
        if tracked.replica is None:
            return True
        replica = self.router.by_name(tracked.replica)
        return replica is not None and await replica.engine.abort(request_id)

    # --- drain and weights ----------------------------------------------------

    @property
    def paused(self) -> bool:
        return not self._unpaused.is_set()

    def _serving(self) -> list[Replica]:
        return [r for r in self.router.replicas if r.state != EJECTED]

    async def _on_replicas(self, replicas: list[Replica], action: str, calls: list[Awaitable[Any]]) -> list[Any]:
        """Runs one call per replica; a replica that fails counts a failure (and may be
        ejected). Raises only when every replica failed."""
        results = await asyncio.gather(*calls, return_exceptions=True)
        failed = [(r, e) for r, e in zip(replicas, results, strict=True) if isinstance(e, BaseException)]
        for replica, error in failed:
            log.error(f"{action} failed", extra={"kv": {"replica": replica.name, "error": str(error)}})
            self.router.mark_failed(replica, error)
        if replicas and len(failed) == len(replicas):
            raise failed[0][1]
        return [r for r in results if not isinstance(r, BaseException)]

    async def pause(self, timeout_s: float) -> int:
        if not math.isfinite(timeout_s) or timeout_s < 0:
            raise InvalidArgument(f"timeout_s must be finite and >= 0, got {timeout_s}")
        self._unpaused.clear()
        replicas = self._serving()
        held = await self._on_replicas(replicas, "pause", [r.engine.pause(timeout_s) for r in replicas])
        log.info("paused", extra={"kv": {"held": sum(held)}})
        return sum(held)

    async def resume(self) -> int:
        """Resumes every replica (an ejected one may hold paused requests too)."""
        replicas = self.router.replicas
        results = await asyncio.gather(*(r.engine.resume() for r in replicas), return_exceptions=True)
        for replica, result in zip(replicas, results, strict=True):
            if isinstance(result, BaseException) and replica.state != EJECTED:
                log.error("resume failed", extra={"kv": {"replica": replica.name, "error": str(result)}})
                self.router.mark_failed(replica, result)
        self._unpaused.set()
        return sum(r for r in results if isinstance(r, int))

    async def update_weights(self, version: int, checkpoint_path: str, options: Mapping[str, str]) -> float:
        """Loads ``version`` on every serving replica; returns seconds taken. A replica
        that fails while others succeed is ejected (it would serve stale weights) and
        catches up when its health probe passes again."""
        seconds = await self._update(version, lambda e: e.load_weights(version, checkpoint_path, options))
        self._last_update = (checkpoint_path, dict(options))
        return seconds

    async def load_state_dict(self, version: int, tensors: Mapping[str, Any]) -> float:
        """In-process weight update for the embedded stack (the trainer hands tensors
        over, no checkpoint folder): same version rules as UpdateWeights."""

        def load(engine: Engine) -> Awaitable[None]:
            loader = getattr(engine, "load_state_dict", None)
            if loader is None:
                raise InvalidArgument(f"engine {engine.kind} takes weights from a checkpoint_path only")
            return cast(Awaitable[None], loader(version, tensors))

        seconds = await self._update(version, load)
        self._last_update = None  # nothing on disk to catch up from
        return seconds

    async def _update(self, version: int, load: Callable[[Engine], Awaitable[None]]) -> float:
        async with self._update_lock:
            if version <= self.version:
                raise FailedPrecondition(f"version {version} is not greater than the current version {self.version}")
            replicas = self._serving()
            if not replicas:
                raise EngineUnavailable("no serving replica to load weights into")
            started = time.monotonic()

            async def one(replica: Replica) -> None:
                await load(replica.engine)

            results = await asyncio.gather(*(one(r) for r in replicas), return_exceptions=True)
            failed = [(r, e) for r, e in zip(replicas, results, strict=True) if isinstance(e, BaseException)]
            if len(failed) == len(replicas):
                raise failed[0][1]
            self.version = version
            for replica, error in failed:
                replica.state, replica.error = EJECTED, f"weight update to version {version} failed: {error}"
                log.error("weight update failed", extra={"kv": {"replica": replica.name, "error": str(error)}})
            return time.monotonic() - started

    def health(self) -> HealthReport:
        info = self.info()
        replicas = []
        for r in self.router.replicas:
            try:
                version = r.engine.info().policy_version
            except Exception:  # noqa: BLE001 - reported as unknown, never fails Health
                version = -1
            replicas.append(ReplicaStatus(r.name, r.state, r.in_flight, version, r.engine.kind, r.error))
        return HealthReport(info.model, info.context_window, self.version, self.paused, replicas)
