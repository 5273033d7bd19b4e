"""Invariant 7 under faults: real Redis, real S3 and the embedded server are
killed and restarted mid-run; no acknowledged part is lost and none is stored
twice. Writers retry what failed, as the proxy does; the store deduplicates."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import redis

from harnessrl import arrays
from harnessrl.errors import Unavailable
from harnessrl.localservers import S3_PORT_FLAGS, RedisServer, S3Server, restartable_port
from harnessrl.rpc import check_health, connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc
from services.capture_store.server import create_server
from services.capture_store.settings import Settings
from tests.integration.test_capture.conftest import SERVICE_TOKEN, append_request

WRITERS, PARTS = 12, 30


async def _append_until_acked(stub: capture_pb2_grpc.CaptureStoreStub, req) -> capture_pb2.AppendSegmentResponse:
    for _ in range(300):
        try:
            return await stub.AppendSegment(req, timeout=60)
        except grpc.aio.AioRpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("never acknowledged")


async def _run_with_fault(target: str, fault: Callable[[], Awaitable[None]]) -> dict[str, list]:
    """Writers append PARTS parts each while ``fault`` runs; returns the acked requests per trial."""
    acked: dict[str, list] = {f"t{w}": [] for w in range(WRITERS)}
    started = asyncio.Event()
    async with connect(target, SERVICE_TOKEN) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)

        async def writer(trial: str) -> None:
            for p in range(PARTS):
                req = append_request("r1", trial, part=p, n=64, close=p == PARTS - 1)
                resp = await _append_until_acked(stub, req)
                assert resp.segment_tokens == 10 + 64 * (p + 1)
                acked[trial].append(req)
                if sum(map(len, acked.values())) >= WRITERS * 3:
                    started.set()
                await asyncio.sleep(0.03)

        async def chaos() -> None:
            await started.wait()
            before = sum(map(len, acked.values()))
            await fault()
            assert 0 < before < WRITERS * PARTS  # the fault hit mid-run

        await asyncio.gather(chaos(), *(writer(t) for t in acked))
    return acked


async def _check_exactly_once(target: str, acked: dict[str, list]) -> None:
    async with connect(target, SERVICE_TOKEN) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)
        for trial, reqs in acked.items():
            traj = await stub.GetTrajectory(
                capture_pb2.GetTrajectoryRequest(run_id="r1", trial_id=trial, include_tokens=True)
            )
            (seg,) = traj.segments
            assert seg.num_turns == len(reqs) == PARTS and seg.closed
            want = np.concatenate([arrays.unpack_i32(r.tokens.ids) for r in reqs])
            np.testing.assert_array_equal(arrays.unpack_i32(seg.response.ids), want)
            want_lp = np.concatenate([arrays.unpack_f32(r.tokens.logprobs) for r in reqs])
            np.testing.assert_array_equal(arrays.unpack_f32(seg.response.logprobs), want_lp)


def _distributed(redis_server: RedisServer, s3: S3Server, bucket: str, total_s: float = 60) -> Settings:
    return Settings.model_validate(_distributed_fields(redis_server, s3, bucket, total_s))


def _distributed_fields(redis_server: RedisServer, s3: S3Server, bucket: str, total_s: float = 60) -> dict[str, Any]:
    return dict(
        backend="distributed", redis_url=redis_server.url, s3_endpoint=s3.endpoint, s3_bucket=bucket,
        s3_access_key=s3.access_key, s3_secret_key=s3.secret_key, auth_token=SERVICE_TOKEN,
        retry={"total_s": total_s, "max_s": 0.5}, shutdown_grace_s=0.5,
    )  # fmt: skip


async def _restart(server: RedisServer | S3Server, down_s: float) -> None:
    await asyncio.to_thread(server.kill)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(server.start)
    if isinstance(server, RedisServer):
        _fsync_always(server)


def _fsync_always(server: RedisServer) -> RedisServer:
    """The durability a capture store's Redis needs: every write fsynced to the AOF
    before the reply (appendonly alone fsyncs once a second)."""
    with redis.Redis.from_url(server.url) as client:
        client.config_set("appendfsync", "always")
    return server


async def test_redis_killed_and_restarted_mid_run(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with RedisServer(appendonly=True, dir=tmp_path) as redis_server:
        _fsync_always(redis_server)
        running = await create_server(_distributed(redis_server, s3_server, s3_bucket))
        target = f"127.0.0.1:{running.port}"
        try:
            with caplog.at_level(logging.WARNING, "services.capture_store"):
                acked = await _run_with_fault(target, lambda: _restart(redis_server, 1.0))
            await _check_exactly_once(target, acked)
        finally:
            await running.stop()
    assert any("retrying" in r.message for r in caplog.records)  # appends waited out the outage


async def test_s3_killed_and_restarted_mid_run(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with S3Server(dir=tmp_path) as s3:
        bucket = "fault-bucket"
        await asyncio.to_thread(s3.client().create_bucket, Bucket=bucket)
        running = await create_server(_distributed(redis_server, s3, bucket))
        target = f"127.0.0.1:{running.port}"
        try:
            with caplog.at_level(logging.WARNING, "services.capture_store"):
                acked = await _run_with_fault(target, lambda: _restart(s3, 1.5))
            await _check_exactly_once(target, acked)
        finally:
            await running.stop()
    assert any("retrying" in r.message for r in caplog.records)


async def test_outage_past_the_retry_budget_is_unavailable_and_leaves_nothing(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    with RedisServer(appendonly=True, dir=tmp_path) as redis_server:
        running = await create_server(_distributed(redis_server, s3_server, s3_bucket, total_s=1.0))
        try:
            async with connect(f"127.0.0.1:{running.port}", SERVICE_TOKEN) as channel:
                stub = capture_pb2_grpc.CaptureStoreStub(channel)
                await stub.AppendSegment(append_request("r1", "t1", part=0))
                await asyncio.to_thread(redis_server.kill)
                second = append_request("r1", "t1", part=1)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.AppendSegment(second)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "unavailable" in (info.value.details() or "")
                await asyncio.to_thread(redis_server.start)
                req = capture_pb2.GetTrajectoryRequest(run_id="r1", trial_id="t1", include_tokens=True)
                assert (await stub.GetTrajectory(req)).segments[0].num_turns == 1  # the failed part is absent
                assert not (await stub.AppendSegment(second)).duplicate  # and goes in on retry
                assert (await stub.GetTrajectory(req)).segments[0].num_turns == 2
        finally:
            await running.stop()


def _serve(store_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HARNESSRL_CAPTURE_STORE_AUTH_TOKEN": SERVICE_TOKEN}
    cmd = [sys.executable, "-m", "stack.cli", "capture", "serve", "--port", str(port), "--store-dir", str(store_dir)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def test_embedded_server_killed_and_restarted_mid_run(tmp_path: Path) -> None:
    port = restartable_port()
    target = f"127.0.0.1:{port}"
    procs = [_serve(tmp_path / "store", port)]
    try:
        await check_health(target, wait_s=60)

        async def crash() -> None:
            procs[0].send_signal(signal.SIGKILL)  # no graceful stop: only what was fsynced survives
            await asyncio.to_thread(procs[0].wait)
            procs.append(_serve(tmp_path / "store", port))
            await check_health(target, wait_s=60)

        acked = await _run_with_fault(target, crash)
        await _check_exactly_once(target, acked)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def test_a_connection_lost_while_watching_is_transient_not_a_conflict() -> None:
    """redis-py turns a connection dropped under WATCH into a WatchError; a Redis restart
    then must be retried like any lost connection, not reported as an internal error."""
    import redis

    from services.capture_store.distributed import DistributedBackend

    backend = object.__new__(DistributedBackend)  # is_transient reads no state
    assert backend.is_transient(redis.WatchError("A ConnectionError occurred while watching one or more keys"))
    assert not backend.is_transient(redis.WatchError("Watched variable changed."))


async def test_a_store_started_before_s3_waits_for_it(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # docker-compose starts the store right after its dependencies' containers, not
    # their servers: a store that checked S3 once exited before S3 listened.
    s3 = S3Server(dir=tmp_path / "s3", ports={flag: restartable_port() for flag in S3_PORT_FLAGS})
    settings = _distributed_fields(redis_server, s3, "late-bucket") | {"s3_create_bucket": True, "startup_wait_s": 120}
    with caplog.at_level(logging.WARNING, "services.capture_store"):
        starting = asyncio.create_task(create_server(Settings.model_validate(settings)))
        await asyncio.sleep(3)
        assert not starting.done()
        await asyncio.to_thread(s3.start)
        try:
            running = await asyncio.wait_for(starting, 60)
            try:
                async with connect(f"127.0.0.1:{running.port}", SERVICE_TOKEN) as channel:
                    stub = capture_pb2_grpc.CaptureStoreStub(channel)
                    assert not (await stub.AppendSegment(append_request("r1", "t1", part=0))).duplicate
            finally:
                await running.stop()
        finally:
            s3.stop()
    assert any("is not reachable" in r.message and "waiting" in r.message for r in caplog.records)


async def test_a_store_whose_s3_never_answers_fails_after_its_wait(redis_server: RedisServer, tmp_path: Path) -> None:
    nowhere = S3Server(dir=tmp_path, ports={flag: restartable_port() for flag in S3_PORT_FLAGS})  # never started
    settings = _distributed_fields(redis_server, nowhere, "no-bucket") | {"startup_wait_s": 2}
    with pytest.raises(Unavailable, match="is not reachable"):
        await create_server(Settings.model_validate(settings))
