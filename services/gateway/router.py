"""Routing across replicas.

- Sticky per trial: a request with a trial id goes to the replica chosen by
  rendezvous hashing of (trial id, replica name) over the healthy replicas, so
  a trial keeps its prefix cache and ejecting one replica moves only its trials.
- Least-loaded otherwise (fewest in-flight requests relative to capacity).
- Health: a replica that fails ``eject_after_failures`` times in a row is
  ejected; the periodic probe reinstates it when ``check_health`` passes.
- A request that fails before its first token (``EngineUnavailable``) is
  retried on another replica, up to ``max_attempts`` replicas.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from services.gateway.engines.base import Chunk, Engine, GenerateInput
from services.gateway.errors import EngineFailed, EngineUnavailable

log = logging.getLogger(__name__)

HEALTHY, EJECTED, STARTING = "healthy", "ejected", "starting"


@dataclass
class Replica:
    engine: Engine
    state: str = STARTING
    in_flight: int = 0
    failures: int = 0
    error: str = ""

    @property
    def name(self) -> str:
        return self.engine.name

    def load(self) -> float:
        capacity = 1
        try:
            capacity = max(1, self.engine.info().capacity)
        except Exception:  # noqa: BLE001 - an engine that cannot report counts as full
            return float("inf")
        return self.in_flight / capacity


def _score(trial_id: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{trial_id}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class Router:
    def __init__(self, engines: list[Engine], *, max_attempts: int = 3, eject_after_failures: int = 2) -> None:
        if not engines:
            raise ValueError("the router needs at least one replica")
        self.replicas = [Replica(engine) for engine in engines]
        self.max_attempts = max_attempts
        self.eject_after_failures = eject_after_failures
        self._tiebreak = itertools.count()

    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == HEALTHY]

    def by_name(self, name: str) -> Replica | None:
        return next((r for r in self.replicas if r.name == name), None)

    def pick(self, trial_id: str, exclude: frozenset[str] = frozenset()) -> Replica:
        candidates = [r for r in self.healthy() if r.name not in exclude]
        if not candidates:
            states = ", ".join(f"{r.name}={r.state}{': ' + r.error if r.error else ''}" for r in self.replicas)
            raise EngineUnavailable(f"no healthy replica to serve the request ({states})")
        if trial_id:
            return max(candidates, key=lambda r: _score(trial_id, r.name))
        turn = next(self._tiebreak)
        return min(candidates, key=lambda r: (r.load(), (candidates.index(r) - turn) % len(candidates)))

    def mark_ok(self, replica: Replica) -> None:
        replica.failures = 0
        if replica.state == EJECTED:
            log.warning("replica reinstated", extra={"kv": {"replica": replica.name}})
        replica.state, replica.error = HEALTHY, ""

    def mark_failed(self, replica: Replica, error: BaseException) -> None:
        replica.failures += 1
        replica.error = str(error)[:500]
        if replica.failures >= self.eject_after_failures and replica.state == HEALTHY:
            replica.state = EJECTED
            log.warning("replica ejected", extra={"kv": {"replica": replica.name, "error": replica.error}})

    async def generate(
        self, request: GenerateInput, routed: Callable[[Replica], None] | None = None
    ) -> AsyncGenerator[tuple[Replica, Chunk], None]:
        """Streams (replica, chunk). Retries on another replica only while nothing was streamed.
        ``routed`` hears of each replica the request goes to, before the engine has it
        (so an Abort finds it during the prefill, or under a whole reply that sends nothing)."""
        tried: set[str] = set()
        last_error: BaseException | None = None
        for _ in range(min(self.max_attempts, len(self.replicas))):
            try:
                replica = self.pick(request.trial_id, frozenset(tried))
            except EngineUnavailable:
                break
            tried.add(replica.name)
            if routed is not None:
                routed(replica)
            started = False
            replica.in_flight += 1
            try:
                async with contextlib.aclosing(replica.engine.generate(request)) as stream:
                    async for chunk in stream:
                        started = True
                        yield replica, chunk
                self.mark_ok(replica)
                return
            except EngineUnavailable as e:
                self.mark_failed(replica, e)
                if started:
                    raise EngineFailed(f"replica {replica.name} failed mid-generation: {e}") from e
                last_error = e
                log.warning("retrying on another replica", extra={"kv": {"replica": replica.name, "error": str(e)}})
            finally:
                replica.in_flight -= 1
        if last_error is not None:
            raise EngineUnavailable(f"every replica tried failed before the first token; last: {last_error}")
        self.pick(request.trial_id, frozenset(tried))  # raises with the replica states

    async def probe(self) -> None:
        """One health round: reinstates replicas that pass, counts failures of those that do not."""
        for replica in self.replicas:
            try:
                await replica.engine.check_health()
            except Exception as e:  # noqa: BLE001 - any probe failure counts against the replica
                self.mark_failed(replica, e)
                if replica.state == STARTING:
                    replica.state = EJECTED
            else:
                if replica.state != HEALTHY:
                    self.mark_ok(replica)
