"""Every trainable segment of a trajectory (earlier main segments before a
compaction, sub-agent threads) against verl's own classes on CPU: as a list of
AgentLoopOutput rows (verl's v1 worker) or, for verl's classic worker that takes
one row per sample, one row plus a count of the dropped ones that reaches verl's
step metrics."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from harnessrl import paths
from stack.verl import hooks as verl_hooks
from stack.verl import outputs as vo
from tests.trainer_support import TR, segment, trajectory
from tests.verl_support import FakeServerManager, agent_loop, compute_advantage, verl_batch, verl_worker


def compacted(tid: str = "t", reward: float = 1.0, long_sub: bool = False) -> Any:
    """main/0 (before a compaction), main/1 (after), a trainable sub-agent thread and
    an excluded title thread."""
    sub_ids = [7] * (20 if long_sub else 2)
    return trajectory(
        tid,
        "g",
        reward,
        [
            segment([1, 2], [3, 4], [1, 1], [-1.0, -1.25], index=0),
            segment([1, 9], [5, 6, 7], [1, 0, 1], [-0.2, 0.0, -0.3], index=1),
            segment([8], sub_ids, [1] * len(sub_ids), [-0.4] * len(sub_ids), thread="sub-1"),
            segment([8], [9], [1], [-0.1], thread="title", trainable=False),
        ],
    )


def test_every_trainable_segment_is_a_row_with_the_trajectorys_reward_main_last() -> None:
    outs = vo.trajectory_to_outputs(compacted(), response_length=8, prompt_length=8)
    assert all(isinstance(o, AgentLoopOutput) for o in outs)
    assert [o.extra_fields["harnessrl_segment"] for o in outs] == ["sub-1/0", "main/0", "main/1"]
    assert [o.reward_score for o in outs] == [1.0, 1.0, 1.0]
    assert all(o.extra_fields["harnessrl_valid"] and o.extra_fields["harnessrl_trial_id"] == "t" for o in outs)
    sub, first, last = outs
    assert (first.prompt_ids, first.response_ids, first.response_logprobs) == ([1, 2], [3, 4], [-1.0, -1.25])
    assert (last.response_ids, last.response_mask) == ([5, 6, 7], [1, 0, 1])
    assert sub.response_ids == [7, 7]
    assert last.extra_fields["harnessrl_dropped_segments"] == 0
    assert [s["thread"] for s in last.extra_fields["harnessrl_segments"]] == ["title"], "untrained, carried"
    rows = [o.as_dict() for o in outs]  # verl's own conversion of each row to tensors (what its v1 worker stores)
    assert [r["responses"].tolist() for r in rows] == [[7, 7], [3, 4], [5, 6, 7]]


def test_a_segment_that_cannot_be_a_row_is_dropped_and_counted() -> None:
    outs = vo.trajectory_to_outputs(compacted(long_sub=True), response_length=8, prompt_length=8)
    assert [o.extra_fields["harnessrl_segment"] for o in outs] == ["main/0", "main/1"]
    assert outs[-1].extra_fields["harnessrl_dropped_segments"] == 1
    assert {s["thread"] for s in outs[-1].extra_fields["harnessrl_segments"]} == {"title", "sub-1"}


def test_an_untrainable_trial_is_one_masked_row_in_either_shape() -> None:
    failed = trajectory("x", "g", 1.0, [segment([1], [2], [1], [-1.0])], TR.TERMINATION_REASON_VERIFIER_ERROR)
    (row,) = vo.trajectory_to_outputs(failed, 8)
    assert row.extra_fields["harnessrl_masked"] == "infra:verifier_error" and row.response_mask == [0]
    assert vo.trajectory_to_output(failed, 8).extra_fields["harnessrl_masked"] == "infra:verifier_error"
    # The final segment too long: the whole trial is masked (its reward belongs to that segment).
    long_final = trajectory(
        "y", "g", 1.0, [segment([1], [2], [1], [-1.0]), segment([1], [3] * 9, [1] * 9, [-1.0] * 9, index=1)]
    )
    (row,) = vo.trajectory_to_outputs(long_final, 8)
    assert row.extra_fields["harnessrl_masked"] == "response_too_long"


@pytest.mark.skipif(not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
async def test_one_row_per_trial_counts_the_dropped_segments_in_verls_step_metrics() -> None:
    """verl's classic worker (the fully-async trainer's) takes one row per sample: the
    main thread's last segment; the two other trainable segments are dropped, and
    the count reaches the metrics verl computes for the step."""
    from transformers import AutoTokenizer
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import metric_utils

    one = vo.trajectory_to_output(compacted("a"), 8, prompt_length=8)
    assert one.extra_fields["harnessrl_segment"] == "main/1" and one.response_ids == [5, 6, 7]
    assert one.extra_fields["harnessrl_dropped_segments"] == 2
    assert sorted(s["thread"] + f"/{s['index']}" for s in one.extra_fields["harnessrl_segments"]) == [
        "main/0",
        "sub-1/0",
        "title/0",
    ]
    other = vo.trajectory_to_output(compacted("b", reward=0.0), 8, prompt_length=8)
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    batch = await verl_batch(verl_worker(tokenizer, 8, 8), [one, other])
    batch.non_tensor_batch["uid"] = np.array(["g", "g"], dtype=object)
    batch.batch["token_level_scores"] = batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    batch = compute_advantage(batch, adv_estimator=verl_hooks.ESTIMATOR, config=AlgoConfig())
    metrics = metric_utils.compute_data_metrics(batch=batch, use_critic=False)
    assert metrics["harnessrl/dropped_segments"] == 4.0 and metrics["harnessrl/masked_rows"] == 0.0


# The harness: the main thread's first call, its history rewritten (a reminder injected,
# the first reply dropped: the main thread's next segment), and a sub-agent with its own task.
CALLS = """set -e
python3 - <<'PY'
import json, os, urllib.request

tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
def chat(messages):
    body = json.dumps({"model": os.environ["HARNESSRL_MODEL"], "tools": tools, "messages": messages}).encode()
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"}
    url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
    urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=60).read()

chat([{"role": "user", "content": "go"}])
chat([{"role": "user", "content": "go"}, {"role": "user", "content": "reminder: keep going"}])
chat([{"role": "user", "content": "sub-task: look around"}])
PY
echo hello > hello.txt
"""


@pytest.mark.skipif(not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_a_real_trials_segments_reach_verl_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real sandbox, proxy and capture store: a trial whose main thread was
    rewritten once and that ran a sub-agent has three trainable segments; segments=all
    makes each a row with the trial's reward, segments=last keeps main's last and counts
    the two others."""
    from transformers import AutoTokenizer

    from services.sandbox.server import create_sandbox_server
    from stack.verl import agent_loop as val
    from tests.sandbox_support import make_task, model_stack

    task = make_task(tmp_path / "tasks", "good")
    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    manager = FakeServerManager()
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    async with model_stack(tmp_path / "stack", {"*": [{"content": "from A"}]}) as stack:
        sandbox = await create_sandbox_server(stack.sandbox_settings(tmp_path, heartbeat_s=0.2, concurrency=2))
        monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", f"127.0.0.1:{sandbox.port}")
        monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", f"127.0.0.1:{stack.capture.port}")
        monkeypatch.setenv("HARNESSRL_HARNESS", "shell")
        options = {"harness_options": {"script": CALLS}}
        every = agent_loop(manager, tokenizer, 4096, 32, segments="all", **options)
        last = agent_loop(manager, tokenizer, 4096, 32, **options)
        try:
            rows, one = await asyncio.gather(
                every.run(params, task_path=str(task), task_id="good", uid="g", global_steps=1),
                last.run(params, task_path=str(task), task_id="good", uid="g", global_steps=1),
            )
        finally:
            await sandbox.stop(0)
            await val._GATEWAY.close()
    assert isinstance(rows, list) and not isinstance(one, list)
    assert [r.extra_fields["harnessrl_segment"] for r in rows] == ["subagent-1/0", "main/0", "main/1"]
    assert [r.reward_score for r in rows] == [1.0, 1.0, 1.0]
    sampled = [[(sum(prompt) + k) % 1000 + 3 for k in range(4)] for _, prompt, _ in manager.calls]
    assert all(r.response_ids in sampled for r in rows), "each row holds what verl's replicas sampled"
    assert one.extra_fields["harnessrl_segment"] == "main/1" and one.extra_fields["harnessrl_dropped_segments"] == 2
    batch = await verl_batch(
        verl_worker(tokenizer, 4096, 32), [r.model_copy(update={"routed_experts": None}) for r in rows]
    )
    assert batch.batch["response_mask"].sum(-1).tolist() == [4, 4, 4]


def test_each_row_carries_the_temperature_its_segment_was_sampled_with() -> None:
    from harnessrl.v1 import records_pb2

    traj = compacted()
    traj.segments[0].sampling.CopyFrom(records_pb2.SegmentSampling(temperature=0.7, top_p=1.0, mode="pin"))
    traj.segments[1].sampling.CopyFrom(records_pb2.SegmentSampling(temperature=0.3, top_p=1.0, mode="honour"))
    outs = vo.trajectory_to_outputs(traj, response_length=8, prompt_length=8)
    got = {o.extra_fields["harnessrl_segment"]: o.extra_fields["harnessrl_temperature"] for o in outs}
    assert got == {"sub-1/0": None, "main/0": 0.7, "main/1": 0.3}  # None: a capture that recorded none
    masked = vo.masked_output("sandbox_error", {"trial_id": "t"}, pad_id=0, version=1)
    assert masked.extra_fields["harnessrl_temperature"] is None  # the same keys on every row
