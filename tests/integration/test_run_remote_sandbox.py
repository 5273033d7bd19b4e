"""Swapping the sandbox service: ``harnessrl run`` trains a step through the second
Sandbox implementation (services/sandbox_remote: a front delegating every trial over
HTTP to an executor process) with no code change, only ``[run] sandbox_target``.
The capture store, the gateway (scripted engine) and the proxy run as separate
servers, as they would beside a managed sandbox; preflight's no-op and task checks
go through the remote front too."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harnessrl import paths
from tests.run_support import make_pool, tiny_model, write_config
from tests.sandbox_remote_support import executor, remote_front

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared"),
]


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[dict[str, object]]:
    from services.capture_store.server import create_server as create_capture
    from services.capture_store.settings import Settings as CaptureSettings
    from services.gateway.server import create_server as create_gateway
    from services.gateway.settings import Settings as GatewaySettings
    from services.proxy.server import start as start_proxy
    from services.proxy.settings import Settings as ProxySettings

    model = tiny_model(tmp_path / "tiny")
    config = write_config(tmp_path, model, make_pool(tmp_path))  # writes script.json for the gateway
    capture = await create_capture(CaptureSettings.model_validate({"store_dir": tmp_path / "capture", "fsync": False}))
    gateway = await create_gateway(
        GatewaySettings.model_validate({"engine": f"scripted:{tmp_path / 'script.json'}", "model_path": model})
    )
    uds = tmp_path / "proxy.sock"
    proxy = await start_proxy(
        ProxySettings.model_validate(
            {
                "gateway_target": f"127.0.0.1:{gateway.port}",
                "capture_target": f"127.0.0.1:{capture.port}",
                "admin_token": "admin-secret",
                "uds_path": uds,
                "model_dir": model,
            }
        )
    )
    worker = {
        "proxy_url": proxy.url,
        "proxy_admin_token": "admin-secret",
        "proxy_uds_path": uds,
        "capture_target": f"127.0.0.1:{capture.port}",
        "concurrency": 4,
    }
    try:
        with executor(tmp_path / "executor", **worker) as proc:
            async with remote_front(proc.url, capture_target=f"127.0.0.1:{capture.port}") as front:
                yield {
                    "config": config,
                    "capture": f"127.0.0.1:{capture.port}",
                    "gateway": f"127.0.0.1:{gateway.port}",
                    "sandbox": f"127.0.0.1:{front.port}",
                    "front": front,
                    "executor_dir": tmp_path / "executor",
                }
    finally:
        await proxy.stop()
        await gateway.stop(0)
        await capture.stop(0)


def point_at(config: Path, ends: dict[str, object]) -> None:
    """The test config with the three remote addresses, one step."""
    text = config.read_text().replace("[capture_store]\nfsync = false\n", "")
    text = re.sub(r"(?m)^engine = .*\n", "", text)  # the gateway is not started by the run
    targets = "".join(f'{k}_target = "{ends[k]}"\n' for k in ("capture", "gateway", "sandbox"))
    config.write_text(text.replace("[run]\n", "[run]\n" + targets).replace("steps = 2", "steps = 1"))


async def test_a_run_trains_through_the_remote_sandbox(tmp_path: Path, stack: dict[str, object]) -> None:
    config = stack["config"]
    assert isinstance(config, Path)
    point_at(config, stack)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "stack.cli", "run", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, out.decode()[-6000:]
    run_dir = tmp_path / "runs" / "e2e"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1] and steps[0]["values"]["reward/mean"] == 0.5
    # Every trial of the step went through the front and ran on the executor.
    front = stack["front"]
    trials = [t for t in front.service.trials.values() if t.spec.run_id == "e2e"]  # type: ignore[attr-defined]
    assert len(trials) == 4 and all(t.status.state == 6 for t in trials)
    results = list((Path(str(stack["executor_dir"])) / "artifacts" / "e2e").glob("*/result.json"))
    assert len(results) == 4, results
