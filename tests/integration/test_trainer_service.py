"""The Trainer gRPC service: Status and Metrics over real gRPC, TensorBoard files, bad input."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harnessrl.rpc import connect
from harnessrl.v1 import trainer_pb2, trainer_pb2_grpc
from services.trainer.server import create_server
from services.trainer.service import TrainerService
from services.trainer.settings import Settings


async def test_status_and_metrics_over_grpc(tmp_path: Path) -> None:
    service = TrainerService("run-a", tensorboard_dir=tmp_path / "tb")
    running = await create_server(Settings(run_id="run-a", auth_token="s3cret"), service)
    try:
        async with connect(f"127.0.0.1:{running.port}", "s3cret") as channel:
            stub = trainer_pb2_grpc.TrainerStub(channel)
            status = await stub.Status(trainer_pb2.StatusRequest())
            assert (status.run_id, status.state, status.step) == ("run-a", "starting", 0)
            service.set_state("waiting", groups_pending=3)
            service.record_step(1, 1, {"loss/total": 0.5, "reward/mean": 0.25}, [])
            service.record_step(2, 2, {"loss/total": 0.25, "reward/mean": 0.5}, ["agreement low"])
            status = await stub.Status(trainer_pb2.StatusRequest())
            assert (status.step, status.policy_version, status.groups_pending) == (2, 2, 3)
            assert list(status.alerts) == ["agreement low"]
            assert 0.0 < status.trainer_idle_fraction <= 1.0
            metrics = await stub.Metrics(trainer_pb2.MetricsRequest(since_step=0))
            assert [s.step for s in metrics.steps] == [1, 2]
            assert metrics.steps[1].values["reward/mean"] == 0.5
            later = await stub.Metrics(trainer_pb2.MetricsRequest(since_step=1))
            assert [s.step for s in later.steps] == [2]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Metrics(trainer_pb2.MetricsRequest(since_step=-5))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "since_step" in (err.value.details() or "")
        async with connect(f"127.0.0.1:{running.port}", "wrong") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await trainer_pb2_grpc.TrainerStub(channel).Status(trainer_pb2.StatusRequest())
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await running.stop(0)
        service.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss/total")] == [(1, 0.5), (2, 0.25)]


def test_unknown_state_is_rejected() -> None:
    with pytest.raises(ValueError, match="valid"):
        TrainerService("r").set_state("sleeping")
