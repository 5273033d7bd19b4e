"""The per-trial store behind Responses' previous_response_id: chains resolve
oldest first, the bound evicts least recently used responses, and every id that
cannot be continued fails with a 400 that says why."""

from __future__ import annotations

import pytest

from services.proxy.errors import BadRequest
from services.proxy.responses.models import Item
from services.proxy.responses.store import ResponseNotFound, ResponseStore


def user(text: str) -> Item:
    return Item(type="message", role="user", content=text)


def said(text: str) -> Item:
    return Item(type="message", role="assistant", content=[{"type": "output_text", "text": text}])


def put(store: ResponseStore, rid: str, previous: str | None, text: str) -> None:
    store.put(rid, previous, [user(f"q-{text}")], [said(f"a-{text}")], {"id": rid, "object": "response"})


def texts(items: list[Item]) -> list[str]:
    return [i.content if isinstance(i.content, str) else i.content[0]["text"] for i in items]  # type: ignore[index]


def test_a_chain_resolves_every_input_and_output_oldest_first() -> None:
    store = ResponseStore(10, 1 << 20)
    put(store, "r1", None, "1")
    put(store, "r2", "r1", "2")
    put(store, "r3", "r2", "3")
    put(store, "fork", "r1", "f")
    assert texts(store.chain("r3")) == ["q-1", "a-1", "q-2", "a-2", "q-3", "a-3"]
    assert texts(store.chain("fork")) == ["q-1", "a-1", "q-f", "a-f"]
    assert store.get("r2") == {"id": "r2", "object": "response"}
    assert len(store) == 4 and store.bytes > 0


def test_unknown_ids_are_a_400_naming_the_field() -> None:
    store = ResponseStore(10, 1 << 20)
    with pytest.raises(BadRequest, match="'nope' not found: no response with this id") as e:
        store.chain("nope")
    assert (e.value.param, e.value.code, e.value.http_status) == (
        "previous_response_id",
        "previous_response_not_found",
        400,
    )
    with pytest.raises(ResponseNotFound) as g:
        store.get("nope")
    assert g.value.http_status == 404 and g.value.code == "response_not_found"
    with pytest.raises(ResponseNotFound):
        store.delete("nope")


def test_the_count_bound_evicts_the_least_recently_used_and_says_so() -> None:
    store = ResponseStore(3, 1 << 20)
    put(store, "side", None, "s")
    put(store, "r1", None, "1")
    put(store, "r2", "r1", "2")
    store.chain("r2")  # touches r1 and r2: "side" is now the least recently used
    put(store, "r3", "r2", "3")
    assert store.evictions == 1
    with pytest.raises(BadRequest, match="'side' not found: it was evicted"):
        store.chain("side")
    assert texts(store.chain("r3"))[-1] == "a-3"
    put(store, "r4", "r3", "4")  # the chain alone is over the bound: its root goes
    with pytest.raises(BadRequest, match=r"chain reaches 'r1', which is no longer stored .*evicted"):
        store.chain("r4")


def test_the_byte_bound_evicts_and_refuses_what_alone_exceeds_it() -> None:
    one = ResponseStore(100, 1 << 20)
    put(one, "r", None, "x")
    size = one.bytes
    store = ResponseStore(100, 2 * size + size // 2)
    for rid in ("a", "b", "c"):
        put(store, rid, None, "x")
    assert len(store) == 2 and store.bytes <= store.max_bytes and store.evictions == 1
    big = ResponseStore(100, size - 1)
    put(big, "huge", None, "x")
    assert len(big) == 0
    with pytest.raises(BadRequest, match="it was not stored: it alone exceeds"):
        big.chain("huge")


def test_delete_and_clear() -> None:
    store = ResponseStore(10, 1 << 20)
    put(store, "r1", None, "1")
    put(store, "r2", "r1", "2")
    store.delete("r1")
    with pytest.raises(BadRequest, match="chain reaches 'r1'"):
        store.chain("r2")
    store.clear()
    assert len(store) == 0 and store.bytes == 0
    with pytest.raises(BadRequest, match="trial is closed"):
        store.chain("r2")
    put(store, "late", None, "x")  # a response finishing after close is not kept
    assert len(store) == 0


def test_zero_bound_stores_nothing() -> None:
    store = ResponseStore(0, 1 << 20)
    put(store, "r1", None, "1")
    assert len(store) == 0
    with pytest.raises(BadRequest, match="evicted"):
        store.chain("r1")
