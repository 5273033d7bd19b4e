"""The launcher's plan: deterministic ids and task choice (a resumed run plans the
same groups), every task used equally often; the progress lines; a trial past its
agent phase has the gateway drop its kept KV caches."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from pathlib import Path

import numpy as np
from rich.console import Console

from harnessrl.v1 import sandbox_pb2
from services.gateway.engines.base import Sampling
from services.gateway.engines.local import LocalEngine
from services.gateway.server import create_server
from services.gateway.settings import Settings
from stack.launcher import SandboxLauncher, TrialTemplate, plan_step, task_for
from stack.progress import Progress, Rollouts, Snapshot, TrialBoard, rollout_line, step_line
from tests.test_gateway_support import tiny_llama

TASKS = [Path(f"/pool/t{i}") for i in range(5)]


def test_plan_is_deterministic_and_names_groups_and_trials() -> None:
    groups = plan_step("run-a", 3, TASKS, 2, 4, seed=7)
    assert groups == plan_step("run-a", 3, TASKS, 2, 4, seed=7)
    assert [g[0].group_id for g in groups] == ["run-a-s00003-g0", "run-a-s00003-g1"]
    assert [t.trial_id for t in groups[1]] == [f"run-a-s00003-g1-{i}" for i in range(4)]
    assert all(len({t.task for t in g}) == 1 for g in groups)  # one task per group
    assert plan_step("run-a", 3, TASKS, 2, 4, seed=8) != groups or len(TASKS) == 1


def test_every_task_is_used_equally_often() -> None:
    used = Counter(task_for(TASKS, 0, slot) for slot in range(50))
    assert set(used.values()) == {10}
    first_pass = [task_for(TASKS, 0, slot) for slot in range(5)]
    assert sorted(first_pass) == TASKS  # each pass is a permutation


def test_spec_carries_the_run_settings() -> None:
    template = TrialTemplate("run-a", "mini-swe-agent", "M", 4, 3, 60.0, 30.0, {"config": "compact"})
    trial = plan_step("run-a", 0, TASKS, 1, 4, seed=0)[0][2]
    spec = template.spec(trial, policy_version=5)
    assert (spec.trial_id, spec.group_id, spec.group_size, spec.step) == (trial.trial_id, trial.group_id, 4, 0)
    assert (spec.policy_version, spec.max_turns, spec.agent_timeout_s) == (5, 3, 60.0)
    assert dict(spec.harness_options) == {"config": "compact"} and spec.task_id == trial.task.name


def test_progress_line() -> None:
    snap = Snapshot(2, 3, {"done": 8, "agent": 2}, {"completed": 6, "agent_timeout": 2}, {"reward/mean": 0.25}, "", 61)
    line = step_line(snap)
    assert line.startswith("step 2/3  reward 0.250  pearson -  trials done 8")
    assert "reasons [agent_timeout 2, completed 6]" in line and line.endswith("61s")
    snap.values = {"reward/mean": 0.125, "agreement/pearson": float("nan")}
    assert "pearson -" in step_line(snap)


def test_rollout_line_follows_the_oldest_unfinished_step() -> None:
    board = TrialBoard()
    assert board.rollouts() is None
    for i in range(4):
        board.submitted(f"s0-{i}", 0)
    board.update("s1-0", "queued")  # a status before its submit returned: placed when the submit comes
    board.submitted("s1-0", 1)
    board.update("s0-0", "done", 1.0)
    board.update("s0-1", "done", 0.0)
    board.update("s0-2", "agent")
    board.update("s0-3", "verify")
    r = board.rollouts()
    assert r is not None and (r.step, r.done, r.total, r.rewards) == (0, 2, 4, (1.0, 0.0))
    assert r.running == {"agent": 1, "verify": 1} and r.slowest is not None and r.slowest[:2] == ("s0-2", "agent")
    line = rollout_line(r)
    assert line.startswith("rollouts of step 0: done 2/4  rewards 1/2  running [agent 1, verify 1]")
    assert "slowest s0-2 in agent" in line
    board.update("s0-2", "done", 0.5)
    board.update("s0-3", "done", None)  # an infra failure: no reward
    r = board.rollouts()
    assert r is not None and (r.step, r.done, r.total, r.running) == (1, 0, 1, {"queued": 1})
    assert rollout_line(Rollouts(0, 2, 2, (0.25, 0.75), {}, None)).endswith("reward mean 0.500 (2)  running [-]")


def test_without_a_terminal_a_rollout_line_comes_between_step_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=300)
    rollouts = Rollouts(0, 1, 4, (1.0,), {"agent": 3}, ("t-2", "agent", 95.0))
    snap = Snapshot(0, 3, {}, {}, {}, "", 12, rollouts)
    progress = Progress(lambda: snap, console, line_every_s=0)
    progress.tick(None)
    snap.step, snap.values = 1, {"reward/mean": 0.25}
    progress.tick(None)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("rollouts of step 0: done 1/4  rewards 1/1  running [agent 3]  slowest t-2 in agent 95s")
    assert lines[1].startswith("step 1/3  reward 0.250") and len(lines) == 2


async def test_a_trial_past_its_agent_phase_has_the_gateway_drop_its_caches(tmp_path: Path) -> None:
    """A real gateway (local engine, tiny model) behind the launcher: a trial's status in the
    agent phase keeps its cache; verify (or later) drops it, once; another trial keeps its own."""
    server = await create_server(
        Settings(engine="local", model_path=tiny_llama(tmp_path / "tiny"), shutdown_grace_s=0.5, health_interval_s=3600)
    )
    engine = server.service.router.replicas[0].engine
    assert isinstance(engine, LocalEngine)
    template = TrialTemplate("run-a", "mini-swe-agent", "M", 2, 3, 60.0, 30.0, {})
    # Sandbox and capture store are never called here (channels connect on first use).
    launcher = SandboxLauncher(
        template,
        TASKS,
        sandbox_target="127.0.0.1:9",
        capture_target="127.0.0.1:9",
        groups_per_step=1,
        steps=1,
        gateway_target=f"127.0.0.1:{server.port}",
    )
    try:
        for trial in ("ta", "tb"):
            prompt = np.asarray([1, 520, 9531, 198, 30, 31], np.int32)
            sampling = Sampling(temperature=0.0, max_tokens=3)
            _ = [o async for o in server.service.generate(f"{trial}-1", trial, "main", prompt, sampling)]
        # A turn's cache is kept just after its last token is sent: wait for the worker's next boundary.
        await asyncio.wrap_future(engine.worker.call(lambda: None))
        assert len(engine.worker.prefix) == 2

        def status(trial: str, state: int) -> sandbox_pb2.TrialStatus:
            return sandbox_pb2.TrialStatus(trial_id=trial, run_id="run-a", state=state)  # type: ignore[arg-type]

        launcher.observe(status("ta", sandbox_pb2.TRIAL_STATE_AGENT))
        await launcher.settle()
        assert len(engine.worker.prefix) == 2
        launcher.observe(status("ta", sandbox_pb2.TRIAL_STATE_VERIFY))
        launcher.observe(status("ta", sandbox_pb2.TRIAL_STATE_DONE))
        await launcher.settle()
        assert len(engine.worker.prefix) == 1
        got, reuse = engine.worker.prefix.take(
            ("tb", "main"), np.asarray([1, 520, 9531, 198, 30, 31, 7, 8, 9], np.int32)
        )
        assert got is not None and reuse > 0
    finally:
        await launcher.close()
        await server.stop(0.5)
