"""``harnessrl train agreement``: a captured run in the real capture store, read over
gRPC, against real weights."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from harnessrl import paths
from harnessrl.localservers import free_port
from harnessrl.v1 import records_pb2
from services.trainer.cpu_trainer import load_model
from tests.trainer_support import capture_store, segment, served, store_trajectory, trajectory

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")


@torch.no_grad()
def sample(
    model: torch.nn.Module, prompt: Sequence[int], n: int, generator: torch.Generator, temperature: float = 1.0
) -> tuple[list[int], list[float]]:
    """Samples ``n`` tokens from ``model`` after ``prompt``; returns ids and their logprobs
    under the sampling distribution (what an engine records)."""
    ids = list(prompt)
    out_ids, out_lps = [], []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float() / temperature
        logp = torch.log_softmax(logits, -1)
        tok = int(torch.multinomial(logp.exp(), 1, generator=generator))
        out_ids.append(tok)
        out_lps.append(float(logp[tok]))
        ids.append(tok)
    return out_ids, out_lps


async def captured_run(target: str, perturb: float = 0.0, temperature: float = 1.0) -> None:
    """Two trajectories sampled by the real model, one with two segments; ``perturb`` shifts recorded logprobs."""
    model = load_model(paths.default_model_dir(), gradient_checkpointing=False).eval()
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(2):
        segs = []
        for k in range(1 + i):
            prompt = [1, 9690, 198, 19556, 28, 2 + k, 198]
            ids, lps = sample(model, prompt, 5, gen, temperature)
            lps = [lp - perturb * (j % 5 == 0) for j, lp in enumerate(lps)]
            segs.append(segment(prompt, ids, [1] * 5, lps, [3] * 5, index=k))
        trajs.append(trajectory(f"t{i}", "g0", float(i), segs, run_id="r1", group_size=2))
    for traj in trajs:
        await store_trajectory(target, traj)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stack.cli", "train", "agreement", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )


async def test_agreement_command_reports_near_perfect_agreement_for_same_weights(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    async with capture_store(tmp_path / "store") as target:
        await captured_run(target)
        reads = served("capture_store", "GetTrajectory")
        proc = await asyncio.to_thread(
            run_cli, "--run", "r1", "--model", str(paths.default_model_dir()), "--out", str(out), "--capture", target
        )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    overall = report["overall"]
    assert overall["agreement/tokens"] == 15  # 3 segments x 5 sampled tokens
    assert overall["agreement/pearson"] > 0.9999
    assert overall["agreement/max_abs_diff"] < 1e-3
    assert overall["agreement/ess"] > 0.999
    assert set(report["by_policy_version"]) == {"3"}
    assert report["alerts"] == []
    assert served("capture_store", "GetTrajectory") - reads == 2
    assert "pearson" in proc.stdout


async def test_a_tempered_run_agrees_only_at_its_own_temperature(tmp_path: Path) -> None:
    """Tokens sampled at T = 0.6 carry the tempered distribution's logprobs: the
    trainer matches them when it divides its logits by the same T, not at T = 1."""
    from services.trainer import offline

    async with capture_store(tmp_path / "store") as target:
        await captured_run(target, temperature=0.6)
        same = await offline.run(target, "r1", paths.default_model_dir(), tmp_path / "a.json", temperature=0.6)
        plain = await offline.run(target, "r1", paths.default_model_dir(), tmp_path / "b.json")
    assert same["overall"]["agreement/max_abs_diff"] < 1e-3 and same["alerts"] == []
    assert plain["overall"]["agreement/max_abs_diff"] > 0.05


async def test_segments_sampled_at_different_temperatures_each_agree_at_their_own(tmp_path: Path) -> None:
    """A harness that changed its temperature between calls (honour): each segment
    records its own, and the trainer divides each row by it; with the records
    dropped, one run-wide temperature cannot match both."""
    from services.trainer import offline
    from tests.trainer_support import segment as make_segment

    model = load_model(paths.default_model_dir(), gradient_checkpointing=False).eval()
    gen = torch.Generator().manual_seed(1)

    def run(recorded: bool) -> records_pb2.Trajectory:
        segs = []
        for k, t in enumerate((0.5, 1.4)):
            prompt = [1, 9690, 198, 19556, 28, 2 + k, 198]
            ids, lps = sample(model, prompt, 8, gen, t)
            seg = make_segment(prompt, ids, [1] * 8, lps, [3] * 8, index=k)
            if recorded:
                seg.sampling.CopyFrom(records_pb2.SegmentSampling(temperature=t, top_p=1.0, mode="honour"))
            segs.append(seg)
        return trajectory("t0", "g0", 1.0, segs, run_id="r1" if recorded else "r2", group_size=1)

    async with capture_store(tmp_path / "store") as target:
        await store_trajectory(target, run(True))
        await store_trajectory(target, run(False))
        own = await offline.run(target, "r1", paths.default_model_dir(), tmp_path / "a.json", temperature=0.9)
        one = await offline.run(target, "r2", paths.default_model_dir(), tmp_path / "b.json", temperature=0.9)
    assert own["overall"]["agreement/tokens"] == 16
    assert own["overall"]["agreement/pearson"] >= 0.9999, own["overall"]
    assert own["overall"]["agreement/max_abs_diff"] < 1e-3 and own["alerts"] == []
    assert one["overall"]["agreement/max_abs_diff"] > 0.05  # the run-wide 0.9 fits neither segment


async def test_agreement_flags_a_mismatch(tmp_path: Path) -> None:
    from services.trainer import offline

    async with capture_store(tmp_path / "store") as target:
        await captured_run(target, perturb=6.0)
        data = await offline.run(target, "r1", paths.default_model_dir(), tmp_path / "r.json")
    assert data["overall"]["agreement/max_abs_diff"] > 5.9
    assert data["alerts"]
    assert data["worst_segments"][0]["max_abs_diff"] > 0.99


def test_agreement_bad_input_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = run_cli("--run", "r1", "--model", str(tmp_path / "nope"), "--out", str(out), "--capture", "127.0.0.1:1")
    assert proc.returncode == 2 and "not a model folder" in proc.stderr
    port = free_port()
    model = str(paths.default_model_dir())
    proc = run_cli("--run", "r1", "--model", model, "--out", str(out), "--capture", f"127.0.0.1:{port}")
    assert proc.returncode == 2 and "capture store at" in proc.stderr
    proc = run_cli("--run", "r1", "--model", model, "--out", str(out), "--temperature", "0")
    assert proc.returncode == 2 and "--temperature" in proc.stderr
    assert not out.exists()


async def test_agreement_unknown_run_is_not_found(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    async with capture_store(tmp_path / "store") as target:
        proc = await asyncio.to_thread(
            run_cli, "--run", "nope", "--model", str(paths.default_model_dir()), "--out", str(out), "--capture", target
        )
    assert proc.returncode == 2 and "no finalized trajectory" in proc.stderr
    assert not out.exists()
