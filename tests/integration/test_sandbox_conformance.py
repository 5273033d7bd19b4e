"""The Sandbox contract's conformance checks (services/sandbox/conformance.py) pass
against both implementations: this project's sandbox service (in-process queue and
worker, bubblewrap backend) and the second one (services/sandbox_remote: a front
that delegates every trial to an executor process over HTTP). And the checker
refuses, with a clear error, an address where nothing listens, a gRPC server that
is no sandbox, a server that is not gRPC, and a sandbox that wants a token."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from harnessrl.errors import InvalidArgument
from harnessrl.localservers import free_port
from services.sandbox.conformance import CHECKS, TargetError, run_conformance
from services.sandbox.server import create_sandbox_server
from stack.cli.main import app
from tests.sandbox_remote_support import ROOT, executor, remote_front
from tests.sandbox_support import settings_for

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture
async def project_sandbox(tmp_path: Path) -> AsyncIterator[str]:
    server = await create_sandbox_server(settings_for(tmp_path, heartbeat_s=0.2, concurrency=8))
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(0)


# Any other address: HARNESSRL_CONFORMANCE_TARGET=HOST:PORT (with _TOKEN and _TASKS, the
# conformance tasks' folder as its workers see it) adds it to the implementations checked.
EXTERNAL = os.environ.get("HARNESSRL_CONFORMANCE_TARGET")


@pytest.fixture(params=["project", "remote", *(["external"] if EXTERNAL else [])])
async def implementation(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """The address of each implementation in turn (keyword arguments of run_conformance)."""
    if request.param == "external":
        tasks = os.environ.get("HARNESSRL_CONFORMANCE_TASKS")
        yield {"target": EXTERNAL, "token": os.environ.get("HARNESSRL_CONFORMANCE_TOKEN"), "tasks_dir": tasks}
    elif request.param == "project":
        server = await create_sandbox_server(settings_for(tmp_path, heartbeat_s=0.2, concurrency=8))
        try:
            yield {"target": f"127.0.0.1:{server.port}"}
        finally:
            await server.stop(0)
    else:
        with executor(tmp_path / "executor", concurrency=8) as proc:
            async with remote_front(proc.url) as front:
                yield {"target": f"127.0.0.1:{front.port}"}


def report(results: list) -> str:  # type: ignore[type-arg]
    return "\n".join(f"{'PASS' if r.ok else 'FAIL'} {r.name} ({r.seconds:.1f}s): {r.detail}" for r in results)


@needs_bwrap
async def test_every_conformance_check_passes(implementation: dict[str, Any]) -> None:
    results = await run_conformance(**implementation, timeout_s=90)
    assert [r.name for r in results] == ["health", *CHECKS]
    assert all(r.ok for r in results), report(results)


async def test_nothing_listening_is_a_clear_error() -> None:
    target = f"127.0.0.1:{free_port()}"
    with pytest.raises(TargetError, match=rf"no gRPC server answers at {target}"):
        await run_conformance(target, connect_timeout_s=1)


async def test_a_malformed_address_or_check_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"--target.*host:port"):
        await run_conformance("no-port-here")
    with pytest.raises(InvalidArgument, match=r"unknown check.*valid"):
        await run_conformance("127.0.0.1:1", only=["no_such_check"])


async def test_a_grpc_server_that_is_no_sandbox_is_named(tmp_path: Path) -> None:
    from services.capture_store.server import create_server
    from services.capture_store.settings import Settings as CaptureSettings

    capture = await create_server(CaptureSettings.model_validate({"store_dir": tmp_path / "c", "fsync": False}))
    try:
        with pytest.raises(TargetError, match=r"does not serve harnessrl.v1.Sandbox"):
            await run_conformance(f"127.0.0.1:{capture.port}")
    finally:
        await capture.stop(0)


async def test_a_server_that_is_not_grpc_is_a_clear_error(tmp_path: Path) -> None:
    with executor(tmp_path / "executor") as proc:  # an HTTP server
        with pytest.raises(TargetError, match=rf"127.0.0.1:{proc.port}"):
            await run_conformance(f"127.0.0.1:{proc.port}", connect_timeout_s=1)


async def test_a_sandbox_that_wants_a_token(tmp_path: Path) -> None:
    server = await create_sandbox_server(settings_for(tmp_path, auth_token="s3cret"))
    target = f"127.0.0.1:{server.port}"
    try:
        with pytest.raises(TargetError, match=r"refused the token.*--token"):
            await run_conformance(target, only=["unknown_and_empty_ids"])
        results = await run_conformance(target, "s3cret", only=["unknown_and_empty_ids"])
        assert all(r.ok for r in results), report(results)
    finally:
        await server.stop(0)


def conformance_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "stack.cli", "sandbox", "conformance", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


async def test_the_cli_passes_a_sandbox(project_sandbox: str) -> None:
    ok = await asyncio.to_thread(conformance_cli, "--target", project_sandbox, "--check", "unknown_and_empty_ids")
    assert ok.returncode == 0 and "PASS  unknown_and_empty_ids" in ok.stdout, ok.stdout + ok.stderr
    assert "2/2 checks passed" in ok.stderr


def test_the_cli_refuses_clearly(tmp_path: Path) -> None:
    def cli(*args: str) -> Result:
        return CliRunner().invoke(app, ["sandbox", "conformance", *args])

    down = cli("--target", f"127.0.0.1:{free_port()}", "--connect-timeout", "1")
    assert down.exit_code == 2 and "no gRPC server answers" in down.output, down.output
    bad = cli("--target", "127.0.0.1:1", "--check", "nope")
    assert bad.exit_code == 2 and "unknown check(s) ['nope']" in bad.output, bad.output
    malformed = cli("--target", "no-port")
    assert malformed.exit_code == 2 and "--target" in malformed.output and "host:port" in malformed.output
    missing = cli()
    assert missing.exit_code == 2 and "--target HOST:PORT is required" in missing.output, missing.output
    written = cli("--write-tasks", str(tmp_path / "t"))
    assert written.exit_code == 0 and (tmp_path / "t" / "hello" / "task.toml").is_file(), written.output
