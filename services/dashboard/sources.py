"""The dashboard's clients of live services, over their public gRPC contracts:
the capture store (ListTrajectories, GetTrajectory) and the trainer (Status,
Metrics). Each gRPC failure becomes a typed error naming the target."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from harnessrl.errors import HarnessError, InvalidArgument, NotFound, PermissionDenied, Unavailable
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2, trainer_pb2, trainer_pb2_grpc
from services.dashboard.rundir import RunDir, StepRecord

_CODES: dict[grpc.StatusCode, type[HarnessError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
}


async def _call(target: str, what: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await fn()
    except grpc.aio.AioRpcError as e:
        cls = _CODES.get(e.code(), Unavailable)
        raise cls(f"{what} at {target}: {e.code().name}: {e.details()}") from e


class CaptureReader:
    """Read access to one capture store (shared by every run it holds)."""

    def __init__(self, target: str, token: str | None, timeout_s: float) -> None:
        self.target = target
        self._channel = connect(target, token)
        self._stub = capture_pb2_grpc.CaptureStoreStub(self._channel)
        self._timeout = timeout_s

    async def list_all(self, run_id: str) -> list[records_pb2.Trajectory]:
        out: list[records_pb2.Trajectory] = []
        token = ""
        while True:
            req = capture_pb2.ListTrajectoriesRequest(run_id=run_id, page_size=1000, page_token=token)
            resp = await _call(self.target, "capture store", functools.partial(self._list, req))
            out.extend(resp.trajectories)
            token = resp.next_page_token
            if not token:
                return out

    async def _list(self, req: capture_pb2.ListTrajectoriesRequest) -> capture_pb2.ListTrajectoriesResponse:
        resp: capture_pb2.ListTrajectoriesResponse = await self._stub.ListTrajectories(req, timeout=self._timeout)
        return resp

    async def get(self, run_id: str, trial_id: str, include_tokens: bool = True) -> records_pb2.Trajectory:
        req = capture_pb2.GetTrajectoryRequest(run_id=run_id, trial_id=trial_id, include_tokens=include_tokens)
        result: records_pb2.Trajectory = await _call(
            self.target, "capture store", lambda: self._stub.GetTrajectory(req, timeout=self._timeout)
        )
        return result

    async def close(self) -> None:
        await self._channel.close()


class TrainerReader:
    """The trainer of a live run: its status and per-step metrics."""

    def __init__(self, target: str, token: str | None, timeout_s: float) -> None:
        self.target = target
        self._channel = connect(target, token)
        self._stub = trainer_pb2_grpc.TrainerStub(self._channel)
        self._timeout = timeout_s

    async def status(self) -> dict[str, Any]:
        s = await _call(
            self.target, "trainer", lambda: self._stub.Status(trainer_pb2.StatusRequest(), timeout=self._timeout)
        )
        return {
            "run_id": s.run_id,
            "step": s.step,
            "policy_version": s.policy_version,
            "state": s.state,
            "groups_pending": s.groups_pending,
            "trainer_idle_fraction": s.trainer_idle_fraction,
            "alerts": list(s.alerts),
        }

    async def metrics(self, since_step: int = 0) -> list[StepRecord]:
        req = trainer_pb2.MetricsRequest(since_step=since_step)
        resp = await _call(self.target, "trainer", lambda: self._stub.Metrics(req, timeout=self._timeout))
        return [StepRecord(m.step, m.wall_time, dict(m.values)) for m in resp.steps]

    async def close(self) -> None:
        await self._channel.close()


@dataclass(frozen=True)
class CaptureEndpoint:
    """A capture store's gRPC target and, if it has its own, the credential to read it."""

    target: str
    token: str | None = None


class CaptureOpener(Protocol):
    """Finds the capture store of a run.

    The default one knows distributed stores only (run.json's ``capture.target``);
    the composition root (``stack.dashboard``) also opens embedded directories."""

    async def target_for(self, run: RunDir) -> CaptureEndpoint: ...

    async def close(self) -> None: ...


class TargetOpener:
    def __init__(self, override: str | None = None) -> None:
        self._override = override

    async def target_for(self, run: RunDir) -> CaptureEndpoint:
        if self._override:
            return CaptureEndpoint(self._override)
        ref = run.info.capture if run.info else None
        if ref is None:
            raise Unavailable("run.json names no capture store")
        if ref.target:
            return CaptureEndpoint(ref.target)
        raise Unavailable(
            f"the capture store of run {run.run_id} is an embedded directory ({run.capture_dir()}): "
            "serve the dashboard with `harnessrl dashboard serve`, which opens it"
        )

    async def close(self) -> None:
        return None


class Readers:
    """One channel per target, shared by the requests that need it."""

    def __init__(self, capture_token: str | None, trainer_token: str | None, timeout_s: float) -> None:
        self._capture: dict[tuple[str, str | None], CaptureReader] = {}
        self._trainer: dict[str, TrainerReader] = {}
        self._tokens = (capture_token, trainer_token)
        self._timeout = timeout_s
        self._lock = asyncio.Lock()

    async def capture(self, endpoint: CaptureEndpoint) -> CaptureReader:
        key = (endpoint.target, endpoint.token or self._tokens[0])
        async with self._lock:
            if key not in self._capture:
                self._capture[key] = CaptureReader(key[0], key[1], self._timeout)
            return self._capture[key]

    async def trainer(self, target: str) -> TrainerReader:
        async with self._lock:
            if target not in self._trainer:
                self._trainer[target] = TrainerReader(target, self._tokens[1], self._timeout)
            return self._trainer[target]

    async def close(self) -> None:
        for capture in self._capture.values():
            await capture.close()
        for trainer in self._trainer.values():
            await trainer.close()
