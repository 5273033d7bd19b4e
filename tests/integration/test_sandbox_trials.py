"""Whole trials through a worker: each fault ends with the right termination
reason (invariant 5), and the same worker goes on serving afterwards."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from services.sandbox.common.settings import Settings
from services.sandbox.factory import build_worker
from services.sandbox.queue.memory import MemoryQueue
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec, TrialState
from tests.sandbox_support import make_task, settings_for, wait_for_state

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

R = TerminationReason
NO_REWARD_TEST = "#!/bin/bash\necho 'forgot the reward'\n"
CRASHING_TEST = "#!/bin/bash\nkill -SEGV $$\n"
HANGING_TEST = "#!/bin/bash\nsleep 60\n"
GARBAGE_TEST = "#!/bin/bash\necho passed > /logs/verifier/reward.txt\n"

# name -> (harness script or harness, test.sh or None for the default, expected reason, expected reward, event)
CASES: dict[str, tuple[str, str | None, TerminationReason, float | None, str | None]] = {
    "good": ("echo hello > hello.txt", None, R.COMPLETED, 1.0, None),
    "crash": ("echo hello > hello.txt; kill -SEGV $$", None, R.COMPLETED, 1.0, None),
    "hang": ("echo hello > hello.txt; sleep 600", None, R.AGENT_TIMEOUT, 1.0, "agent:timed_out"),
    "flood": (
        "head -c 30000000 /dev/zero | tr '\\0' y; echo hello > hello.txt",
        None,
        R.COMPLETED,
        1.0,
        "agent:output_truncated",
    ),
    "disk": (
        "for i in $(seq 200); do head -c 5000000 /dev/zero > f$i; done; sleep 20",
        None,
        R.COMPLETED,
        0.0,
        "agent:disk_exceeded",
    ),
    "fork-bomb": ("b() { b | b & }; b; sleep 20", None, R.AGENT_TIMEOUT, 0.0, "agent:pids_limit_hit"),
    "oom": ("python3 -c 'x = bytearray(2 << 30)'; echo hello > hello.txt", None, R.COMPLETED, 1.0, "agent:oom_killed"),
    "no-reward": ("echo hello > hello.txt", NO_REWARD_TEST, R.VERIFIER_ERROR, None, None),
    "verifier-crash": ("true", CRASHING_TEST, R.VERIFIER_ERROR, None, None),
    "verifier-garbage": ("true", GARBAGE_TEST, R.VERIFIER_ERROR, None, None),
    "verifier-hang": ("true", HANGING_TEST, R.VERIFIER_TIMEOUT, None, None),
    "good-again": ("echo hello > hello.txt", None, R.COMPLETED, 1.0, None),
}

TOML = """\
schema_version = "1.4"
[agent]
timeout_sec = {agent_timeout}
[verifier]
timeout_sec = 3
[environment]
memory_mb = 256
storage_mb = 40
"""


def tasks_for_cases(root: Path) -> dict[str, Path]:
    out = {}
    for name, (_, test_sh, _reason, _reward, _event) in CASES.items():
        agent_timeout = 4 if name in ("hang", "disk", "fork-bomb") else 30
        kw = {"test_sh": test_sh} if test_sh else {}
        out[name] = make_task(root, name, toml=TOML.format(agent_timeout=agent_timeout), **kw)
    return out


async def run_all(settings: Settings, specs: list[TrialSpec]) -> dict[str, object]:
    queue = MemoryQueue()
    worker = build_worker(settings, queue, name="w")
    stop = asyncio.Event()
    serving = asyncio.ensure_future(worker.run(stop))
    for spec in specs:
        await queue.submit(spec)
    records = {spec.trial_id: await wait_for_state(queue, spec.trial_id, TrialState.DONE) for spec in specs}
    stop.set()
    await serving
    return records


async def test_every_fault_has_its_reason_and_the_worker_keeps_serving(tmp_path: Path) -> None:
    tasks = tasks_for_cases(tmp_path / "tasks")
    settings = settings_for(tmp_path, concurrency=3, pids_limit=64)
    specs = [
        TrialSpec(trial_id=f"f-{name}", task_path=str(tasks[name]), harness="shell", harness_options={"script": script})
        for name, (script, *_rest) in CASES.items()
    ]
    records = await run_all(settings, specs)
    for name, (_, _, reason, reward, event) in CASES.items():
        record = records[f"f-{name}"]
        outcome = record.outcome  # type: ignore[attr-defined]
        assert outcome.termination_reason == reason, (name, outcome)
        assert outcome.reward == reward, (name, outcome)
        if event:
            assert event in outcome.events, (name, outcome.events)
        timings = outcome.timings
        assert timings.setup_s > 0 and timings.teardown_s > 0, name
        assert (timings.agent_s > 0) and (timings.verify_s > 0), name
        result = json.loads((Path(outcome.artifacts_dir) / "result.json").read_text())
        assert result["termination_reason"] == reason.value
    assert records["f-crash"].outcome.harness_exit_code != 0  # type: ignore[attr-defined]
    assert "no reward file" in records["f-no-reward"].outcome.error  # type: ignore[attr-defined]
    flood_log = Path(records["f-flood"].outcome.artifacts_dir) / "agent.log"  # type: ignore[attr-defined]
    assert flood_log.stat().st_size <= settings.output_limit_bytes + 100
    assert not any(settings.work_dir.iterdir()), "teardown leaves no trial directory behind"


async def test_env_build_failure_is_env_setup_failed(tmp_path: Path) -> None:
    broken = make_task(tmp_path / "tasks", "broken", dockerfile="FROM x\nRUN exit 7\n")
    unsupported = make_task(tmp_path / "tasks", "unsupported", dockerfile="FROM a AS b\nFROM c\n")
    missing = tmp_path / "tasks" / "missing"
    settings = settings_for(tmp_path)
    specs = [
        TrialSpec(trial_id="b1", task_path=str(broken), harness="oracle"),
        TrialSpec(trial_id="b2", task_path=str(unsupported), harness="oracle"),
        TrialSpec(trial_id="b3", task_path=str(missing), harness="oracle"),
        TrialSpec(trial_id="b4", task_path=str(broken), harness="shell"),
    ]
    records = await run_all(settings, specs)
    for trial_id, fragment in [("b1", "exited with 7"), ("b2", "docker backend"), ("b3", "not a directory")]:
        outcome = records[trial_id].outcome  # type: ignore[attr-defined]
        assert outcome.termination_reason == R.ENV_SETUP_FAILED and outcome.reward is None
        assert fragment in outcome.error
        assert outcome.timings.agent_s == 0 and outcome.timings.verify_s == 0
    assert records["b4"].outcome.termination_reason == R.ENV_SETUP_FAILED  # type: ignore[attr-defined]


async def test_cancel_stops_a_running_trial(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    settings = settings_for(tmp_path, heartbeat_s=0.2)
    queue = MemoryQueue()
    worker = build_worker(settings, queue, name="w")
    stop = asyncio.Event()
    serving = asyncio.ensure_future(worker.run(stop))
    await queue.submit(
        TrialSpec(trial_id="c", task_path=str(task), harness="shell", harness_options={"script": "sleep 60"})
    )
    assert (await wait_for_state(queue, "c", TrialState.AGENT)).state == TrialState.AGENT
    assert await queue.cancel("c")
    record = await wait_for_state(queue, "c", TrialState.DONE)
    assert record.outcome is not None and record.outcome.termination_reason == R.CANCELLED
    assert record.outcome.timings.agent_s < 10 and record.outcome.reward is None
    stop.set()
    await serving
