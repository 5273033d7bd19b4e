"""``harnessrl train serve`` with a capture store: trains on ready groups, serves
Status/Metrics, stops on SIGTERM, and a restart resumes without retraining."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harnessrl import paths
from harnessrl.localservers import restartable_port
from harnessrl.rpc import connect
from harnessrl.v1 import trainer_pb2, trainer_pb2_grpc
from services.capture_store.server import create_server as create_capture
from services.capture_store.settings import Settings as CaptureSettings
from tests.integration.test_trainer_async import RUN, put_group

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared"),
]


@pytest.fixture
async def capture(tmp_path: Path) -> AsyncIterator[str]:
    server = await create_capture(CaptureSettings(store_dir=tmp_path / "store", fsync=False, shutdown_grace_s=0.2))
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(0.2)


async def status_when(port: int, predicate, timeout_s: float = 600) -> trainer_pb2.TrainerStatus:  # type: ignore[no-untyped-def]
    async with connect(f"127.0.0.1:{port}") as channel:
        stub = trainer_pb2_grpc.TrainerStub(channel)
        for _ in range(int(timeout_s / 0.5)):
            try:
                status = await stub.Status(trainer_pb2.StatusRequest(), timeout=5)
                if predicate(status):
                    return status
            except Exception:  # noqa: BLE001 - not serving yet
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError("trainer never reached the expected status")


def start(config: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "stack.cli", "train", "serve", "-c", str(config), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )


async def test_serve_trains_resumes_and_stops_cleanly(capture: str, tmp_path: Path) -> None:
    config = tmp_path / "harnessrl.toml"
    config.write_text(
        f'[trainer]\nrun_id = "{RUN}"\noutput_dir = "{tmp_path / "out"}"\ncapture_target = "{capture}"\n'
        "[trainer.optim]\nlr = 1e-5\ngradient_checkpointing = false\n"
        "[trainer.rollout]\ngroups_per_step = 1\nmax_staleness = 3\n"
    )
    await put_group(capture, "a", 0, [1.0, 0.0])
    port = restartable_port()
    proc = start(config, port)
    try:
        status = await status_when(port, lambda s: s.step >= 1)
        assert (status.run_id, status.policy_version) == (RUN, 1)
        async with connect(f"127.0.0.1:{port}") as channel:
            metrics = await trainer_pb2_grpc.TrainerStub(channel).Metrics(trainer_pb2.MetricsRequest())
        assert metrics.steps[0].values["batch/groups"] == 1.0 and "loss/total" in metrics.steps[0].values
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    assert code == 0, proc.stdout.read().decode() if proc.stdout else ""
    assert list((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "out" / "checkpoints" / "step-00000001" / "model.safetensors").exists()

    proc = start(config, port)
    try:
        status = await status_when(port, lambda s: s.step >= 1)
        assert (status.step, status.policy_version) == (1, 1)  # resumed from its checkpoint
        await put_group(capture, "b", 1, [0.0, 1.0])
        status = await status_when(port, lambda s: s.step >= 2)
        assert status.policy_version == 2
        async with connect(f"127.0.0.1:{port}") as channel:
            metrics = await trainer_pb2_grpc.TrainerStub(channel).Metrics(trainer_pb2.MetricsRequest(since_step=1))
        assert [s.step for s in metrics.steps] == [2]
        assert metrics.steps[0].values.get("dropped/duplicate_groups", 0.0) <= 1.0  # "a" if redelivered: skipped
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    assert code == 0
