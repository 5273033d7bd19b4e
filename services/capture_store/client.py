"""Operator access to a capture store, for the CLI: over gRPC to a running
store (``--target``), or by opening a store directly (``--store DIR`` for an
embedded directory, ``--config FILE`` for any backend) when no server runs.
Both answer with the same messages the RPCs return."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator

import grpc

from harnessrl.errors import FailedPrecondition, HarnessError, InvalidArgument, NotFound, PermissionDenied, Unavailable
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.capture_store.auth import RUN_TOKEN_HEADER
from services.capture_store.server import open_backend
from services.capture_store.service import CaptureService
from services.capture_store.settings import Settings

_CODES: dict[grpc.StatusCode, type[HarnessError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
}


class StoreClient(abc.ABC):
    @abc.abstractmethod
    async def get(self, run: str, trial: str, include_tokens: bool) -> records_pb2.Trajectory: ...

    @abc.abstractmethod
    async def list_page(self, req: capture_pb2.ListTrajectoriesRequest) -> capture_pb2.ListTrajectoriesResponse: ...

    @abc.abstractmethod
    async def delete_run(self, run: str) -> int: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def runs_with_trial(self, trial: str) -> list[str]:
        raise InvalidArgument("--run is required when talking to a store over gRPC (--target)")

    async def list_all(self, run: str) -> AsyncIterator[records_pb2.Trajectory]:
        token = ""
        while True:
            resp = await self.list_page(
                capture_pb2.ListTrajectoriesRequest(run_id=run, page_size=1000, page_token=token)
            )
            for traj in resp.trajectories:
                yield traj
            token = resp.next_page_token
            if not token:
                return


class GrpcClient(StoreClient):
    def __init__(self, target: str, token: str | None, run_token: str | None) -> None:
        self._channel = connect(target, token)
        self._stub = capture_pb2_grpc.CaptureStoreStub(self._channel)
        self._md = ((RUN_TOKEN_HEADER, run_token),) if run_token else ()
        self._target = target

    async def _call(self, method: str, req: object) -> object:
        try:
            return await getattr(self._stub, method)(req, metadata=self._md, timeout=300)
        except grpc.aio.AioRpcError as e:
            cls = _CODES.get(e.code(), Unavailable)
            raise cls(f"{self._target}: {e.code().name}: {e.details()}") from e

    async def get(self, run: str, trial: str, include_tokens: bool) -> records_pb2.Trajectory:
        req = capture_pb2.GetTrajectoryRequest(run_id=run, trial_id=trial, include_tokens=include_tokens)
        return await self._call("GetTrajectory", req)  # type: ignore[return-value]

    async def list_page(self, req: capture_pb2.ListTrajectoriesRequest) -> capture_pb2.ListTrajectoriesResponse:
        return await self._call("ListTrajectories", req)  # type: ignore[return-value]

    async def delete_run(self, run: str) -> int:
        resp = await self._call("DeleteRun", capture_pb2.DeleteRunRequest(run_id=run))
        return int(resp.trajectories_deleted)  # type: ignore[attr-defined]

    async def close(self) -> None:
        await self._channel.close()


class LocalClient(StoreClient):
    """Opens the store in this process. Writers (delete, sweep) take the
    embedded store's lock, so they refuse to run beside a serving store."""

    def __init__(self, settings: Settings, *, writer: bool) -> None:
        self.service = CaptureService(settings, open_backend(settings, writer=writer))

    async def get(self, run: str, trial: str, include_tokens: bool) -> records_pb2.Trajectory:
        return await self.service.get(run, trial, include_tokens)

    async def list_page(self, req: capture_pb2.ListTrajectoriesRequest) -> capture_pb2.ListTrajectoriesResponse:
        return await self.service.list_trajectories(req)

    async def delete_run(self, run: str) -> int:
        return await self.service.delete_run(run)

    async def runs_with_trial(self, trial: str) -> list[str]:
        return await self.service.call(lambda: self.service.backend.runs_with_trial(trial), "find")  # type: ignore[no-any-return]

    async def close(self) -> None:
        await self.service.close()
