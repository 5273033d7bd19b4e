"""WatchReady subscriptions: deliveries of ready groups to a consumer, with acks.

Semantics (both backends): a consumer group starts at the beginning of the
run's ready stream; each ready group is delivered to one consumer of the
group and stays pending until acked. On subscribe a consumer first gets its
own unacked groups again, then those of consumers that are gone (that left,
or whose lease lapsed); then new groups as they become ready. A restarted
trainer therefore sees everything it had not acknowledged, with
``redeliveries`` counting earlier deliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

from harnessrl.errors import FailedPrecondition, HarnessError, InvalidArgument
from harnessrl.v1 import capture_pb2
from services.capture_store import validate
from services.capture_store.backend import Delivery
from services.capture_store.service import CaptureService

log = logging.getLogger(__name__)

POLL_S = 0.5  # other replicas' finalizations are seen by polling; ours wake the subscription at once
BATCH = 32


class Subscription:
    def __init__(self, service: CaptureService, sub: capture_pb2.WatchReadyRequest.Subscribe) -> None:
        validate.check_run(sub.run_id)
        validate.check_id(sub.consumer_group, "subscribe.consumer_group")
        if sub.consumer:
            validate.check_id(sub.consumer, "subscribe.consumer")
        self.run, self.group = sub.run_id, sub.consumer_group
        self.consumer = sub.consumer or f"anonymous-{uuid.uuid4().hex[:12]}"
        self._service = service
        self._backend = service.backend
        self._lease = service.settings.ready_lease_s
        self._delivered: dict[str, str] = {}  # group_id -> stream entry
        self._wake = asyncio.Event()
        self._error: HarnessError | None = None
        self._opened = False

    async def open(self) -> None:
        await self._service.call(
            lambda: self._backend.ready_subscribe(self.run, self.group, self.consumer, self._lease), "subscribe"
        )
        self._service.add_ready_waiter(self._wake)
        self._opened = True
        log.info("subscribed", extra={"kv": {"run": self.run, "group": self.group, "consumer": self.consumer}})

    async def groups(self) -> AsyncIterator[capture_pb2.ReadyGroup]:
        """Yields ready groups until the caller stops iterating or an ack fails."""
        call = self._service.call
        pending = await call(lambda: self._backend.ready_claim(self.run, self.group, self.consumer, True), "claim")
        last_beat = time.monotonic()
        while True:
            for delivery in pending:
                yield self._message(delivery)
            self._raise_if_failed()
            pending = await call(lambda: self._backend.ready_read(self.run, self.group, self.consumer, BATCH), "read")
            if time.monotonic() - last_beat > self._lease / 3:
                last_beat = time.monotonic()
                await call(self._beat, "heartbeat")
                pending += await call(
                    lambda: self._backend.ready_claim(self.run, self.group, self.consumer, False), "claim"
                )
            if not pending:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL_S)
                self._wake.clear()

    def _beat(self) -> None:
        self._backend.ready_heartbeat(self.run, self.group, self.consumer, self._lease)

    def _message(self, delivery: Delivery) -> capture_pb2.ReadyGroup:
        msg = capture_pb2.ReadyGroup.FromString(delivery.payload)
        msg.redeliveries = delivery.redeliveries
        self._delivered[msg.group_id] = delivery.entry
        return msg

    async def ack(self, ack: capture_pb2.WatchReadyRequest.Ack) -> None:
        entry = self._delivered.get(ack.group_id)
        if entry is None:
            entry = await self._service.call(lambda: self._backend.ready_find(self.run, ack.group_id), "ack")
        if entry is None:
            raise FailedPrecondition(f"ack for group {ack.group_id!r}, which is not ready in run {self.run!r}")
        await self._service.call(lambda: self._backend.ready_ack(self.run, self.group, entry), "ack")
        self._delivered.pop(ack.group_id, None)

    async def consume_requests(self, requests: AsyncIterator[capture_pb2.WatchReadyRequest]) -> None:
        """Applies the acks that follow the subscribe; a bad one ends the stream with its error."""
        try:
            async for req in requests:
                if req.WhichOneof("kind") != "ack":
                    raise InvalidArgument("after the first message, WatchReady takes only acks")
                await self.ack(req.ack)
        except HarnessError as e:
            self._error = e
            self._wake.set()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    async def close(self) -> None:
        self._service.remove_ready_waiter(self._wake)
        if self._opened:
            try:
                await self._service.call(
                    lambda: self._backend.ready_leave(self.run, self.group, self.consumer), "leave"
                )
            except HarnessError:
                log.warning("could not mark consumer gone; its lease will lapse", extra={"kv": {"run": self.run}})
