"""``harnessrl capture`` export, export-parquet, delete-run, sweep and run-token,
run as real subprocesses against real stores, with bad input."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from harnessrl import arrays
from harnessrl.config import load_section
from harnessrl.errors import HarnessError
from harnessrl.localservers import RedisServer, S3Server
from services.capture_store.auth import run_token
from services.capture_store.settings import Settings
from stack.cli.main import app
from tests.integration.test_capture.conftest import SERVICE_TOKEN, _StoreCtx, append_request, finalize_request


async def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs the real CLI in a subprocess, off the event loop (the store under test serves on it)."""
    return await asyncio.to_thread(_run, *args, env=env)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stack.cli", "capture", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


async def _populate(store) -> dict[str, list]:
    sent = {"t1": [append_request("r1", "t1", part=p, close=p == 2) for p in range(3)]}
    sent["t2"] = [append_request("r1", "t2", group="g2", routes=(2, 4))]
    for reqs in sent.values():
        for req in reqs:
            await store.append(req)
    await store.finalize(finalize_request("r1", "t1", reward=0.5, metadata={"seed": "7"}))
    await store.append(append_request("r2", "x"))
    return sent


@pytest.fixture
async def embedded(tmp_path: Path):
    settings = Settings(store_dir=tmp_path / "store", auth_token=SERVICE_TOKEN, shutdown_grace_s=0.5)
    async with _StoreCtx(settings) as store:
        sent = await _populate(store)
        yield store, sent, tmp_path / "store"


async def test_export_over_grpc_and_from_the_directory(embedded, tmp_path: Path) -> None:
    store, sent, store_dir = embedded
    out = tmp_path / "t1.jsonl"
    proc = await cli("export", "--trial", "t1", "--run", "r1", "--out", str(out), "--target", store.target,
               "--token", SERVICE_TOKEN)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["trial_id"], row["thread"], row["segment_index"], row["reward"]) == ("t1", "main", 0, 0.5)
    assert row["termination_reason"] == "completed" and row["num_turns"] == 3 and row["closed"]
    assert row["prompt_ids"] == list(range(10))
    want_ids = np.concatenate([arrays.unpack_i32(r.tokens.ids) for r in sent["t1"]])
    assert row["response_ids"] == want_ids.tolist()
    want_lp = np.concatenate([arrays.unpack_f32(r.tokens.logprobs) for r in sent["t1"]])
    np.testing.assert_array_equal(np.asarray(row["response_logprobs"], np.float32), want_lp)
    assert len(row["response_mask"]) == len(row["policy_versions"]) == len(want_ids)

    await store.server.stop()  # the directory is free: open it directly, the run is found by trial id
    out2 = tmp_path / "t2.jsonl"
    proc = await cli("export", "--trial", "t2", "--out", str(out2), "--store", str(store_dir), "--routes")
    assert proc.returncode == 0, proc.stderr
    (row,) = [json.loads(line) for line in out2.read_text().splitlines()]
    assert row["reward"] is None and row["termination_reason"] is None and not row["finalized"]
    assert np.asarray(row["routed_experts"]).shape == (40, 2, 4)


async def test_export_parquet(embedded, tmp_path: Path) -> None:
    store, _, store_dir = embedded
    await store.server.stop()
    out = tmp_path / "r1.parquet"
    proc = await cli("export-parquet", "--run", "r1", "--out", str(out), "--store", str(store_dir))
    assert proc.returncode == 0, proc.stderr
    rows = pq.read_table(out).to_pylist()
    assert [r["trial_id"] for r in rows] == ["t1", "t2"]
    t1, t2 = rows
    assert (t1["reward"], t1["termination_reason"], t1["num_turns"], t1["finalized"]) == (0.5, "completed", 3, True)
    assert t1["metadata"] == [("seed", "7")] and t1["completion_tokens"] == 48
    assert (t2["reward"], t2["termination_reason"], t2["finalized"]) == (None, None, False)


async def test_delete_run(embedded) -> None:
    store, _, store_dir = embedded
    base = ("--run", "r1", "--target", store.target, "--token", SERVICE_TOKEN)
    refused = await cli("delete-run", *base)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    busy = await cli("delete-run", "--run", "r1", "--yes", "--store", str(store_dir))
    assert busy.returncode == 2 and "in use" in busy.stderr  # the server holds the directory
    proc = await cli("delete-run", *base, "--yes")
    assert proc.returncode == 0, proc.stderr
    assert "2 trajectories" in proc.stdout
    assert (await store.list("r1")).trajectories == [] and len((await store.list("r2")).trajectories) == 1


async def test_sweep_deletes_runs_older_than(embedded) -> None:
    store, _, store_dir = embedded
    await store.server.stop()
    with sqlite3.connect(store_dir / "index.sqlite3") as db:  # age run r1 by 40 days
        db.execute("UPDATE runs SET updated_at = ? WHERE run = 'r1'", (time.time() - 40 * 86400,))
    dry = await cli("sweep", "--older-than", "30d", "--dry-run", "--store", str(store_dir))
    assert dry.returncode == 0, dry.stderr
    assert "would delete run r1 (2 trajectories)" in dry.stdout and "r2" not in dry.stdout
    proc = await cli("sweep", "--older-than", "30d", "--store", str(store_dir))
    assert proc.returncode == 0, proc.stderr
    assert "deleted run r1" in proc.stdout and "swept run" in proc.stderr  # logged
    again = await cli("sweep", "--older-than", "30d", "--store", str(store_dir))
    assert "deleted 0 run(s)" in again.stdout
    async with _StoreCtx(store.settings) as reopened:
        assert (await reopened.list("r1")).trajectories == []
        assert len((await reopened.list("r2")).trajectories) == 1


async def test_bad_input(embedded, tmp_path: Path) -> None:
    store, _, store_dir = embedded
    target = ("--target", store.target, "--token", SERVICE_TOKEN)
    out = str(tmp_path / "x.jsonl")
    cases = [
        (("export", "--trial", "nope", "--run", "r1", "--out", out, *target), "no trial 'nope'"),
        (("export", "--trial", "t1", "--out", out, *target), "--run is required"),
        (("export", "--trial", "t1", "--run", "r1", "--out", str(tmp_path / "no" / "x.jsonl"), *target), "not a dir"),
        (("export", "--trial", "t1", "--run", "r1", "--out", str(tmp_path), *target), "is a directory"),
        (("export", "--trial", "t1", "--run", "r1", "--out", out), "exactly one of"),
        (("export", "--trial", "t1", "--out", out, "--store", str(tmp_path / "missing")), "not a capture store"),
        (("export", "--trial", "t1", "--run", "r1", "--out", out, "--target", store.target), "UNAUTHENTICATED"),
        (("export-parquet", "--run", "bad run", "--out", out, *target), "run_id"),
        (("sweep", "--older-than", "ten days", "--store", str(store_dir)), "e.g. 30d"),
        (("sweep", "--older-than", "1d"), "--store DIR or --config FILE"),
        (("run-token", "--run", "r1"), "run_token_key is not set"),
    ]
    for args, message in cases:
        code, output = await asyncio.to_thread(_in_process, *args)
        assert code == 2, (args, output)
        assert message in output, (args, output)
    leftovers = await asyncio.to_thread(lambda: [p.name for p in tmp_path.iterdir() if "x.jsonl" in p.name])
    assert leftovers == []  # nothing half-written


def _in_process(*args: str) -> tuple[int, str]:
    """The CLI in this process (faster than a subprocess), with main()'s mapping of errors to exit 2."""
    result = CliRunner().invoke(app, ["capture", *args])
    if isinstance(result.exception, HarnessError):
        return 2, str(result.exception)
    return result.exit_code, result.output


async def test_run_token() -> None:
    proc = await cli("run-token", "--run", "r1", env={"HARNESSRL_CAPTURE_STORE_RUN_TOKEN_KEY": "k"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == run_token("k", "r1")


async def test_exports_from_a_distributed_store_by_config(
    redis_server: RedisServer, s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    config = tmp_path / "capture.toml"
    config.write_text(
        "[capture_store]\n"
        f'backend = "distributed"\nredis_url = "{redis_server.url}"\n'
        f's3_endpoint = "{s3_server.endpoint}"\ns3_bucket = "{s3_bucket}"\n'
    )
    keys = {"s3_access_key": s3_server.access_key, "s3_secret_key": s3_server.secret_key}
    env = {f"HARNESSRL_CAPTURE_STORE_{k.upper()}": v for k, v in keys.items()}
    settings = load_section(Settings, config, "capture_store", {**keys, "auth_token": SERVICE_TOKEN})
    async with _StoreCtx(settings) as store:
        await _populate(store)
    out = tmp_path / "r1.parquet"
    proc = await cli("export-parquet", "--run", "r1", "--out", str(out), "--config", str(config), env=env)
    assert proc.returncode == 0, proc.stderr
    assert [r["trial_id"] for r in pq.read_table(out).to_pylist()] == ["t1", "t2"]
    jsonl = tmp_path / "x.jsonl"
    proc = await cli("export", "--trial", "x", "--out", str(jsonl), "--config", str(config), env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(jsonl.read_text())["run_id"] == "r2"  # found by trial id
    no_keys = {"AWS_EC2_METADATA_DISABLED": "true"}  # no S3 keys, and no cloud metadata lookup either
    wrong = await cli("export-parquet", "--run", "r1", "--out", str(out), "--config", str(config), env=no_keys)
    assert wrong.returncode == 2 and "s3 credentials missing" in wrong.stderr
