"""``segments: all`` on verl's v1 trainer: ``harnessrl verl prepare --segments all``
targets ``verl.trainer.main_ppo`` (ppo_trainer, trainer.use_v1) with the agent loop
returning every trainable segment, and those rows go through the v1 worker's own
batch assembly (``AgentLoopWorkerTQ._agent_loop_postprocess``: keys
``{uid}_{session}_{i}``, staleness tags, ``list_of_dict_to_tensordict``) and v1's
advantage (``compute_advantage_for_multi_trajectories``) on CPU. TransferQueue's
storage needs Ray: its one put call is the seam, captured here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from harnessrl import paths
from stack.verl import hooks as verl_hooks
from stack.verl import outputs as vo
from stack.verl import prepare as verl_prepare
from tests.integration.test_verl_prepare import QUICKSTART, cli
from tests.integration.test_verl_segments import compacted
from tests.trainer_support import TR, segment, trajectory
from tests.verl_support import verl_batch, verl_worker


def test_prepare_segments_all_targets_verls_v1_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["verl", "prepare", "--config", str(QUICKSTART), "--out", str(tmp_path), "--segments", "all", "--dry-run"]
    code, out = cli(args, monkeypatch, capsys)
    assert code == 0, out
    assert "dry run ok: verl's ppo_trainer" in out and "harnessrl_grpo" in out
    (entry,) = yaml.safe_load((tmp_path / "agent_loops.yaml").read_text())
    assert entry["segments"] == "all"
    launch = (tmp_path / "launch.sh").read_text()
    assert "verl.trainer.main_ppo" in launch and "+harnessrl@_global_=v1" in launch
    prepared = verl_prepare.prepare(QUICKSTART, tmp_path / "again", segments="all")
    cfg = verl_prepare.dry_run(prepared)
    assert cfg.trainer.use_v1 and cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "harnessrl_agent"
    assert cfg.trainer.total_training_steps is not None and "async_training" not in cfg


def test_a_bad_segments_value_is_refused_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    args = ["verl", "prepare", "--config", str(QUICKSTART), "--out", str(out_dir), "--segments", "some"]
    code, out = cli(args, monkeypatch, capsys)
    assert code == 2 and "segments must be one of ['all', 'last'], got 'some'" in out, out
    assert not out_dir.exists()


def v1_worker(tokenizer: Any) -> Any:
    """verl's AgentLoopWorkerTQ without Ray: what its post-process reads."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    cls = AgentLoopWorkerTQ.__ray_actor_class__  # the class under verl's @ray.remote
    worker = cls.__new__(cls)
    base = verl_worker(tokenizer, 8, 8)
    worker.__dict__.update(base.__dict__)
    return worker


@pytest.mark.skipif(not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
async def test_segment_rows_through_v1s_batch_assembly_and_advantage(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    failed = trajectory("x", "g", 1.0, [segment([1], [2], [1], [-1.0])], TR.TERMINATION_REASON_VERIFIER_ERROR)
    sessions = [
        vo.trajectory_to_outputs(compacted("a", reward=1.0), 8, prompt_length=8),
        vo.trajectory_to_outputs(compacted("b", reward=0.0), 8, prompt_length=8),
        vo.trajectory_to_outputs(failed, 8, prompt_length=8, version=4),
    ]
    put: list[tuple[list[str], Any, list[dict[str, Any]]]] = []

    async def kv_batch_put(*, keys: list[str], fields: Any, tags: list[dict[str, Any]], partition_id: str) -> None:
        put.append((keys, fields, tags))

    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    worker = v1_worker(tokenizer)
    for session, rows in enumerate(sessions):
        await worker._agent_loop_postprocess(rows, False, uid="g", session_id=session, global_steps=5)
    keys = [k for ks, _, _ in put for k in ks]
    assert keys == ["g_0_0", "g_0_1", "g_0_2", "g_1_0", "g_1_1", "g_1_2", "g_2_0"]
    tags = [t for _, _, ts in put for t in ts]
    assert all(isinstance(t["min_global_steps"], int) and isinstance(t["max_global_steps"], int) for t in tags)
    assert tags[-1]["min_global_steps"] == tags[-1]["max_global_steps"] == 4, "the masked row's given version"
    assert [int(f["responses"].shape[0]) for _, f, _ in put] == [3, 3, 1], "v1 stored every segment's row"
    # What v1's trainer reads back from TransferQueue, padded as verl's worker pads it.
    rows = [r for s in sessions for r in s]
    batch = await verl_batch(verl_worker(tokenizer, 8, 8), rows)
    batch.non_tensor_batch["uid"] = np.array(["g"] * len(rows), dtype=object)
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    algo = AlgoConfig(adv_estimator=verl_hooks.ESTIMATOR)
    batch = compute_advantage_for_multi_trajectories(batch, keys, adv_estimator=algo.adv_estimator, config=algo)
    adv = batch.batch["advantages"].sum(-1)
    assert adv[-1] == 0, "the masked session's row is out of the statistics and weighs 0"
    assert (adv[:3] > 0).all() and (adv[3:6] < 0).all(), "each segment trains with its trajectory's sign"
