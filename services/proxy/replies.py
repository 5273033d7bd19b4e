"""What a model call makes of the gateway's reply, apart from the call itself: the
sampled arrays joined into a ``Sampled`` (checked whole, invariant 1), the stop strings
the engine is asked to end at, a prefilled plan, the end of a finished stream, a
committed call's parts handed to the writer."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from harnessrl import metrics
from harnessrl.arrays import I32, U8
from harnessrl.logs import kv
from harnessrl.v1 import gateway_pb2, records_pb2
from services.proxy.capture.state import Part, Plan, Sampled
from services.proxy.errors import EngineFailure

if TYPE_CHECKING:
    from services.proxy.trials import ProxyCore, Trial

log = logging.getLogger(__name__)
# The gateway's bounds on sampling.stop (services/gateway/service.py): stops past them
# are watched by the proxy alone, whose cut of the capture holds either way.
ENGINE_MAX_STOPS, ENGINE_MAX_STOP_CHARS = 64, 1000


async def drain_after_finish(chunks: AsyncIterator[gateway_pb2.GenerateChunk]) -> None:
    """Reads the end of a Generate stream after its finish chunk (the status, sent
    with it), so the call and its client span end now, not when it is collected."""
    try:
        async with asyncio.timeout(5):
            async for _ in chunks:
                pass
    except Exception as e:  # noqa: BLE001 - the reply is committed; a late stream error changes nothing
        log.info("generate stream did not end cleanly after its finish chunk", extra=kv(error=str(e)))


def prefilled(plan: Plan, ids: bytes) -> Plan:
    """``plan`` with ``ids`` ending its prompt: context (mask 0) the engine sees and the segment keeps."""
    delta = plan.delta + ids if plan.extends is not None else plan.delta
    return dataclasses.replace(plan, prompt=plan.prompt + ids, delta=delta)


def engine_stops(stops: list[str]) -> list[str]:
    """The stop strings the engine is asked to end at (so it samples nothing past them),
    or none when they exceed the gateway's bounds."""
    stops = [s for s in stops if s]
    if len(stops) > ENGINE_MAX_STOPS or any(len(s) > ENGINE_MAX_STOP_CHARS for s in stops):
        return []
    return stops


def routes_of(msg: records_pb2.RoutedExperts) -> np.ndarray:
    return np.frombuffer(msg.data, dtype=U8).reshape(msg.num_tokens, msg.num_layers, msg.top_k)


def sampled_reply(
    ids: list[bytes],
    logprobs: list[bytes],
    versions: list[bytes],
    routes: list[np.ndarray],
    finish: str,
    stop_ids: list[int],
) -> Sampled:
    all_ids = b"".join(ids)
    arr = np.frombuffer(all_ids, I32)
    ended = bool(len(arr)) and int(arr[-1]) in stop_ids
    lp = b"".join(logprobs)
    ver = b"".join(versions)
    if len(lp) != len(all_ids) or len(ver) != len(all_ids):
        # A placeholder logprob or version in a training sample would break invariant 1:
        # the turn fails as an engine error instead, and nothing of it is captured.
        metrics.FAILURES.labels("proxy", "engine_arrays_mismatch").inc()
        raise EngineFailure(
            f"the engine returned {len(arr)} token ids but {len(lp) // 4} logprobs and {len(ver) // 4} "
            "policy versions; the turn is not captured"
        )
    r = np.concatenate(routes) if routes and sum(len(x) for x in routes) == len(arr) else None
    return Sampled(all_ids, lp, ver, finish, ended, r)


def submit_parts(
    core: ProxyCore, trial: Trial, parts: Sequence[Part], sampled: Sampled, finish: str, usage: records_pb2.Usage
) -> None:
    """Hands a committed call's capture parts to the trial's writer; the part holding the
    reply carries its finish reason."""
    for part in parts:
        trial.writer.submit(core.append_request(trial, part, finish if part.sampled is sampled else "", usage))
