"""``harnessrl gateway serve --engine scripted:FILE`` as a real process: serves
Generate over gRPC, stops on SIGTERM; bad engine strings and scripts fail
before anything listens, with one clear line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.arrays import pack_i32, unpack_i32
from harnessrl.localservers import free_port
from harnessrl.rpc import check_health, connect
from harnessrl.v1 import gateway_pb2 as pb
from harnessrl.v1 import gateway_pb2_grpc
from tests.cli_support import run_cli

SCRIPT = {"context_window": 1000, "threads": {"main": [{"content": "Hello."}]}}


def serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stack.cli", "gateway", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )


async def generate_once(port: int) -> list[int]:
    await check_health(f"127.0.0.1:{port}", "harnessrl.v1.RolloutGateway", wait_s=60)
    async with connect(f"127.0.0.1:{port}") as channel:
        stub = gateway_pb2_grpc.RolloutGatewayStub(channel)
        request = pb.GenerateRequest(request_id="cli", trial_id="t", thread="main", prompt_ids=pack_i32([1, 2]))
        chunks = [c async for c in stub.Generate(request)]
    return [int(i) for c in chunks for i in unpack_i32(c.tokens.ids)]


def test_serve_scripted_engine_from_the_cli(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({**SCRIPT, "log_path": "gen.jsonl"}))
    port = free_port()
    proc = serve("--engine", f"scripted:{script}", "--port", str(port))
    try:
        ids = asyncio.run(generate_once(port))
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, proc.stdout.read() if proc.stdout else ""
    assert ids[-1] == 2 and len(ids) > 1
    record = json.loads((tmp_path / "gen.jsonl").read_text())
    assert record["sampled_ids"] == ids and record["prompt_ids"] == [1, 2]


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ("nope", "unknown engine 'nope'; valid: 'local', 'vllm', 'scripted:PATH'"),
        ("scripted:", "unknown engine 'scripted:'"),
        ("no.such.module:Engine", "cannot import module 'no.such.module'"),
        ("json:JSONDecoder", "json.JSONDecoder is not an Engine class"),
        ("scripted:/no/such/script.json", "/no/such/script.json: script file not found"),
    ],
)
def test_bad_engine_fails_fast_with_one_clear_line(engine: str, message: str) -> None:
    port = free_port()
    proc = run_cli("gateway", "serve", "--engine", engine, "--port", str(port))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_malformed_script_names_file_and_field(tmp_path: Path) -> None:
    script = tmp_path / "bad.json"
    script.write_text(json.dumps({"threads": {"main": [{"content": 1}]}}))
    proc = run_cli("gateway", "serve", "--engine", f"scripted:{script}", "--port", "0")
    assert proc.returncode == 2
    assert str(script) in proc.stderr and "threads.main.0.content" in proc.stderr
