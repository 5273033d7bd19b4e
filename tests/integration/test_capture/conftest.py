"""Fixtures of the capture store suite: the same behavioural tests run against
the embedded backend (SQLite + pack files) and the distributed one (real
Redis + real SeaweedFS S3), each served over real gRPC on a free port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from botocore.config import Config

from harnessrl import arrays
from harnessrl.localservers import RedisServer, S3Server
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.capture_store.auth import run_metadata
from services.capture_store.server import CaptureServer, create_server
from services.capture_store.settings import Settings

SERVICE_TOKEN = "capture-test-token"


def tokens(seed: int, n: int = 40, sampled: int = 16, version: int = 0, routes: tuple[int, int] | None = None):
    """Deterministic part arrays: ``n - sampled`` context tokens (mask 0), then sampled ones."""
    rng = np.random.default_rng(seed)
    mask = np.r_[np.zeros(n - sampled), np.ones(sampled)].astype(np.uint8)
    logprobs = np.where(mask == 1, -rng.exponential(0.5, n), 0.0).astype(np.float32)
    versions = np.where(mask == 1, version, -1)
    experts = None
    if routes is not None:
        experts = rng.integers(0, 64, size=(n, *routes), dtype=np.uint8)
        experts[mask == 0] = 0
    return arrays.make_tokens(rng.integers(0, 50_000, n), mask, logprobs, versions, experts)


def append_request(
    run: str,
    trial: str,
    *,
    thread: str = "main",
    segment: int = 0,
    part: int = 0,
    seed: int | None = None,
    close: bool = False,
    task: str = "task-a",
    group: str = "group-a",
    kind: str = "main",
    **token_kw: Any,
) -> capture_pb2.AppendSegmentRequest:
    seed = hash((run, trial, thread, segment, part)) % 2**32 if seed is None else seed
    arrays_ = tokens(seed, **token_kw)
    n_sampled = int(np.frombuffer(arrays_.mask, np.uint8).sum())
    req = capture_pb2.AppendSegmentRequest(
        key=records_pb2.SegmentKey(run_id=run, trial_id=trial, thread=thread, segment_index=segment),
        part_index=part,
        thread_kind=kind,
        trainable=kind != "side",
        tokens=arrays_,
        finish_reason="tool_calls" if not close else "stop",
        usage=records_pb2.Usage(prompt_tokens=100, completion_tokens=n_sampled),
        model="smollm2",
        chat_template_sha256="ab" * 32,
        close=close,
    )
    if part == 0:
        req.prompt_ids = arrays.pack_i32(np.arange(10 + segment, dtype=np.int32))
        req.task_id, req.group_id = task, group
    return req


def finalize_request(run: str, trial: str, *, group: str = "group-a", size: int = 1, **kw: Any):
    fields = {
        "task_id": "task-a",
        "step": 3,
        "harness": "mini-swe-agent",
        "reward": 1.0,
        "has_reward": True,
        "termination_reason": records_pb2.TERMINATION_REASON_COMPLETED,
        **kw,
    }
    return capture_pb2.FinalizeTrajectoryRequest(run_id=run, trial_id=trial, group_id=group, group_size=size, **fields)


class Store:
    """A served capture store and a client stub carrying the service token."""

    def __init__(self, server: CaptureServer, settings: Settings, stub: capture_pb2_grpc.CaptureStoreStub) -> None:
        self.server = server
        self.settings = settings
        self.stub = stub
        self.target = f"127.0.0.1:{server.port}"

    def md(self, run: str) -> tuple[tuple[str, str], ...]:
        key = self.settings.run_token_key
        return run_metadata(key.get_secret_value() if key else None, run)

    async def append(self, req: capture_pb2.AppendSegmentRequest) -> capture_pb2.AppendSegmentResponse:
        return await self.stub.AppendSegment(req, metadata=self.md(req.key.run_id))

    async def finalize(self, req: capture_pb2.FinalizeTrajectoryRequest) -> capture_pb2.FinalizeTrajectoryResponse:
        return await self.stub.FinalizeTrajectory(req, metadata=self.md(req.run_id))

    async def get(self, run: str, trial: str, include_tokens: bool = True) -> records_pb2.Trajectory:
        req = capture_pb2.GetTrajectoryRequest(run_id=run, trial_id=trial, include_tokens=include_tokens)
        return await self.stub.GetTrajectory(req, metadata=self.md(run))

    async def list(self, run: str, **kw: Any) -> capture_pb2.ListTrajectoriesResponse:
        req = capture_pb2.ListTrajectoriesRequest(run_id=run, **kw)
        return await self.stub.ListTrajectories(req, metadata=self.md(run))

    async def delete(self, run: str) -> int:
        resp = await self.stub.DeleteRun(capture_pb2.DeleteRunRequest(run_id=run), metadata=self.md(run))
        return int(resp.trajectories_deleted)


def backend_settings(kind: str, tmp_path: Path, request: pytest.FixtureRequest, **overrides: Any) -> Settings:
    base: dict[str, Any] = {"auth_token": SERVICE_TOKEN, "shutdown_grace_s": 0.5, "retry": {"total_s": 5}}
    if kind == "embedded":
        base["store_dir"] = tmp_path / "store"
    else:
        redis: RedisServer = request.getfixturevalue("redis_server")
        s3: S3Server = request.getfixturevalue("s3_server")
        base |= {
            "backend": "distributed",
            "redis_url": redis.url,
            "s3_endpoint": s3.endpoint,
            "s3_bucket": request.getfixturevalue("s3_bucket"),
            "s3_access_key": s3.access_key,
            "s3_secret_key": s3.secret_key,
        }
    return Settings(**(base | overrides))


async def blob_objects(store: Store, run: str) -> int:
    """How many blob objects (pack files or S3 objects) a run has in its backend."""
    st = store.settings
    if st.backend == "embedded":
        return len(list((st.resolved_blob_dir() / run).glob("*")))
    client = boto3.client(
        "s3",
        endpoint_url=st.s3_endpoint,
        aws_access_key_id=st.s3_access_key.get_secret_value() if st.s3_access_key else None,
        aws_secret_access_key=st.s3_secret_key.get_secret_value() if st.s3_secret_key else None,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    resp = await asyncio.to_thread(client.list_objects_v2, Bucket=st.s3_bucket, Prefix=f"{st.s3_prefix}/runs/{run}/")
    return int(resp.get("KeyCount", 0))


@pytest.fixture(params=["embedded", "distributed"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(backend_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``await make_store(**settings overrides)`` starts a store; all are stopped at teardown."""
    return lambda **overrides: _StoreCtx(backend_settings(backend_kind, tmp_path, request, **overrides))


class _StoreCtx:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def __aenter__(self) -> Store:
        self.server = await create_server(self.settings)
        self.channel = connect(f"127.0.0.1:{self.server.port}", SERVICE_TOKEN)
        return Store(self.server, self.settings, capture_pb2_grpc.CaptureStoreStub(self.channel))

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop()


@pytest.fixture
async def store(make_store: Callable[..., Any]) -> AsyncIterator[Store]:
    async with make_store() as s:
        yield s
