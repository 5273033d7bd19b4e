"""Offline train/inference agreement of a captured run (``harnessrl train agreement``).

Reads every finalized trajectory of a run from the capture store over gRPC,
recomputes the logprob of each sampled token with the weights at ``--model``
(teacher-forced, fp32, the captured tokens untouched) and reports how far they
are from what the engine recorded: overall, per policy version, and the worst
segments. The first thing to run when a run looks wrong.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from harnessrl.captured import list_trajectories
from harnessrl.errors import InvalidArgument, NotFound, Unavailable
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.trainer import agreement, forward
from services.trainer.cpu_trainer import load_model
from services.trainer.samples import Sample, StepCounters, build_sample

PAGE_SIZE = 200


async def fetch_run(target: str, run_id: str, token: str | None = None, limit: int = 0) -> list[records_pb2.Trajectory]:
    """Every finalized trajectory of ``run_id``, with token arrays (``limit`` > 0 caps the count)."""
    out: list[records_pb2.Trajectory] = []
    async with connect(target, token) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)
        listing = capture_pb2.ListTrajectoriesRequest(run_id=run_id, finalized_only=True, page_size=PAGE_SIZE)
        async for meta in list_trajectories(stub, listing):
            if limit and len(out) >= limit:
                break
            req = capture_pb2.GetTrajectoryRequest(run_id=run_id, trial_id=meta.trial_id, include_tokens=True)
            out.append(await stub.GetTrajectory(req))
    return out


def report(
    trajectories: Sequence[records_pb2.Trajectory],
    model_path: Path,
    token_budget: int = 4096,
    max_seq_len: int = 8192,
    min_pearson: float = 0.98,
    min_ess: float = 0.5,
    temperature: float = 1.0,
) -> dict[str, Any]:
    """Agreement of every sampled token of ``trajectories`` under the weights at ``model_path``."""
    if not (model_path / "config.json").exists():
        raise NotFound(f"{model_path}: not a model folder (no config.json)")
    counters = StepCounters()
    samples: list[Sample] = []
    for traj in trajectories:
        counters.add("trajectories")
        samples += [s for seg in traj.segments if (s := build_sample(seg, traj.trial_id, counters, max_seq_len))]
    model = load_model(model_path, gradient_checkpointing=False).eval()
    with torch.no_grad():
        train = forward.logprobs_no_grad(model, samples, token_budget, temperature=temperature)
    t_all, r_all = [], []
    by_version: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = defaultdict(lambda: ([], []))
    per_segment: list[dict[str, Any]] = []
    for s, lp in zip(samples, train, strict=True):
        t, r, v = lp.numpy()[s.mask], s.rollout_logprobs[s.mask], s.versions[s.mask]
        t_all.append(t)
        r_all.append(r)
        for version in np.unique(v):
            by_version[int(version)][0].append(t[v == version])
            by_version[int(version)][1].append(r[v == version])
        diff = np.abs(t - r)
        per_segment.append(
            {"trial_id": s.trial_id, "segment": s.segment, "tokens": len(t), "max_abs_diff": float(diff.max())}
        )
    overall = agreement.compute(_cat(t_all), _cat(r_all))
    return {
        "model": str(model_path),
        "counters": counters.as_metrics(),
        "overall": overall.as_metrics("agreement"),
        "by_policy_version": {
            str(v): agreement.compute(_cat(ts), _cat(rs)).as_metrics("agreement")
            for v, (ts, rs) in sorted(by_version.items())
        },
        "worst_segments": sorted(per_segment, key=lambda x: -float(x["max_abs_diff"]))[:20],
        "alerts": agreement.alerts(overall, min_pearson, min_ess),
    }


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0)


def write_report(data: dict[str, Any], out: Path) -> None:
    """Writes ``out`` atomically: a reader sees the whole report or none."""
    if out.is_dir():
        raise InvalidArgument(f"{out}: is a directory, expected a file path")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=True))
    os.replace(tmp, out)


async def run(
    target: str,
    run_id: str,
    model_path: Path,
    out: Path,
    token: str | None = None,
    limit: int = 0,
    temperature: float = 1.0,
) -> dict[str, Any]:
    if not (model_path / "config.json").exists():
        raise NotFound(f"{model_path}: not a model folder (no config.json)")
    try:
        trajectories = await fetch_run(target, run_id, token, limit)
    except grpc.aio.AioRpcError as e:
        raise Unavailable(f"capture store at {target}: {e.code().name}: {e.details()}") from e
    if not trajectories:
        raise NotFound(f"run {run_id!r}: no finalized trajectory in the capture store at {target}")
    data = {"run_id": run_id, **report(trajectories, model_path, temperature=temperature)}
    write_report(data, out)
    return data
