"""Harbor's ``[environment.healthcheck]`` and task-level ``artifacts`` through real trials,
on the local backend (bubblewrap) and a real Docker engine. Tasks written here, modelled
on Harbor's documentation:

- ``warmup``: a healthcheck that fails twice and then passes (retries = 3): the trial goes
  on, oracle 1 and nop 0; ``down``: one that never passes: env_setup_failed naming the
  healthcheck and its last output, start-period failures not counted, no agent run;
- ``service`` (docker): the image's ENTRYPOINT starts an HTTP service three seconds late;
  the healthcheck holds the agent back until it answers (oracle 1, nop 0);
- ``collect``: files, a directory with a tar ``--exclude`` glob and a missing entry,
  collected after the agent and before the verifier (which rewrites one of them), with
  Harbor's manifest; a link to the worker's files never brings them out;
- ``publish``: Harbor's /logs/artifacts, written by the agent and the verifier, collected
  after the verifier (per step with [[steps]], a step's setup.sh writing there too).
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.factory import create_backend
from services.sandbox.trial.lifecycle import TerminationReason, TrialOutcome, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import make_task, settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

R = TerminationReason
DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /app\nCOPY README.md /app/README.md\n"
TOML = 'schema_version = "1.4"\n{top}[task]\nname = "test/{{name}}"\n[verifier]\ntimeout_sec = 60\n[environment]\n'
# Counts its attempts in the sandbox user's HOME (kept between the setup phase's execs).
WARMUP = 'n=$(cat "$HOME/.hc" 2>/dev/null || echo 0); echo $((n+1)) > "$HOME/.hc"; echo "attempt $((n+1))"; ' + (
    '[ "$n" -ge 2 ]'
)


@pytest.fixture(params=["local", "docker"])
def kind(request: pytest.FixtureRequest) -> dict[str, object]:
    if request.param == "docker":
        engine: DockerEngine = request.getfixturevalue("docker_engine")
        return {"backend": "docker", "docker": DockerBackendSettings(host=engine.host, verify_network="none")}
    return {"backend": "local"}


def healthcheck_task(root: Path, name: str, healthcheck: str, **kwargs: object) -> Path:
    toml = TOML.format(top="") + "[environment.healthcheck]\n" + healthcheck
    return make_task(root, name, toml=toml, dockerfile=kwargs.pop("dockerfile", DOCKERFILE), **kwargs)  # type: ignore[arg-type]


async def run(tmp: Path, task_dir: Path, kind: dict[str, object], harness: str, script: str = "") -> TrialOutcome:
    settings = settings_for(tmp, cache_dir=tmp / "cache", **kind)  # type: ignore[arg-type]
    spec = TrialSpec(
        trial_id=f"hc-{uuid.uuid4().hex[:10]}",
        task_path=str(task_dir),
        harness=harness,
        harness_options={"script": script} if script else {},
    )
    return await TrialRunner(settings, create_backend(settings)).run(spec)


async def test_a_healthcheck_that_passes_on_its_third_attempt_lets_the_trial_run(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    hc = f"command = '{WARMUP}'\ninterval_sec = 0.1\nretries = 3\n"
    task = healthcheck_task(tmp_path / "tasks", "warmup", hc)
    oracle = await run(tmp_path, task, kind, "oracle")
    nop = await run(tmp_path, task, kind, "nop")
    assert (oracle.termination_reason, oracle.reward) == (R.COMPLETED, 1.0), oracle.error
    assert (nop.termination_reason, nop.reward) == (R.COMPLETED, 0.0), nop.error
    for outcome in (oracle, nop):
        (event,) = [e for e in outcome.events if e.startswith("healthcheck:")]
        assert event.startswith("healthcheck:passed after 3 attempt(s)"), outcome.events
        assert not (Path(outcome.artifacts_dir) / "artifacts").exists()  # nothing published, nothing named


async def test_a_healthcheck_that_never_passes_fails_setup_by_name_and_no_agent_runs(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    hc = (
        "command = 'echo \"db not ready on 5432\"; exit 3'\n"
        "start_period_sec = 0.6\nstart_interval_sec = 0.1\ninterval_sec = 0.1\nretries = 2\n"
    )
    task = healthcheck_task(tmp_path / "tasks", "down", hc)
    outcome = await run(tmp_path, task, kind, "oracle")
    assert outcome.termination_reason == R.ENV_SETUP_FAILED and outcome.reward is None
    error = outcome.error
    assert "[environment.healthcheck] never passed" in error and "'echo \"db not ready on 5432\"; exit 3'" in error
    assert "failed 2 consecutive time(s) after the start period" in error
    assert "the last exited 3: db not ready on 5432" in error
    attempts = int(error.split(" attempt(s) in all")[0].rsplit("(", 1)[1])
    assert attempts >= 4, error  # failures in the start period did not count
    artifacts = Path(outcome.artifacts_dir)
    assert outcome.timings.agent_s == 0 and not (artifacts / "agent.log").exists()
    assert not (artifacts / "verifier.log").exists()


async def test_an_attempt_past_timeout_sec_counts_as_a_failure(tmp_path: Path, kind: dict[str, object]) -> None:
    hc = "command = 'echo started; sleep 30'\ntimeout_sec = 0.5\ninterval_sec = 0.1\nretries = 2\n"
    outcome = await run(tmp_path, healthcheck_task(tmp_path / "tasks", "slow", hc), kind, "oracle")
    assert outcome.termination_reason == R.ENV_SETUP_FAILED, outcome.error
    assert "failed 2 consecutive time(s)" in outcome.error and "(2 attempt(s) in all)" in outcome.error
    assert "the last ran past timeout_sec = 0.5: started" in outcome.error


SERVICE_DOCKERFILE = """\
FROM python:3.11-slim
WORKDIR /app
COPY README.md /app/README.md
COPY srv/ /srv/
COPY entrypoint.sh /entrypoint.sh
RUN chmod 755 /entrypoint.sh
ENTRYPOINT ["/entrypoint.sh"]
"""
ENTRYPOINT = """\
#!/bin/sh
# A service that takes a moment: it listens three seconds after the container starts.
(sleep 3; cd /srv && exec python3 -m http.server 8000 --bind 127.0.0.1) > /dev/null 2>&1 &
exec "$@"
"""
FETCH = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/answer.txt', timeout=3).read().decode())"
SERVICE_SOLVE = f'#!/bin/bash\npython3 -c "{FETCH}" > /app/answer.txt\n'
SERVICE_TEST = """#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "forty-two" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


async def test_a_service_started_by_the_entrypoint_is_waited_for_on_docker(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    kind: dict[str, object] = {
        "backend": "docker",
        "docker": DockerBackendSettings(host=docker_engine.host, verify_network="none"),
    }
    hc = (
        f'command = "python3 -c \\"{FETCH}\\""\n'
        "start_period_sec = 30\nstart_interval_sec = 0.5\ninterval_sec = 1\ntimeout_sec = 5\nretries = 3\n"
    )
    task = healthcheck_task(
        tmp_path / "tasks",
        "service",
        hc,
        dockerfile=SERVICE_DOCKERFILE,
        context={"entrypoint.sh": ENTRYPOINT, "srv/answer.txt": "forty-two\n"},
        solve_sh=SERVICE_SOLVE,
        test_sh=SERVICE_TEST,
    )
    oracle = await run(tmp_path, task, kind, "oracle")
    nop = await run(tmp_path, task, kind, "nop")
    assert (oracle.termination_reason, oracle.reward) == (R.COMPLETED, 1.0), (oracle.error, oracle.verifier_summary)
    assert (nop.termination_reason, nop.reward) == (R.COMPLETED, 0.0), nop.error
    (event,) = [e for e in oracle.events if e.startswith("healthcheck:")]
    attempts = int(event.split("after ")[1].split(" attempt")[0])
    assert attempts > 1, event  # the service was not up when the sandbox started


ARTIFACTS = (
    "artifacts = ['/app/summary.json', "
    "{{ source = '/app/out', destination = 'out', exclude = ['*.tmp'] }}, "
    "'/app/missing.txt', '/home/agent/notes.txt', '/app/linky', '/app/escape']\n"
)
AGENT = """\
mkdir -p /app/out/logs /app/linky
echo report > /app/out/report.txt
echo log > /app/out/logs/a.log
echo scratch > /app/out/logs/skip.tmp
echo '{"ok": true}' > /app/summary.json
echo kept > ~/notes.txt
echo inside > /app/linky/file.txt
ln -s /etc/passwd /app/linky/passwd
ln -s /etc/passwd /app/escape
echo hello > /app/hello.txt
"""
# The verifier rewrites an artifact: what was collected before it must not change.
COLLECT_TEST = """#!/bin/bash
echo tampered > /app/summary.json
if [ "$(cat /app/hello.txt)" = hello ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def host_passwd_in(out: Path) -> list[Path]:
    host = Path("/etc/passwd").read_text()
    copies = [p for p in out.rglob("*") if p.is_file() and not p.is_symlink() and p.read_text() == host]
    return copies + [p for p in out.rglob("*") if p.is_symlink() and p.resolve() == Path("/etc/passwd")]


async def test_artifacts_are_collected_after_the_agent_as_harbor_collects_them(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    task = make_task(
        tmp_path / "tasks", "collect", toml=TOML.format(top=ARTIFACTS), dockerfile=DOCKERFILE, test_sh=COLLECT_TEST
    )
    outcome = await run(tmp_path, task, kind, "shell", AGENT)
    assert (outcome.termination_reason, outcome.reward) == (R.COMPLETED, 1.0), (outcome.error, outcome.events)
    out = Path(outcome.artifacts_dir) / "artifacts"
    assert (out / "app" / "summary.json").read_text() == '{"ok": true}\n'  # before the verifier
    assert (out / "out" / "report.txt").read_text() == "report\n"
    assert (out / "out" / "logs" / "a.log").read_text() == "log\n"
    assert not (out / "out" / "logs" / "skip.tmp").exists()  # excluded, as tar --exclude
    assert (out / "home" / "agent" / "notes.txt").read_text() == "kept\n"
    manifest = {e["source"]: e for e in json.loads((out / "manifest.json").read_text())}
    assert list(manifest) == [
        "/logs/artifacts",  # Harbor's convention entry, first; here empty
        "/app/summary.json",
        "/app/out",
        "/app/missing.txt",
        "/home/agent/notes.txt",
        "/app/linky",
        "/app/escape",
    ]
    assert manifest["/app/summary.json"] | {"detail": ""} == {
        "source": "/app/summary.json",
        "destination": "artifacts/app/summary.json",
        "type": "file",
        "status": "ok",
        "service": None,
        "exclude": [],
        "detail": "",
    }
    assert manifest["/app/out"]["status"] == "ok" and manifest["/app/out"]["exclude"] == ["*.tmp"]
    assert manifest["/app/out"]["destination"] == "artifacts/out" and manifest["/app/out"]["type"] == "directory"
    assert (manifest["/logs/artifacts"]["status"], manifest["/logs/artifacts"]["type"]) == ("empty", "directory")
    assert not (out / "logs").exists() and "artifact:empty:/logs/artifacts" not in outcome.events
    missing = manifest["/app/missing.txt"]
    assert (missing["status"], missing["type"]) == ("failed", "file") and "no such file" in missing["detail"]
    assert "artifact:ok:/app/summary.json" in outcome.events and "artifact:failed:/app/missing.txt" in outcome.events
    linky = manifest["/app/linky"]
    if kind["backend"] == "local":  # the sandbox's /etc is the worker's: a link never brings it out
        assert not host_passwd_in(out)
        assert linky["status"] == "ok" and "1 link(s) out of it" in linky["detail"], linky
        assert (out / "app" / "linky" / "file.txt").read_text() == "inside\n"
        assert not (out / "app" / "linky" / "passwd").exists()
        escape = manifest["/app/escape"]  # resolved in the sandbox to /etc/passwd: the host's, never copied
        assert escape["status"] == "failed" and "resolved to /etc/passwd" in escape["detail"], escape
    else:  # the engine's tar of a directory holding a link out is refused whole ('data' filter)
        assert linky["status"] == "failed" and "copying it out failed" in linky["detail"], linky
        # /app/escape resolves in the container to its own /etc/passwd: the image's file, collected.
        assert manifest["/app/escape"]["status"] == "ok" and not (out / "app" / "escape").is_symlink()


STEPS_EXAMPLE = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "examples" / "steps"


async def test_with_steps_the_healthcheck_runs_once_and_each_step_keeps_its_artifacts(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    """Harbor's multi-step trial: the top-level healthcheck once, when the environment starts;
    the task's artifacts after each step's agent, kept per step (steps/NAME/artifacts)."""
    task = Path(shutil.copytree(STEPS_EXAMPLE, tmp_path / "steps"))
    toml = (task / "task.toml").read_text()
    top = "artifacts = ['/app/greet.sh']\n"
    hc = f"[environment.healthcheck]\ncommand = '{WARMUP}'\ninterval_sec = 0.1\n"
    (task / "task.toml").write_text(top + toml.replace("\n[[steps]]\n", f"\n{hc}\n[[steps]]\n", 1))
    # As the cookbook's multi-step recipe: a step's setup.sh (the sandbox user) leaves a marker in
    # Harbor's publish folder, which is collected into that step's folder and emptied after it.
    setup = task / "steps" / "personalise" / "workdir" / "setup.sh"
    setup.parent.mkdir(parents=True)
    setup.write_text("#!/bin/bash\nset -euo pipefail\nmkdir -p /logs/artifacts\necho ran > /logs/artifacts/marker\n")
    greet_test = task / "steps" / "greet" / "tests" / "test.sh"
    greet_test.write_text(greet_test.read_text() + "echo first > /logs/artifacts/first.txt\n")  # as the verifier
    outcome = await run(tmp_path, task, kind, "oracle")
    assert (outcome.termination_reason, outcome.reward) == (R.COMPLETED, 1.0), (outcome.error, outcome.events)
    (event,) = [e for e in outcome.events if e.startswith("healthcheck:")]  # once, at the start
    assert event.startswith("healthcheck:passed after 3"), event
    steps = Path(outcome.artifacts_dir) / "steps"
    assert (steps / "greet" / "artifacts" / "app" / "greet.sh").read_text() == "#!/bin/bash\necho hello\n"
    assert "${1:+ $1}" in (steps / "personalise" / "artifacts" / "app" / "greet.sh").read_text()
    for name in ("greet", "personalise"):
        published, entry = json.loads((steps / name / "artifacts" / "manifest.json").read_text())
        assert (published["source"], published["status"], entry["status"]) == ("/logs/artifacts", "ok", "ok")
    assert [p.name for p in (steps / "greet" / "artifacts" / "logs" / "artifacts").iterdir()] == ["first.txt"]
    assert [p.name for p in (steps / "personalise" / "artifacts" / "logs" / "artifacts").iterdir()] == ["marker"]


PUBLISH_AGENT = """\
echo from-agent > /logs/artifacts/agent.txt
mkdir -p /logs/artifacts/deep && echo nested > /logs/artifacts/deep/n.txt
ln -s /etc/passwd /logs/artifacts/passwd
"""
PUBLISH_TEST = """#!/bin/bash
cp /app/README.md /logs/artifacts/from-verifier.md
echo 1 > /logs/verifier/reward.txt
"""


async def test_harbors_publish_folder_is_writable_and_collected_after_the_verifier(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    """/logs/artifacts (Harbor mounts it in every trial): what the agent and the verifier write
    there lands in artifacts/logs/artifacts/, with no link out (swept before the verifier; a trial that writes nothing
    there and collects nothing else leaves no artifacts/ at all: the everyday tests' trials)."""
    toml = TOML.format(top="")
    task = make_task(tmp_path / "tasks", "publish", toml=toml, dockerfile=DOCKERFILE, test_sh=PUBLISH_TEST)
    outcome = await run(tmp_path, task, kind, "shell", PUBLISH_AGENT)
    assert (outcome.termination_reason, outcome.reward) == (R.COMPLETED, 1.0), (outcome.error, outcome.events)
    out = Path(outcome.artifacts_dir) / "artifacts"
    published = out / "logs" / "artifacts"
    assert (published / "agent.txt").read_text() == "from-agent\n"
    assert (published / "deep" / "n.txt").read_text() == "nested\n"
    assert (published / "from-verifier.md").read_text() == (task / "environment" / "README.md").read_text()
    assert not (published / "passwd").exists() and not host_passwd_in(out)
    (entry,) = json.loads((out / "manifest.json").read_text())
    assert entry["source"] == "/logs/artifacts" and entry["destination"] == "artifacts/logs/artifacts"
    assert entry["status"] == "ok" and entry["detail"] == "", entry
    # the link out was removed before the verifier ran (see the planted-link test below)
    assert "/logs/artifacts/passwd: a link or special file, removed before the verifier" in outcome.tamper_events
    assert "artifact:ok:/logs/artifacts" in outcome.events
    nop = await run(tmp_path, task, kind, "nop")  # another trial's folder starts empty
    assert nop.termination_reason == R.COMPLETED, nop.error
    nop_published = Path(nop.artifacts_dir) / "artifacts" / "logs" / "artifacts"
    assert sorted(p.name for p in nop_published.iterdir()) == ["from-verifier.md"]


PLANT = "ln -s /logs/verifier/reward.txt /logs/artifacts/report.txt\n"
# Scores 0, then publishes a report, as cookbook verifiers copy files into /logs/artifacts.
REPORT_TEST = """#!/bin/bash
echo 0 > /logs/verifier/reward.txt
echo 1 > /logs/artifacts/report.txt
"""


async def test_a_link_planted_in_the_publish_folder_never_carries_the_verifiers_write(
    tmp_path: Path, kind: dict[str, object]
) -> None:
    """The verifier may write in /logs/artifacts (Harbor's does); a link the agent left there
    would carry that write into the reward file. It is removed before the verifier, by name."""
    task = make_task(tmp_path / "tasks", "plant", toml=TOML.format(top=""), dockerfile=DOCKERFILE, test_sh=REPORT_TEST)
    outcome = await run(tmp_path, task, kind, "shell", PLANT)
    assert (outcome.termination_reason, outcome.reward) == (R.COMPLETED, 0.0), (outcome.error, outcome.events)
    assert "/logs/artifacts/report.txt: a link or special file, removed before the verifier" in outcome.tamper_events
    published = Path(outcome.artifacts_dir) / "artifacts" / "logs" / "artifacts"
    assert (published / "report.txt").read_text() == "1\n" and not (published / "report.txt").is_symlink()
