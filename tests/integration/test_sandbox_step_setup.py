"""Harbor's step preparation, through real trials on the local backend (bubblewrap) and a
real Docker engine: each step's ``workdir/`` merged into the working directory, its
``setup.sh`` run there (as the agent, before the healthcheck), its ``[steps.healthcheck]``
checking what the step before it left, its ``artifacts`` collected; a failed setup.sh or
healthcheck ends the trial as env_setup_failed naming the step."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.sandbox.trial.lifecycle import TerminationReason
from tests.integration import test_sandbox_steps as steps_suite
from tests.integration.test_sandbox_steps import run, step_rewards, variant

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
R = TerminationReason
kind = steps_suite.kind  # the same fixture: local, docker

HEALTHCHECK = "test -x /app/greet.sh && test -f /app/setup-ran"
# The step's files are there before setup.sh, which runs from the working directory (the
# image's README.md kept: merged, not replaced), then removes itself as Harbor's recipe does.
SETUP = """set -eu
test -f name.txt && test -f README.md && test -f notes/greet.txt && test -f notes/personalise.txt
echo "$(id -u) $(pwd)" > /app/setup-ran
rm -- "$0"
"""


def prepared(tmp: Path, healthcheck: str = HEALTHCHECK, setup: str = SETUP) -> Path:
    extras = (
        'artifacts = ["/app/greet.sh", "/app/notes", "/app/setup-ran", "/app/name.txt"]\n'
        f'healthcheck = {{ command = "{healthcheck}", retries = 2, interval_sec = 0 }}\n'
    )
    task = variant(tmp, ('name = "personalise"\n', 'name = "personalise"\n' + extras))
    for step, files in {
        "greet": {"notes/greet.txt": "from the first step\n"},
        "personalise": {"name.txt": "Ada\n", "notes/personalise.txt": "from the second\n", "setup.sh": setup},
    }.items():
        for rel, text in files.items():
            path = task / "steps" / step / "workdir" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return task


async def test_a_steps_workdir_setup_healthcheck_and_artifacts_run_as_harbor_runs_them(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    oracle, _ = await run(tmp_path, prepared(tmp_path), kind, "oracle")
    assert (oracle.termination_reason, oracle.reward) == (R.COMPLETED, 1.0), (oracle.error, oracle.events)
    assert step_rewards(oracle)["personalise"] == {"reward": 1.0, "kept": 1.0}
    collected = Path(oracle.artifacts_dir) / "steps" / "personalise" / "artifacts" / "app"
    # Both steps' workdir/ merged into /app/notes; setup.sh ran as the agent in /app and removed itself.
    assert sorted(p.name for p in (collected / "notes").iterdir()) == ["greet.txt", "personalise.txt"]
    assert (collected / "setup-ran").read_text() == "1000 /app\n"
    assert (collected / "name.txt").read_text() == "Ada\n"
    assert "${1:+ $1}" in (collected / "greet.sh").read_text()  # the step's artifacts, after its agent
    (setup_ran,) = [i for i, e in enumerate(oracle.events) if e.startswith("step 'personalise': setup.sh ran")]
    assert oracle.events[setup_ran + 1].startswith("healthcheck:passed"), oracle.events  # then its healthcheck

    nop, _ = await run(tmp_path, prepared(tmp_path), kind, "nop")
    assert (nop.termination_reason, nop.reward) == (R.COMPLETED, 0.0), (nop.error, nop.events)
    assert step_rewards(nop) == {"greet": {"reward": 0.0}}  # min_reward: 'personalise' never prepared


async def test_a_failed_setup_or_healthcheck_ends_the_trial_naming_the_step(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    failing_setup = prepared(tmp_path, setup="echo 'no config here' >&2\nexit 3\n")
    outcome, _ = await run(tmp_path, failing_setup, kind, "oracle")
    assert (outcome.termination_reason, outcome.reward) == (R.ENV_SETUP_FAILED, None), outcome.events
    assert "step 'personalise': steps/personalise/workdir/setup.sh exited 3" in outcome.error, outcome.error
    assert "no config here" in outcome.error
    assert [(s.name, s.verified) for s in outcome.steps] == [("greet", True), ("personalise", False)]

    unhealthy, _ = await run(tmp_path, prepared(tmp_path, healthcheck="test -e /app/nowhere"), kind, "oracle")
    assert (unhealthy.termination_reason, unhealthy.reward) == (R.ENV_SETUP_FAILED, None), unhealthy.events
    assert "step 'personalise': [steps.healthcheck]" in unhealthy.error and "test -e /app/nowhere" in unhealthy.error
    assert [(s.name, s.verified) for s in unhealthy.steps] == [("greet", True), ("personalise", False)]
