"""Multi-step tasks ([[steps]]) run as Harbor runs them, through real trials on the local
backend (bubblewrap) and a real Docker engine: the steps in order in one sandbox whose
state carries over, each step's own instruction, tests and solution, each step's verify
with every defence of a single verify, Harbor's early stop (min_reward) and its reward
strategies; each step's rewards are kept in the outcome and in result.json."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.factory import create_backend
from services.sandbox.trial.lifecycle import TerminationReason, TrialOutcome, TrialSpec, TrialState
from services.sandbox.trial.runner import TrialRunner
from tests.integration.test_sandbox_verifier_identity import REACH, host_network
from tests.sandbox_support import settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

EXAMPLE = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "examples" / "steps"
R = TerminationReason

# The agent of every step reports what it sees: its instruction, the verify phase's files
# and the last agent's logs (never: Harbor empties them), then does the step as its solution would.
PROBE = """echo "instruction: $HARNESSRL_INSTRUCTION" | head -1
for p in /tests /logs/verifier/reward.txt /logs/verifier/reward.json /solution /logs/agent/earlier; do
  if [ -e "$p" ]; then echo "visible: $p"; fi
done
touch /logs/agent/earlier
echo "uid: $(id -u)"
if [ -e /app/greet.sh ]; then
  printf '#!/bin/bash\\necho "hello${1:+ $1}"\\n' > /app/greet.sh
else
  printf '#!/bin/bash\\necho hello\\n' > /app/greet.sh
fi
"""


@pytest.fixture(scope="module")
def host_server() -> Iterator[int]:
    """The verifier's "internet": a server on the host's loopback (``host_network`` reaches it)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join()


@pytest.fixture(params=["local", "docker"])
def kind(request: pytest.FixtureRequest) -> dict[str, object]:
    if request.param == "docker":
        engine = request.getfixturevalue("docker_engine")
        return {"backend": "docker", "docker": DockerBackendSettings(host=engine.host, verify_network="none")}
    return {"backend": "local"}


def variant(tmp: Path, toml_edit: tuple[str, str] | None = None, files: dict[str, str] | None = None) -> Path:
    """A copy of the example task with one edit of its task.toml and some files replaced."""
    task = shutil.copytree(EXAMPLE, tmp / f"steps-{uuid.uuid4().hex[:6]}")
    if toml_edit is not None:
        text = (task / "task.toml").read_text()
        assert toml_edit[0] in text
        (task / "task.toml").write_text(text.replace(*toml_edit))
    for rel, text in (files or {}).items():
        (task / rel).write_text(text)
    return task


async def run(
    tmp: Path, task: Path, kind: dict[str, object], harness: str, **options: str
) -> tuple[TrialOutcome, list[TrialState]]:
    settings = settings_for(tmp, **kind)  # type: ignore[arg-type]
    spec = TrialSpec(
        trial_id=f"st-{uuid.uuid4().hex[:10]}", task_path=str(task), harness=harness, harness_options=options
    )
    states: list[TrialState] = []

    async def on_state(state: TrialState) -> None:
        states.append(state)

    outcome = await TrialRunner(settings, create_backend(settings)).run(spec, on_state=on_state)
    return outcome, states


def step_rewards(outcome: TrialOutcome) -> dict[str, dict[str, float]]:
    return {s.name: s.rewards for s in outcome.steps}


async def test_oracle_scores_1_and_nop_0_with_each_steps_rewards_kept(tmp_path: Path, kind: dict[str, object]) -> None:
    oracle, states = await run(tmp_path, EXAMPLE, kind, "oracle")
    assert (oracle.termination_reason, oracle.reward) == (R.COMPLETED, 1.0), (oracle.error, oracle.verifier_summary)
    # Each step's solution ran in turn (the second builds on the first's file: the state carried over).
    assert step_rewards(oracle) == {"greet": {"reward": 1.0}, "personalise": {"reward": 1.0, "kept": 1.0}}
    # mean, per key over the steps, a key a step lacks counting 0 (Harbor's default strategy).
    assert oracle.rewards == {"reward": 1.0, "kept": 0.5}
    assert all(s.verified and s.agent_s > 0 and s.verify_s > 0 for s in oracle.steps)
    assert states == [TrialState.SETUP, *[TrialState.AGENT, TrialState.VERIFY] * 2, TrialState.TEARDOWN]
    artifacts = Path(oracle.artifacts_dir)
    assert (artifacts / "steps" / "greet" / "verifier" / "reward.txt").read_text().strip() == "1"
    assert json.loads((artifacts / "steps" / "personalise" / "verifier" / "reward.json").read_text())["kept"] == 1
    result = json.loads((artifacts / "result.json").read_text())
    assert [s["name"] for s in result["steps"]] == ["greet", "personalise"]

    if kind["backend"] == "docker":  # every container and commit of the trial is gone with it
        import docker

        client = docker.DockerClient(base_url=kind["docker"].host)  # type: ignore[attr-defined]
        left = client.images.list(all=True, filters={"label": "io.harnessrl.verify=true"})
        left += client.containers.list(all=True, filters={"label": "io.harnessrl.managed=true"})
        assert left == [], left

    nop, _ = await run(tmp_path, EXAMPLE, kind, "nop")
    assert (nop.termination_reason, nop.reward) == (R.COMPLETED, 0.0), (nop.error, nop.verifier_summary)
    # min_reward = 1.0 on 'greet': the rest is skipped, and the mean is over the step that ran.
    assert step_rewards(nop) == {"greet": {"reward": 0.0}} and nop.rewards == {"reward": 0.0}
    assert any("min_reward" in e and "'greet'" in e for e in nop.events), nop.events


async def test_each_step_gets_its_instruction_and_never_the_last_verify_files(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    outcome, _ = await run(tmp_path, EXAMPLE, kind, "shell", script=PROBE)
    assert (outcome.termination_reason, outcome.reward) == (R.COMPLETED, 1.0), (outcome.error, outcome.events)
    artifacts = Path(outcome.artifacts_dir) / "steps"
    greet, personalise = ((artifacts / n / "agent.log").read_text() for n in ("greet", "personalise"))
    assert "instruction: Write an executable script /app/greet.sh" in greet
    assert "instruction: Extend /app/greet.sh" in personalise
    # After a verify that ran as root with /tests and wrote reward.txt, the next agent sees none of it.
    assert "visible:" not in greet + personalise, (greet, personalise)
    assert "uid: 1000" in personalise


async def test_final_strategy_and_a_per_key_min_reward(tmp_path: Path, kind: dict[str, object]) -> None:
    task = variant(tmp_path, ('"mean"', '"final"'))
    oracle, _ = await run(tmp_path, task, kind, "oracle")
    assert oracle.rewards == {"reward": 1.0, "kept": 1.0} and oracle.reward == 1.0  # the last step's, as is

    # A table gates each key (a missing one is -inf): 'greet' writes only 'reward'.
    gated = variant(tmp_path, ("min_reward = 1.0", "min_reward = { reward = 0.0, style = 0.0 }"))
    outcome, _ = await run(tmp_path, gated, kind, "oracle")
    assert [s.name for s in outcome.steps] == ["greet"] and outcome.reward == 1.0, outcome.events
    assert any("style=-inf" in e for e in outcome.events), outcome.events


async def test_a_steps_verifier_that_fails_is_verifier_error_never_a_reward(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    broken = "#!/bin/bash\necho 'no reward written'\n"
    task = variant(tmp_path, files={"steps/personalise/tests/test.sh": broken})
    outcome, _ = await run(tmp_path, task, kind, "oracle")
    assert (outcome.termination_reason, outcome.reward) == (R.VERIFIER_ERROR, None), outcome
    assert "step 'personalise': verifier:" in outcome.error
    # The steps that did run keep their rewards; the trial has none.
    assert step_rewards(outcome) == {"greet": {"reward": 1.0}, "personalise": {}} and outcome.rewards == {}
    assert [s.verified for s in outcome.steps] == [True, False]


async def test_the_step_timeouts_apply(tmp_path: Path) -> None:
    task = variant(tmp_path, ("[steps.agent]\ntimeout_sec = 60", "[steps.agent]\ntimeout_sec = 1"))
    outcome, _ = await run(tmp_path, task, {"backend": "local"}, "shell", script="sleep 5\n")
    # The agent of 'greet' ran out of its own 1 s; its verifier still graded it (0), as in Harbor.
    assert outcome.termination_reason == R.AGENT_TIMEOUT and outcome.steps[0].agent_timed_out
    assert outcome.steps[0].agent_s < 4 and step_rewards(outcome) == {"greet": {"reward": 0.0}}


async def test_a_backend_without_steps_refuses_the_task_by_name_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.sandbox.backends.local import LocalBackend

    # Every backend here runs them (kubernetes: test_sandbox_kubernetes_steps.py); a new one may not.
    monkeypatch.setattr(LocalBackend, "runs_steps", False)
    outcome, states = await run(tmp_path, EXAMPLE, {"backend": "local"}, "oracle")
    assert outcome.termination_reason == R.ENV_SETUP_FAILED and outcome.steps == []
    assert "[[steps]] (a multi-step task) does not run on the local backend" in outcome.error
    assert TrialState.AGENT not in states


WHO = """#!/bin/bash
source /tests/lib.sh
ok=0; [ "$(greeting)" = hello ] && ok=1
echo "{\\"reward\\": $ok, \\"uid\\": $(id -u)}" > /logs/verifier/reward.json
"""


async def test_a_steps_verifier_user_is_its_own_as_in_harbor(tmp_path: Path, kind: dict[str, object]) -> None:
    own = ('env = { GREETING_NAME = "Ada" }', 'env = { GREETING_NAME = "Ada" }\nuser = "1000"')
    files = {"steps/greet/tests/test.sh": WHO, "steps/personalise/tests/test.sh": WHO}
    outcome, _ = await run(tmp_path, variant(tmp_path, own, files), kind, "oracle")
    assert outcome.termination_reason == R.COMPLETED, (outcome.error, outcome.verifier_summary)
    # 'greet' verifies as [verifier] user (unset: the image's USER, root); 'personalise' as its own.
    assert step_rewards(outcome) == {"greet": {"reward": 1.0, "uid": 0.0}, "personalise": {"reward": 1.0, "uid": 1000}}


async def test_a_step_verifier_user_local_cannot_be_fails_setup_by_name(tmp_path: Path) -> None:
    task = variant(tmp_path, ('env = { GREETING_NAME = "Ada" }', 'env = { GREETING_NAME = "Ada" }\nuser = "app"'))
    outcome, _ = await run(tmp_path, task, {"backend": "local"}, "oracle")
    assert outcome.termination_reason == R.ENV_SETUP_FAILED and outcome.steps == []
    assert "steps[1].verifier.user = 'app' is not supported by the local backend" in outcome.error


NET = f"""#!/bin/bash
{REACH} && net=1 || net=0
echo "{{\\"reward\\": 1, \\"net\\": $net}}" > /logs/verifier/reward.json
"""


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_a_steps_verifier_network_is_its_own_as_in_harbor(
    tmp_path: Path, host_server: int, backend: str, request: pytest.FixtureRequest
) -> None:
    """[steps.verifier] network_mode over [verifier]'s (then [environment]'s 'no-network' here)."""
    engine = request.getfixturevalue("docker_engine") if backend == "docker" else None
    public = (
        'env = { GREETING_NAME = "Ada" }',
        f'env = {{ PROBE_URL = "http://127.0.0.1:{host_server}/" }}\nnetwork_mode = "public"',
    )
    files = {"steps/greet/tests/test.sh": NET, "steps/personalise/tests/test.sh": NET}
    task = variant(tmp_path, public, files)
    text = (
        (task / "task.toml")
        .read_text()
        .replace("[verifier]\n", f'[verifier]\nenv = {{ PROBE_URL = "http://127.0.0.1:{host_server}/" }}\n', 1)
    )
    (task / "task.toml").write_text(text)
    outcome, _ = await run(tmp_path, task, host_network(backend, engine), "oracle")
    assert outcome.termination_reason == R.COMPLETED, (outcome.error, outcome.verifier_summary)
    assert step_rewards(outcome) == {"greet": {"reward": 1.0, "net": 0.0}, "personalise": {"reward": 1.0, "net": 1.0}}


def with_extras(tmp: Path, healthcheck: str) -> Path:
    extras = f'artifacts = ["/app/greet.sh"]\nhealthcheck = {{ command = "{healthcheck}", retries = 1 }}\n'
    return variant(tmp, ('name = "personalise"\n', 'name = "personalise"\n' + extras))


async def test_a_steps_healthcheck_and_artifacts_run_as_harbor_runs_them(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    outcome, _ = await run(tmp_path, with_extras(tmp_path, "test -x /app/greet.sh"), kind, "oracle")
    assert (outcome.termination_reason, outcome.reward) == (R.COMPLETED, 1.0), (outcome.error, outcome.events)
    # The step's healthcheck ran before its agent (after the first step made the file), once.
    assert sum(e.startswith("healthcheck:passed") for e in outcome.events) == 1, outcome.events
    # Its artifacts were collected after its agent, into its own folder.
    collected = Path(outcome.artifacts_dir) / "steps" / "personalise" / "artifacts"
    assert "${1:+ $1}" in (collected / "app" / "greet.sh").read_text()
    assert not (Path(outcome.artifacts_dir) / "steps" / "greet" / "artifacts").exists()

    failing, _ = await run(tmp_path, with_extras(tmp_path, "test -e /nowhere"), kind, "oracle")
    # A step's environment that never gets healthy is an infrastructure failure, never a reward.
    assert (failing.termination_reason, failing.reward) == (R.ENV_SETUP_FAILED, None), failing.events
    assert "test -e /nowhere" in failing.error
    assert [(s.name, s.verified) for s in failing.steps] == [("greet", True), ("personalise", False)]
