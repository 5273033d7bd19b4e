"""Stored responses of one trial, for OpenAI Responses' ``previous_response_id``.

A response stored (``store`` is true unless the request says false) keeps the
input items its request added and the output items the proxy returned, plus
the id of the response it continued. A request naming it continues the chain:
its conversation is every stored input and output along the chain, oldest
first, then its own input, exactly what a harness sending the whole input
would have sent, so the capture extends one segment across the chain.

The store is per trial (a trial can only name its own responses: the lookup
goes through the trial its token authenticated), bounded in count and bytes
(least recently used responses are evicted first; resolving a chain touches
every response on it), and dropped when the trial closes. Naming an unknown,
unstored, evicted or other-trial id is a clear 400 in the Responses format.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harnessrl.logs import kv
from services.proxy.errors import BadRequest

if TYPE_CHECKING:  # the store is held by trials.py, which protocol (and so models) imports
    from services.proxy.responses.models import Item

log = logging.getLogger(__name__)
MAX_CHAIN = 100_000  # a cycle is impossible (ids are fresh), this only bounds a corrupted store
REMEMBER_EVICTED = 4096  # evicted ids remembered, to say "evicted" rather than "unknown"
ITEM_OVERHEAD = 200  # bytes charged per item besides its text (ids, types, the objects themselves)


class ResponseNotFound(BadRequest):
    """GET/DELETE of an id this trial does not hold: OpenAI's 404 ``invalid_request_error``."""

    http_status = 404

    def __init__(self, message: str) -> None:
        super().__init__(message, param="response_id", code="response_not_found")


@dataclass(frozen=True)
class Stored:
    id: str
    previous: str | None  # the response this one continued
    input: tuple[Item, ...]  # the input items its own request added
    output: tuple[Item, ...]  # the items the proxy returned, as a harness would echo them
    response: dict[str, Any]  # the response object, for GET /v1/responses/{id}
    size: int  # bytes charged against the bound (an estimate: ``item_bytes``)


class ResponseStore:
    """One trial's stored responses. Not thread-safe: use from one event loop."""

    def __init__(self, max_count: int, max_bytes: int, scope: str = "this trial") -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.scope = scope  # whose responses these are, for error messages
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._evicted: deque[str] = deque(maxlen=REMEMBER_EVICTED)
        self._too_large: deque[str] = deque(maxlen=REMEMBER_EVICTED)
        self.bytes = 0
        self.evictions = 0
        self.closed = False
        self.chained = 0  # requests whose previous_response_id this store resolved (a trial's: any transport)
        self.ws_connections = 0  # WebSocket connections of the trial (``ws.py``)
        self.dropped_tools: dict[str, int] = {}  # hosted tool type: requests it was dropped from (``tools.py``)

    def __len__(self) -> int:
        return len(self._items)

    def _missing(self, response_id: str, param: str) -> BadRequest:
        if response_id in self._evicted:
            why = (
                f"it was evicted: a trial keeps at most {self.max_count} responses and {self.max_bytes} bytes "
                "(proxy settings responses_store_max_count / _max_bytes); send the whole input instead"
            )
        elif response_id in self._too_large:
            why = f"it was not stored: it alone exceeds the per-trial bound of {self.max_bytes} bytes"
        elif self.closed:
            why = "the trial is closed and its stored responses were dropped"
        else:
            why = (
                f"no response with this id was stored by {self.scope} (ids are per trial; store=false is not stored "
                "over HTTP, and a WebSocket connection keeps only its own store=false responses)"
            )
        return BadRequest(
            f"Previous response with id {response_id!r} not found: {why}",
            param=param,
            code="previous_response_not_found",
        )

    def chain(self, response_id: str, *more: ResponseStore) -> list[Item]:
        """Every item of the conversation up to and including ``response_id``'s output.
        ``more``: further stores a link may be in (a WebSocket connection's cache is
        asked first, then its trial's store)."""
        stores = (self, *more)
        links: list[tuple[ResponseStore, Stored]] = []
        current: str | None = response_id
        while current is not None:
            found = [(s, s._items[current]) for s in stores if current in s._items]
            if not found:
                why = _why_missing(current, stores)
                if current == response_id:
                    raise why
                raise BadRequest(
                    f"Previous response with id {response_id!r} cannot be continued: its chain reaches "
                    f"{current!r}, which is no longer stored ({why.args[0]})",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            links.append(found[0])
            if len(links) > MAX_CHAIN:
                raise BadRequest(f"response chain of {response_id!r} is too long", param="previous_response_id")
            current = found[0][1].previous
        items: list[Item] = []
        for store, node in reversed(links):  # oldest first; the most recent ends most recently used
            store._items.move_to_end(node.id)
            items += node.input
            items += node.output
        stores[-1].chained += 1
        return items

    def get(self, response_id: str) -> dict[str, Any]:
        node = self._items.get(response_id)
        if node is None:
            raise ResponseNotFound(f"No response found with id {response_id!r} in this trial")
        return node.response

    def delete(self, response_id: str) -> None:
        node = self._items.pop(response_id, None)
        if node is None:
            raise ResponseNotFound(f"No response found with id {response_id!r} in this trial")
        self.bytes -= node.size

    def put(
        self,
        response_id: str,
        previous: str | None,
        new_input: Sequence[Item],
        output: Sequence[Item],
        response: dict[str, Any],
    ) -> None:
        """Stores a response; ``output`` are its items as a harness echoes them."""
        if self.closed:
            return
        inputs = tuple(new_input)
        outputs = tuple(output)
        # Outputs count twice: as items and in the response object GET returns.
        size = sum(map(item_bytes, inputs)) + 2 * sum(map(item_bytes, outputs))
        if size > self.max_bytes:
            self._too_large.append(response_id)
            log.info("response not stored: over the bound", extra=kv(response=response_id, bytes=size))
            return
        node = Stored(response_id, previous, inputs, outputs, response, size)
        self._items[response_id] = node
        self.bytes += size
        while len(self._items) > self.max_count or self.bytes > self.max_bytes:
            old_id, old = self._items.popitem(last=False)
            self.bytes -= old.size
            self.evictions += 1
            self._evicted.append(old_id)

    def clear(self) -> None:
        """Drops everything (the trial ended); later lookups say why they fail."""
        self._items.clear()
        self.bytes = 0
        self.closed = True


def _why_missing(response_id: str, stores: Sequence[ResponseStore]) -> BadRequest:
    """The reason of the store that knows one (it evicted the id or refused it), else the last's."""
    for store in stores:
        if response_id in store._evicted or response_id in store._too_large:
            return store._missing(response_id, "previous_response_id")
    return stores[-1]._missing(response_id, "previous_response_id")


def item_bytes(item: Item) -> int:
    """The text an item holds, plus a fixed overhead: an estimate that is cheap on
    every turn (serialising each stored item costs O(context) CPU per call)."""
    n = ITEM_OVERHEAD
    for value in (item.content, item.output, item.summary):
        if isinstance(value, str):
            n += len(value)
        elif value:
            n += sum(len(v) for part in value for v in part.values() if isinstance(v, str))
    for text in (item.arguments, item.input, item.name, item.call_id):
        n += len(text) if text else 0
    return n
