"""In-test stand-ins served over real gRPC on 127.0.0.1, until the real capture
store and gateway branches are merged: a capture store holding trajectories in
memory (ListTrajectories, GetTrajectory, WatchReady with acks and
redelivery) and a sampler that plays the policy with the real model."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import grpc
import torch

from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2


class FakeCaptureStore(capture_pb2_grpc.CaptureStoreServicer):
    def __init__(self) -> None:
        self.trajectories: dict[tuple[str, str], records_pb2.Trajectory] = {}
        self.groups: list[capture_pb2.ReadyGroup] = []
        self.acked: set[tuple[str, str]] = set()
        self.deliveries: Counter[tuple[str, str]] = Counter()
        self.changed = asyncio.Event()
        self.requests: Counter[str] = Counter()

    def add_group(self, run_id: str, group_id: str, trajs: Sequence[records_pb2.Trajectory], step: int = 0) -> None:
        for t in trajs:
            self.trajectories[(run_id, t.trial_id)] = t
        ready = capture_pb2.ReadyGroup(
            run_id=run_id, group_id=group_id, step=step, trial_ids=[t.trial_id for t in trajs]
        )
        self.groups.append(ready)
        self.changed.set()

    async def ListTrajectories(self, request, context):  # type: ignore[no-untyped-def]
        self.requests["ListTrajectories"] += 1
        items = sorted(
            (t for (run, _), t in self.trajectories.items() if run == request.run_id), key=lambda t: t.trial_id
        )
        start = int(request.page_token or 0)
        size = request.page_size or 100
        page = items[start : start + size]
        out = capture_pb2.ListTrajectoriesResponse(
            next_page_token=str(start + size) if start + size < len(items) else ""
        )
        for t in page:
            meta = records_pb2.Trajectory()
            meta.CopyFrom(t)
            del meta.segments[:]
            out.trajectories.append(meta)
        return out

    async def GetTrajectory(self, request, context):  # type: ignore[no-untyped-def]
        self.requests["GetTrajectory"] += 1
        key = (request.run_id, request.trial_id)
        if key not in self.trajectories:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no trajectory {key}")
        return self.trajectories[key]

    async def WatchReady(self, request_iterator, context):  # type: ignore[no-untyped-def]
        first = await anext(request_iterator)
        run_id = first.subscribe.run_id
        sent: set[str] = set()

        async def read_acks() -> None:
            async for req in request_iterator:
                if req.HasField("ack"):
                    self.acked.add((run_id, req.ack.group_id))

        reader = asyncio.ensure_future(read_acks())
        try:
            while True:
                self.changed.clear()
                for g in list(self.groups):
                    key = (g.run_id, g.group_id)
                    if g.run_id != run_id or key in self.acked or g.group_id in sent:
                        continue
                    sent.add(g.group_id)
                    out = capture_pb2.ReadyGroup()
                    out.CopyFrom(g)
                    out.redeliveries = self.deliveries[key]
                    self.deliveries[key] += 1
                    yield out
                await self.changed.wait()
        finally:
            reader.cancel()


@contextlib.asynccontextmanager
async def serve(*servicers: object) -> AsyncIterator[str]:
    """Serves the given servicers on 127.0.0.1:<free port>; yields host:port."""
    server = grpc.aio.server()
    for s in servicers:
        if isinstance(s, capture_pb2_grpc.CaptureStoreServicer):
            capture_pb2_grpc.add_CaptureStoreServicer_to_server(s, server)
        else:
            from harnessrl.v1 import gateway_pb2_grpc

            gateway_pb2_grpc.add_RolloutGatewayServicer_to_server(s, server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@torch.no_grad()
def sample(
    model: torch.nn.Module, prompt: Sequence[int], n: int, generator: torch.Generator, temperature: float = 1.0
) -> tuple[list[int], list[float]]:
    """Samples ``n`` tokens from ``model`` after ``prompt``; returns ids and their logprobs
    under the sampling distribution (what an engine records)."""
    ids = list(prompt)
    out_ids, out_lps = [], []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float() / temperature
        logp = torch.log_softmax(logits, -1)
        tok = int(torch.multinomial(logp.exp(), 1, generator=generator))
        out_ids.append(tok)
        out_lps.append(float(logp[tok]))
        ids.append(tok)
    return out_ids, out_lps
