"""Every count a trajectory record carries agrees with its captured segments, on a
real run: ``harnessrl run`` on the embedded stack (scripted engine, tiny model,
bubblewrap sandbox, the real trainer), with an agent whose stop string cuts the
model's last reply short of what the engine sampled (as mini-swe-agent's compact
config does), which is where the engine's own counts and the capture part ways."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harnessrl import paths
from harnessrl.v1 import records_pb2
from services.capture_store.client import LocalClient
from services.capture_store.settings import Settings as CaptureSettings
from services.dashboard import trajectories
from services.dashboard.service import DashboardService
from services.dashboard.settings import Settings as DashboardSettings
from services.proxy.chat.tokenizer import Tokenizer
from stack.dashboard import EmbeddedCaptureOpener
from tests.run_support import AGENT, SCRIPT, make_pool, tiny_model, write_config

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")
# The scripted policy's last reply is "Done. Bye."; the stop string ends it at "Done." (the
# tokens the harness was given are kept; those of " Bye." were sampled past the stop).
STOPPING_AGENT = AGENT.replace('"tools": tools}', '"tools": tools, "stop": [" Bye"]}')
CUT_SCRIPT = {
    **SCRIPT,
    "threads": {**SCRIPT["threads"], "main": [*SCRIPT["threads"]["main"][:-1], {"content": "Done. Bye."}]},
}


def sampled_runs(seg: records_pb2.Segment) -> list[tuple[int, int]]:
    mask = np.frombuffer(seg.response.mask, np.uint8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]]).astype(np.int8)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def check_counts(listed: records_pb2.Trajectory, full: records_pb2.Trajectory) -> None:
    """The listing (no tokens) against the tokens, segment by segment."""
    assert [s.key.segment_index for s in listed.segments] == [s.key.segment_index for s in full.segments]
    for meta, seg in zip(listed.segments, full.segments, strict=True):
        where = f"{full.trial_id} {seg.key.thread}#{seg.key.segment_index}"
        runs = sampled_runs(seg)
        n_prompt = len(seg.prompt_ids) // 4
        mask_sum = int(np.frombuffer(seg.response.mask, np.uint8).sum())
        assert meta.usage.completion_tokens == mask_sum, where
        assert meta.num_turns == len(runs), where
        # The engine saw the prompt and everything before each sampled run.
        assert meta.usage.prompt_tokens == sum(n_prompt + start for start, _ in runs), where
        assert meta.usage.cached_prompt_tokens <= meta.usage.prompt_tokens, where
    row = trajectories.row(listed)
    sampled = sum(int(np.frombuffer(s.response.mask, np.uint8).sum()) for s in full.segments)
    assert row["completion_tokens"] == sampled, full.trial_id
    assert row["turns"] == sum(len(sampled_runs(s)) for s in full.segments), full.trial_id


async def read_run(store: Path, run: str) -> list[tuple[records_pb2.Trajectory, records_pb2.Trajectory]]:
    settings = CaptureSettings.model_validate({"backend": "embedded", "store_dir": store})
    client = LocalClient(settings, writer=False)
    try:
        listed = [t async for t in client.list_all(run)]
        return [(t, await client.get(run, t.trial_id, True)) for t in listed]
    finally:
        await client.close()


async def dashboard_summary(runs_dir: Path, run: str) -> dict[str, object]:
    service = DashboardService(DashboardSettings.model_validate({"runs_dir": runs_dir}), EmbeddedCaptureOpener())
    try:
        return await service.summary(run)
    finally:
        await service.close()


def test_every_trajectory_record_agrees_with_its_segments(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "model")
    config = write_config(tmp_path, model, make_pool(tmp_path), run={"steps": 2})
    (tmp_path / "agent.sh").write_text(STOPPING_AGENT)
    # One token per chunk: the stop string ends a reply before the engine's last chunk (and its usage).
    (tmp_path / "script.json").write_text(json.dumps({**CUT_SCRIPT, "chunk_tokens": 1}))
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "run", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / "e2e"
    pairs = asyncio.run(read_run(run_dir / "capture", "e2e"))
    assert len(pairs) >= 8 and all(full.segments for _, full in pairs)
    stop_ids = set(Tokenizer(model).stop_ids)
    cut = 0
    for listed, full in pairs:
        check_counts(listed, full)
        for seg in full.segments:
            ids = np.frombuffer(seg.response.ids, np.int32)
            cut += sum(int(ids[end - 1]) not in stop_ids for _, end in sampled_runs(seg))
    assert cut > 0, "no reply was cut by the stop string: the test lost its point"
    summary = asyncio.run(dashboard_summary(tmp_path / "runs", "e2e"))
    rows_tokens = sum(trajectories.row(listed)["completion_tokens"] for listed, _ in pairs)
    assert rows_tokens > 0
    throughput = summary["rollout_tokens_per_s"]
    assert isinstance(throughput, dict) and throughput and all(v > 0 for v in throughput.values()), throughput
