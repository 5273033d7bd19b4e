"""WatchReady: ready groups delivered with acks, redelivered to the next
subscriber of the same consumer group when not acknowledged, on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from harnessrl.v1 import capture_pb2
from tests.integration.test_capture.conftest import Store, append_request, finalize_request


class Watcher:
    """A bidi WatchReady call: subscribe, then acks on demand; deliveries land in a queue."""

    def __init__(self, store: Store, run: str, group: str = "trainer", consumer: str = "c0", first: Any = None):
        self._acks: asyncio.Queue[capture_pb2.WatchReadyRequest | None] = asyncio.Queue()
        self.got: asyncio.Queue[Any] = asyncio.Queue()
        sub = capture_pb2.WatchReadyRequest.Subscribe(run_id=run, consumer_group=group, consumer=consumer)
        self._first = first or capture_pb2.WatchReadyRequest(subscribe=sub)
        self.call = store.stub.WatchReady(self._requests(), metadata=store.md(run))
        self._pump = asyncio.create_task(self._read())

    async def _requests(self):
        yield self._first
        while (item := await self._acks.get()) is not None:
            yield item

    async def _read(self) -> None:
        try:
            async for msg in self.call:
                await self.got.put(msg)
        except grpc.aio.AioRpcError as e:
            await self.got.put(e)

    async def next(self, wait_s: float = 10) -> capture_pb2.ReadyGroup:
        item = await asyncio.wait_for(self.got.get(), wait_s)
        if isinstance(item, Exception):
            raise item
        return item

    async def nothing_for(self, seconds: float) -> bool:
        await asyncio.sleep(seconds)
        return self.got.empty()

    def ack(self, group_id: str) -> None:
        self._acks.put_nowait(capture_pb2.WatchReadyRequest(ack=capture_pb2.WatchReadyRequest.Ack(group_id=group_id)))

    async def close(self) -> None:
        self.call.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)


async def ready_group(store: Store, run: str, group: str, size: int = 2) -> None:
    for i in range(size):
        trial = f"{group}-t{i}"
        await store.append(append_request(run, trial, group=group))
        await store.finalize(finalize_request(run, trial, group=group, size=size))


@pytest.fixture
async def fast_store(make_store):
    async with make_store(ready_lease_s=1.5) as s:
        yield s


async def test_delivers_ready_groups_in_order_and_new_ones_promptly(fast_store: Store) -> None:
    store = fast_store
    await ready_group(store, "r1", "g1")
    watcher = Watcher(store, "r1")
    try:
        first = await watcher.next()
        assert (first.group_id, first.run_id, first.task_id, first.step) == ("g1", "r1", "task-a", 3)
        assert list(first.trial_ids) == ["g1-t0", "g1-t1"] and first.redeliveries == 0
        watcher.ack("g1")
        await store.append(append_request("r1", "half", group="g2"))
        await store.finalize(finalize_request("r1", "half", group="g2", size=2))
        assert await watcher.nothing_for(0.3)  # a group with one of two trials final is not ready
        await ready_group(store, "r1", "g3")
        assert (await watcher.next()).group_id == "g3"
        await ready_group(store, "r2", "g4")  # another run's stream
        assert await watcher.nothing_for(0.5)
    finally:
        await watcher.close()


async def test_unacked_groups_are_redelivered_to_a_restarted_trainer(fast_store: Store) -> None:
    store = fast_store
    for g in ("g1", "g2", "g3"):
        await ready_group(store, "r1", g)
    first = Watcher(store, "r1", consumer="trainer-0")
    assert [(await first.next()).group_id for _ in range(3)] == ["g1", "g2", "g3"]
    first.ack("g1")
    first.ack("g3")
    await asyncio.sleep(0.5)
    await first.close()  # the trainer dies with g2 unacknowledged

    again = Watcher(store, "r1", consumer="trainer-0")
    redelivered = await again.next()
    assert (redelivered.group_id, redelivered.redeliveries) == ("g2", 1)
    assert await again.nothing_for(0.5)
    await again.close()

    other = Watcher(store, "r1", consumer="trainer-1")  # a new name gets a gone consumer's groups too
    redelivered = await other.next()
    assert (redelivered.group_id, redelivered.redeliveries) == ("g2", 2)
    other.ack("g2")
    await asyncio.sleep(0.5)
    await other.close()
    last = Watcher(store, "r1", consumer="trainer-2")
    assert await last.nothing_for(1.0)
    await last.close()


async def test_consumer_groups_are_independent(fast_store: Store) -> None:
    await ready_group(fast_store, "r1", "g1")
    a, b = Watcher(fast_store, "r1", group="trainer"), Watcher(fast_store, "r1", group="dashboard")
    try:
        assert (await a.next()).group_id == "g1"
        assert (await b.next()).group_id == "g1"
    finally:
        await a.close()
        await b.close()


async def test_live_consumer_keeps_its_groups_until_it_goes(fast_store: Store) -> None:
    store = fast_store
    await ready_group(store, "r1", "g1")
    c1 = Watcher(store, "r1", consumer="c1")
    assert (await c1.next()).group_id == "g1"
    c2 = Watcher(store, "r1", consumer="c2")
    try:
        assert await c2.nothing_for(1.0)  # c1 is alive: g1 stays with it
        await ready_group(store, "r1", "g2")
        await asyncio.sleep(1.0)
        got = {name: c.got.qsize() for name, c in (("c1", c1), ("c2", c2))}
        assert sorted(got.values()) == [0, 1]  # a new group goes to exactly one live consumer
        if got["c2"]:
            assert (await c2.next()).group_id == "g2"
        await c1.close()
        moved = sorted([await c2.next(wait_s=5) for _ in range(1 + got["c1"])], key=lambda g: g.group_id)
        assert [(g.group_id, g.redeliveries) for g in moved] == [("g1", 1), ("g2", 1)][: len(moved)]
    finally:
        await c2.close()


async def test_bad_watch_requests(fast_store: Store) -> None:
    ack_first = capture_pb2.WatchReadyRequest(ack=capture_pb2.WatchReadyRequest.Ack(group_id="g1"))
    watcher = Watcher(fast_store, "r1", first=ack_first)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await watcher.next()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await watcher.close()

    bad_run = Watcher(fast_store, "no such/run")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await bad_run.next()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await bad_run.close()

    watcher = Watcher(fast_store, "r1")
    watcher.ack("never-ready")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await watcher.next()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "never-ready" in (info.value.details() or "")
    await watcher.close()
