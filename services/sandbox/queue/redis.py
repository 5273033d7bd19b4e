"""The distributed queue on Redis. Every state change is one Lua script, so a
worker that dies between two commands can never leave a trial half-claimed.

Keys (prefix ``hrl:sandbox:``)::

    trial:<id>   hash: spec (JSON), state, attempt, crashes, worker, cancel, outcome (JSON), error, updated_at
    queue        list of queued trial ids (retries go to the front)
    leases       zset trial id -> lease expiry (ms since epoch)
    run:<run>    set of the run's trial ids
    wake         list pushed on submit/requeue so idle workers wake at once
    events       pub/sub channel: the id of every trial that changed
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from services.sandbox.common.errors import LeaseLost, TrialNotFound
from services.sandbox.queue.base import (
    Heartbeat,
    TrialQueue,
    cancelled_outcome,
    check_same_spec,
    lost_outcome,
    matches,
)
from services.sandbox.trial.lifecycle import VALID_TRANSITIONS, TrialOutcome, TrialRecord, TrialSpec, TrialState

P = "hrl:sandbox:"

_SUBMIT = """
local key = KEYS[1]
if redis.call('EXISTS', key) == 1 then return redis.call('HGET', key, 'spec') end
redis.call('HSET', key, 'spec', ARGV[2], 'state', 'queued', 'attempt', 0, 'worker', '', 'cancel', 0,
           'outcome', '', 'error', '', 'updated_at', ARGV[4])
if ARGV[3] ~= '' then redis.call('SADD', KEYS[2] .. ARGV[3], ARGV[1]) end
redis.call('RPUSH', KEYS[3], ARGV[1])
redis.call('LPUSH', KEYS[4], 1)
redis.call('LTRIM', KEYS[4], 0, 63)
redis.call('PUBLISH', KEYS[5], ARGV[1])
return false
"""

_CLAIM = """
while true do
  local id = redis.call('LPOP', KEYS[1])
  if not id then return false end
  local key = ARGV[4] .. id
  if redis.call('HGET', key, 'state') == 'queued' then
    redis.call('HSET', key, 'state', 'setup', 'worker', ARGV[1], 'updated_at', ARGV[3])
    redis.call('HINCRBY', key, 'attempt', 1)
    redis.call('ZADD', KEYS[2], ARGV[2], id)
    redis.call('PUBLISH', KEYS[3], id)
    return id
  end
end
"""

# KEYS: trial key, leases. ARGV: id, worker, new expiry.
_HEARTBEAT = """
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[2] or not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 'lost'
end
redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[1])
if redis.call('HGET', KEYS[1], 'cancel') == '1' then return 'cancel' end
return 'ok'
"""

# KEYS: trial key, leases, events. ARGV: id, worker, new state, allowed-from (space separated), now, outcome.
_MOVE = """
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[2] or not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 'lost'
end
local state = redis.call('HGET', KEYS[1], 'state')
if not string.find(' ' .. ARGV[4] .. ' ', ' ' .. state .. ' ', 1, true) then return 'bad:' .. state end
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'updated_at', ARGV[5])
if ARGV[3] == 'done' then
  redis.call('HSET', KEYS[1], 'outcome', ARGV[6])
  redis.call('ZREM', KEYS[2], ARGV[1])
end
redis.call('PUBLISH', KEYS[3], ARGV[1])
return 'ok'
"""

# KEYS: trial key, leases, queue, wake, events. ARGV: id, worker, allowed-from (space separated), now, error.
_REQUEUE = """
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[2] or not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 'lost'
end
local state = redis.call('HGET', KEYS[1], 'state')
if not string.find(' ' .. ARGV[3] .. ' ', ' ' .. state .. ' ', 1, true) then return 'bad:' .. state end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'queued', 'worker', '', 'error', ARGV[5], 'updated_at', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'crashes', 1)
redis.call('LPUSH', KEYS[3], ARGV[1])
redis.call('LPUSH', KEYS[4], 1)
redis.call('LTRIM', KEYS[4], 0, 63)
redis.call('PUBLISH', KEYS[5], ARGV[1])
return 'ok'
"""

# KEYS: trial key, queue, events. ARGV: id, now, cancelled outcome.
_CANCEL = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -1 end
if state == 'done' then return 0 end
if state == 'queued' then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  redis.call('HSET', KEYS[1], 'state', 'done', 'outcome', ARGV[3], 'updated_at', ARGV[2])
else
  redis.call('HSET', KEYS[1], 'cancel', 1, 'updated_at', ARGV[2])
end
redis.call('PUBLISH', KEYS[3], ARGV[1])
return 1
"""

# KEYS: leases, queue, events, wake.
# ARGV: now (ms), max attempts, prefix, now (s), cancelled outcome, lost outcome.
_REAP = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local key = ARGV[3] .. id
  local attempt = tonumber(redis.call('HGET', key, 'attempt'))
  local worker = redis.call('HGET', key, 'worker')
  if redis.call('HGET', key, 'cancel') == '1' then
    redis.call('HSET', key, 'state', 'done', 'outcome', ARGV[5], 'updated_at', ARGV[4])
  elseif attempt < tonumber(ARGV[2]) then
    redis.call('HSET', key, 'state', 'queued', 'worker', '', 'updated_at', ARGV[4],
               'error', 'attempt ' .. attempt .. ': worker ' .. worker .. ' lost the lease')
    redis.call('LPUSH', KEYS[2], id)
    redis.call('LPUSH', KEYS[4], 1)
  else
    redis.call('HSET', key, 'state', 'done', 'outcome', ARGV[6], 'updated_at', ARGV[4],
               'error', 'attempt ' .. attempt .. ': worker ' .. worker .. ' lost the lease; no attempts left')
  end
  redis.call('PUBLISH', KEYS[3], id)
end
return ids
"""


def _ms(seconds_from_now: float = 0.0) -> int:
    return int((time.time() + seconds_from_now) * 1000)


class RedisQueue(TrialQueue):
    def __init__(self, url: str) -> None:
        self.redis = aioredis.from_url(url, decode_responses=True)
        self._scripts = {
            name: self.redis.register_script(src)
            for name, src in {
                "submit": _SUBMIT,
                "claim": _CLAIM,
                "heartbeat": _HEARTBEAT,
                "move": _MOVE,
                "requeue": _REQUEUE,
                "cancel": _CANCEL,
                "reap": _REAP,
            }.items()
        }

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return await self._scripts[name](keys=keys, args=args)

    async def submit(self, spec: TrialSpec) -> tuple[TrialRecord, bool]:
        existing = await self._run(
            "submit",
            [P + "trial:" + spec.trial_id, P + "run:", P + "queue", P + "wake", P + "events"],
            [spec.trial_id, spec.model_dump_json(), spec.run_id, time.time()],
        )
        if existing:
            check_same_spec(TrialSpec.model_validate_json(existing), spec)
            return await self.get(spec.trial_id), False
        return await self.get(spec.trial_id), True

    async def get(self, trial_id: str) -> TrialRecord:
        data = await self.redis.hgetall(P + "trial:" + trial_id)
        if not data:
            raise TrialNotFound(f"no trial {trial_id!r}")
        return _record({str(k): str(v) for k, v in data.items()})

    async def claim(self, worker: str, lease_s: float, wait_s: float) -> TrialRecord | None:
        deadline = time.monotonic() + wait_s
        while True:
            trial_id = await self._run(
                "claim", [P + "queue", P + "leases", P + "events"], [worker, _ms(lease_s), time.time(), P + "trial:"]
            )
            if trial_id:
                return await self.get(trial_id)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # Woken by a submit; a lost wake-up only costs this timeout.
            await self.redis.blpop([P + "wake"], timeout=max(0.1, min(remaining, 1.0)))

    async def heartbeat(self, trial_id: str, worker: str, lease_s: float) -> Heartbeat:
        answer = await self._run("heartbeat", [P + "trial:" + trial_id, P + "leases"], [trial_id, worker, _ms(lease_s)])
        return Heartbeat(answer)

    async def _move(self, trial_id: str, worker: str, state: TrialState, outcome: str = "") -> TrialRecord:
        allowed = " ".join(src for src, dsts in VALID_TRANSITIONS.items() if state in dsts)
        answer = await self._run(
            "move",
            [P + "trial:" + trial_id, P + "leases", P + "events"],
            [trial_id, worker, state.value, allowed, time.time(), outcome],
        )
        if answer == "lost":
            raise LeaseLost(f"worker {worker} does not hold the lease of trial {trial_id}")
        if answer != "ok":
            raise ValueError(f"trial {trial_id}: invalid transition {answer[4:]} -> {state}")
        return await self.get(trial_id)

    async def set_state(self, trial_id: str, worker: str, state: TrialState) -> TrialRecord:
        return await self._move(trial_id, worker, state)

    async def finish(self, trial_id: str, worker: str, outcome: TrialOutcome) -> TrialRecord:
        return await self._move(trial_id, worker, TrialState.DONE, outcome.model_dump_json())

    async def requeue(self, trial_id: str, worker: str, error: str) -> TrialRecord:
        allowed = " ".join(src for src, dsts in VALID_TRANSITIONS.items() if TrialState.QUEUED in dsts)
        answer = await self._run(
            "requeue",
            [P + "trial:" + trial_id, P + "leases", P + "queue", P + "wake", P + "events"],
            [trial_id, worker, allowed, time.time(), error],
        )
        if answer == "lost":
            raise LeaseLost(f"worker {worker} does not hold the lease of trial {trial_id}")
        if answer != "ok":
            raise ValueError(f"trial {trial_id}: invalid transition {answer[4:]} -> {TrialState.QUEUED}")
        return await self.get(trial_id)

    async def cancel(self, trial_id: str) -> bool:
        answer = await self._run(
            "cancel",
            [P + "trial:" + trial_id, P + "queue", P + "events"],
            [trial_id, time.time(), cancelled_outcome().model_dump_json()],
        )
        if answer == -1:
            raise TrialNotFound(f"no trial {trial_id!r}")
        return bool(answer)

    async def reap(self, max_attempts: int) -> list[str]:
        ids = await self._run(
            "reap",
            [P + "leases", P + "queue", P + "events", P + "wake"],
            [
                _ms(),
                max_attempts,
                P + "trial:",
                time.time(),
                cancelled_outcome().model_dump_json(),
                lost_outcome(max_attempts).model_dump_json(),
            ],
        )
        return list(ids)

    async def watch(self, run_id: str, trial_ids: list[str]) -> AsyncIterator[TrialRecord]:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(P + "events")
        try:
            initial = trial_ids or sorted(str(m) for m in await self.redis.smembers(P + "run:" + run_id))
            for trial_id in initial:
                try:
                    yield await self.get(trial_id)
                except TrialNotFound:
                    continue
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                if trial_ids and message["data"] not in trial_ids:
                    continue
                record = await self.get(message["data"])
                if matches(record, run_id, trial_ids):
                    yield record
        finally:
            await pubsub.unsubscribe()
            await pubsub.aclose()

    async def close(self) -> None:
        await self.redis.aclose()


def _record(data: dict[str, str]) -> TrialRecord:
    outcome = TrialOutcome.model_validate_json(data["outcome"]) if data.get("outcome") else None
    return TrialRecord(
        spec=TrialSpec.model_validate(json.loads(data["spec"])),
        state=TrialState(data["state"]),
        attempt=int(data.get("attempt", 0)),
        crashes=int(data.get("crashes", 0)),
        worker=data.get("worker", ""),
        cancel_requested=data.get("cancel") == "1",
        outcome=outcome,
        error=data.get("error", ""),
        updated_at=float(data.get("updated_at", 0)),
    )
