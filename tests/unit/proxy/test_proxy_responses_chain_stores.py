"""A WebSocket connection's cache of ``store: false`` responses and its trial's
store resolve one chain together (``ResponseStore.chain(id, *more)``): links
may sit in either, the reason an id fails comes from the store that knows it,
and resolutions are counted on the trial's store."""

from __future__ import annotations

import pytest

from services.proxy.errors import BadRequest
from services.proxy.responses.models import Item
from services.proxy.responses.store import ResponseStore


def put(store: ResponseStore, rid: str, previous: str | None) -> None:
    said = Item(type="message", role="assistant", content=[{"type": "output_text", "text": f"a-{rid}"}])
    store.put(rid, previous, [Item(type="message", role="user", content=f"q-{rid}")], [said], {"id": rid})


def texts(items: list[Item]) -> list[str]:
    return [i.content if isinstance(i.content, str) else i.content[0]["text"] for i in items]  # type: ignore[index]


def test_a_chain_crosses_from_the_connection_cache_into_the_trial_store() -> None:
    trial, cache = ResponseStore(10, 1 << 20), ResponseStore(10, 1 << 20, scope="this WebSocket connection")
    put(trial, "kept", None)  # store: true
    put(cache, "c1", "kept")  # store: false, on the connection
    put(cache, "c2", "c1")
    assert texts(cache.chain("c2", trial)) == ["q-kept", "a-kept", "q-c1", "a-c1", "q-c2", "a-c2"]
    assert texts(cache.chain("kept", trial)) == ["q-kept", "a-kept"]
    assert (trial.chained, cache.chained) == (2, 0), "counted on the trial's store"
    with pytest.raises(BadRequest, match="stored by this trial") as e:
        cache.chain("nope", trial)
    assert (e.value.param, e.value.code) == ("previous_response_id", "previous_response_not_found")


def test_the_reason_comes_from_the_store_that_evicted_the_id() -> None:
    trial, cache = ResponseStore(10, 1 << 20), ResponseStore(1, 1 << 20, scope="this WebSocket connection")
    put(cache, "c1", None)
    put(cache, "c2", "c1")  # the bound of one evicts c1
    with pytest.raises(BadRequest, match="'c1' not found: it was evicted"):
        cache.chain("c1", trial)
    with pytest.raises(BadRequest, match="its chain reaches 'c1', which is no longer stored"):
        cache.chain("c2", trial)
    cache.clear()
    with pytest.raises(BadRequest, match="no response with this id was stored by this trial"):
        cache.chain("c2", trial)
