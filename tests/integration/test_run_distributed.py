"""``harnessrl run`` in distributed mode: the capture store (Redis index + S3 blobs)
and the gateway run as separate servers the config names by address; the sandbox
queue is Redis (the run starts a sandbox server and a worker on it)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harnessrl import paths
from harnessrl.localservers import RedisServer, S3Server
from tests.run_support import make_pool, tiny_model, write_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared"),
]


@pytest.fixture
async def remote(tmp_path: Path, redis_server: RedisServer, s3_server: S3Server) -> AsyncIterator[dict[str, str]]:
    from services.capture_store.server import create_server as create_capture
    from services.capture_store.settings import Settings as CaptureSettings
    from services.gateway.server import create_server as create_gateway
    from services.gateway.settings import Settings as GatewaySettings

    model = tiny_model(tmp_path / "tiny")
    config = write_config(tmp_path, model, make_pool(tmp_path))  # writes script.json for the gateway
    s3_server.client().create_bucket(Bucket="runs")
    capture = await create_capture(
        CaptureSettings.model_validate(
            {
                "backend": "distributed",
                "redis_url": redis_server.url,
                "s3_endpoint": s3_server.endpoint,
                "s3_bucket": "runs",
                "s3_access_key": s3_server.access_key,
                "s3_secret_key": s3_server.secret_key,
            }
        )
    )
    gateway = await create_gateway(
        GatewaySettings.model_validate({"engine": f"scripted:{tmp_path / 'script.json'}", "model_path": model})
    )
    try:
        yield {
            "config": str(config),
            "capture": f"127.0.0.1:{capture.port}",
            "gateway": f"127.0.0.1:{gateway.port}",
            "redis": redis_server.url,
        }
    finally:
        await gateway.stop(0)
        await capture.stop(0)


def point_at(config: Path, remote: dict[str, str]) -> None:
    """The test config with the remote addresses and the Redis queue, one step."""
    text = config.read_text().replace("[capture_store]\nfsync = false\n", "")
    text = re.sub(r"(?m)^engine = .*\n", "", text)  # the gateway is not started here
    targets = f'capture_target = "{remote["capture"]}"\ngateway_target = "{remote["gateway"]}"\n'
    text = text.replace("[run]\n", "[run]\n" + targets)
    text = text.replace("[sandbox]\n", f'[sandbox]\nqueue_url = "{remote["redis"]}"\n')
    config.write_text(text.replace("steps = 2", "steps = 1"))


async def test_run_against_separately_deployed_services(tmp_path: Path, remote: dict[str, str]) -> None:
    config = Path(remote["config"])
    point_at(config, remote)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "stack.cli", "run", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, out.decode()
    run_dir = tmp_path / "runs" / "e2e"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "done" and info["capture"] == {"backend": "distributed", "target": remote["capture"]}
    assert not (run_dir / "capture").exists()  # nothing embedded: the trajectories are in Redis + S3
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1] and steps[0]["values"]["reward/mean"] == 0.5
