"""Helpers of the sandbox tests: write Harbor tasks into a temporary directory
and settings whose trial dirs, layer cache and artifacts live under it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.sandbox.backends.base import Limits, SandboxSpec
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import IntegrityPolicy, LocalBackendSettings, Settings
from services.sandbox.queue.base import TrialQueue
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TrialRecord, TrialState

DEFAULT_TOML = """\
schema_version = "1.4"

[task]
name = "test/{name}"

[agent]
timeout_sec = 30

[verifier]
timeout_sec = 30

[environment]
memory_mb = 512
storage_mb = 64
"""

PASS_IF_HELLO = """\
#!/bin/bash
if [ "$(cat /app/hello.txt 2>/dev/null)" = "hello" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def make_task(
    root: Path,
    name: str = "t",
    *,
    toml: str | None = None,
    instruction: str = "Write hello to hello.txt.",
    dockerfile: str = "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY README.md /app/README.md\n",
    context: dict[str, str] | None = None,
    test_sh: str = PASS_IF_HELLO,
    tests: dict[str, str] | None = None,
    solve_sh: str | None = "#!/bin/bash\necho hello > hello.txt\n",
) -> Path:
    """A task directory; ``context`` files go into environment/, ``tests`` into tests/."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text((toml if toml is not None else DEFAULT_TOML).format(name=name))
    (task / "instruction.md").write_text(instruction)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    for rel, text in {"README.md": "# repo\n", **(context or {})}.items():
        path = task / "environment" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (task / "tests" / "test.sh").write_text(test_sh)
    for rel, text in (tests or {}).items():
        (task / "tests" / rel).write_text(text)
    if solve_sh is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solve_sh)
    return task


def settings_for(tmp: Path, integrity: IntegrityPolicy | None = None, **overrides: Any) -> Settings:
    fields: dict[str, Any] = {
        "work_dir": tmp / "trials",
        "cache_dir": tmp / "cache",
        "artifacts_dir": tmp / "artifacts",
        "default_agent_timeout_s": 30,
        "default_verifier_timeout_s": 30,
        **overrides,
    }
    if integrity is not None:
        fields["integrity"] = integrity
    # These tasks' verifiers need no network: verify them without one, as every docker test
    # says for its bridgeless engine. The default ('auto') refuses a public verifier on local.
    fields.setdefault("local", LocalBackendSettings(verify_network="none"))
    return Settings(**fields)


async def wait_for_state(queue: TrialQueue, trial_id: str, state: TrialState, timeout_s: float = 120) -> TrialRecord:
    """Follows the queue's watch stream until the trial reaches ``state`` (or DONE)."""

    async def follow() -> TrialRecord:
        async for record in queue.watch("", [trial_id]):
            if record.state == state or record.state == TrialState.DONE:
                return record
        raise AssertionError("watch ended")

    return await asyncio.wait_for(follow(), timeout_s)


@dataclass
class ModelStack:
    """Real capture store (embedded), gateway (scripted engine) and proxy (TCP + Unix socket)."""

    capture: Any
    gateway: Any
    proxy: Any
    admin_token: str
    uds: Path
    engine_log: Path

    def sandbox_settings(self, tmp: Path, **overrides: Any) -> Settings:
        return settings_for(
            tmp,
            proxy_url=self.proxy.url,
            proxy_admin_token=self.admin_token,
            proxy_uds_path=self.uds,
            capture_target=f"127.0.0.1:{self.capture.port}",
            **overrides,
        )


@dataclass
class HarnessTrial:
    """One real harness's trial through a ``ModelStack``: what ran and what it left."""

    runner: Any
    spec: Any
    outcome: Any
    log: str  # the end of the harness's agent.log


async def run_harness_trial(
    stack: ModelStack, tmp: Path, task: Path, harness: str, run_id: str, model: str, **settings: Any
) -> HarnessTrial:
    """Runs ``harness`` on ``task`` through the stack's proxy, gateway and capture store
    (``settings``: the sandbox's, e.g. the backend); the trial's id starts with the run's."""
    from services.sandbox.factory import create_backend
    from services.sandbox.trial.endpoints import CaptureFinalizer, ProxyAdmin
    from services.sandbox.trial.lifecycle import TrialSpec
    from services.sandbox.trial.runner import TrialRunner

    sandbox = stack.sandbox_settings(tmp, default_agent_timeout_s=240, **settings)
    runner = TrialRunner(
        sandbox,
        create_backend(sandbox),
        proxy=ProxyAdmin(stack.proxy.url, stack.admin_token),
        capture=CaptureFinalizer(sandbox.capture_target or "", None),
    )
    trial_id = f"{harness}-{uuid.uuid4().hex[:8]}"
    spec = TrialSpec(
        trial_id=trial_id,
        run_id=run_id,
        task_path=str(task),
        group_id=trial_id,
        group_size=1,
        harness=harness,
        model=model,
        max_turns=20,
    )
    outcome = await runner.run(spec)
    log_file = Path(outcome.artifacts_dir) / "agent.log"
    log = log_file.read_text(errors="replace")[-3000:] if log_file.exists() else ""
    return HarnessTrial(runner, spec, outcome, log)


def write_script(tmp: Path, data: dict[str, Any]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "script.json"
    path.write_text(json.dumps(data))
    return path


@contextlib.asynccontextmanager
async def model_stack(tmp: Path, threads: dict[str, list[dict[str, Any]]], **script: Any) -> AsyncIterator[ModelStack]:
    from services.capture_store.server import create_server as create_capture
    from services.capture_store.settings import Settings as CaptureSettings
    from services.gateway.server import create_server as create_gateway
    from services.gateway.settings import Settings as GatewaySettings
    from services.proxy.server import start as start_proxy
    from services.proxy.settings import Settings as ProxySettings

    script_path = write_script(tmp, {"context_window": 200_000, "threads": threads, **script})
    log = tmp / "engine.jsonl"
    capture = await create_capture(CaptureSettings.model_validate({"store_dir": tmp / "capture", "fsync": False}))
    gateway = await create_gateway(
        GatewaySettings.model_validate({"engine": f"scripted:{script_path}", "scripted_log_path": log})
    )
    uds = tmp / "proxy.sock"
    proxy = await start_proxy(
        ProxySettings.model_validate(
            {
                "gateway_target": f"127.0.0.1:{gateway.port}",
                "capture_target": f"127.0.0.1:{capture.port}",
                "admin_token": "admin-secret",
                "uds_path": uds,
            }
        )
    )
    try:
        yield ModelStack(capture, gateway, proxy, "admin-secret", uds, log)
    finally:
        await proxy.stop()
        await gateway.stop(0)
        await capture.stop(0)


def sandbox_spec(tmp_path: Path, toml: str | None = None, **kw: object) -> SandboxSpec:
    """A SandboxSpec of a fresh task under ``tmp_path`` (the spec tests' common fixture)."""
    task = load_task(make_task(tmp_path / "tasks", toml=toml))
    return SandboxSpec(
        trial_id="Trial_42.x",
        task=task,
        dirs=TrialDirs(tmp_path / "trial"),
        limits=Limits(memory_mb=1024, storage_mb=512, pids=128, cpus=1.5),
        **kw,  # type: ignore[arg-type]
    )
