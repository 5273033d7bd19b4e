"""The Docker backend's image caches and their errors, on a real engine (the
session's private dockerd; a second one of this module's own where an engine
must go down): a prepared image is keyed by the workdir it squashed, a build by
the ids of the images it builds on, and an engine that fails is named as such."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import docker
import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox.backends.base import ExecRequest, Limits, Phase, SandboxSpec
from services.sandbox.backends.docker import DockerBackend
from services.sandbox.common.errors import ContainerEngineError, EnvSetupError
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import DockerBackendSettings, IntegrityPolicy
from services.sandbox.factory import create_backend
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import make_task, settings_for

GIT = "git -c user.name=t -c user.email=t@t"
# One image, two workspaces: /app (the image's WORKDIR) and /srv, whose history holds the
# fix. /srv is the sandbox user's already, so only its history stands between cheat and reward.
TWO_WORKSPACES = f"""\
FROM python:3.11-slim
COPY nonce /nonce
WORKDIR /srv
COPY repo/ /srv/
RUN git init -q -b main && git add -A && {GIT} commit -qm "the fix" \\
    && sed -i 's/a + b/a - b/' calc.py && {GIT} commit -qam "the bug" && chown -R 1000:1000 /srv
WORKDIR /app
"""
SRV_TEST = """\
#!/bin/bash
cd /srv
if python3 -c 'from calc import add; assert add(2, 3) == 5'; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
# The red-team suite's cheat: any blob of the history that holds the fix becomes calc.py.
HISTORY_CHEAT = """cd /srv
git cat-file --batch-all-objects --batch-check | awk '$2=="blob"{print $1}' | while read h; do
  if git cat-file -p "$h" | grep -q 'a + b'; then git cat-file -p "$h" > calc.py; fi
done"""
TOML = '[task]\nname = "t/{name}"\n[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 30\n[environment]\n'


def settings(tmp: Path, host: str, **policy: bool):
    return settings_for(
        tmp, IntegrityPolicy(**policy), backend="docker", docker=DockerBackendSettings(host=host, verify_network="none")
    )


async def run_trial(tmp: Path, host: str, task: Path, harness: str, script: str = "", **policy: bool):
    s = settings(tmp, host, **policy)
    spec = TrialSpec(
        trial_id=f"img-{uuid.uuid4().hex[:10]}",
        task_path=str(task),
        harness=harness,
        harness_options={"script": script} if script else {},
    )
    return await TrialRunner(s, create_backend(s)).run(spec)


async def test_a_second_workdir_on_one_image_gets_its_own_squashed_history(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    nonce = {"nonce": uuid.uuid4().hex}  # an image of this run only: nothing prepared it before
    context = {**nonce, "repo/calc.py": "def add(a, b):\n    return a + b\n"}
    first = make_task(tmp_path / "a", "app", toml=TOML, dockerfile=TWO_WORKSPACES, context=context)
    second = make_task(
        tmp_path / "b",
        "srv",
        toml=TOML + 'workdir = "/srv"\n',
        dockerfile=TWO_WORKSPACES,
        context=context,
        test_sh=SRV_TEST,
    )
    host = docker_engine.host
    done = await run_trial(tmp_path / "first", host, first, "nop")
    assert done.termination_reason == TerminationReason.COMPLETED, done.error
    defended = await run_trial(tmp_path / "on", host, second, "shell", HISTORY_CHEAT)
    assert defended.termination_reason == TerminationReason.COMPLETED, defended.error
    assert defended.reward == 0.0, "the second task's workspace kept the history that holds the fix"
    exposed = await run_trial(tmp_path / "off", host, second, "shell", HISTORY_CHEAT, squash_git_history=False)
    assert exposed.reward == 1.0, f"the cheat itself does not work: {exposed.error or exposed.verifier_summary}"
    # A third workdir, absent from the image: made, and given to the sandbox user, for this task too.
    third = make_task(
        tmp_path / "c", "work", toml=TOML + 'workdir = "/work"\n', dockerfile=TWO_WORKSPACES, context=context
    )
    backend = DockerBackend(settings(tmp_path / "third", host))
    box = await backend.start(sandbox_spec(backend, third, "third"))
    try:
        probe = ExecRequest(argv=["sh", "-c", "touch probe && stat -c %u ."], phase=Phase.AGENT, timeout_s=20)
        result = await backend.exec(box, probe)
    finally:
        await backend.stop(box)
    assert result.output.decode().strip() == "1000", result.output


def sandbox_spec(backend: DockerBackend, task: Path, name: str) -> SandboxSpec:
    return SandboxSpec(
        trial_id=f"{name}-{time.monotonic_ns() % 10**9}",
        task=load_task(task),
        dirs=TrialDirs(backend.settings.work_dir / name),
        limits=Limits(memory_mb=256, storage_mb=64, pids=64),
    )


def build_base(client: docker.DockerClient, ctx: Path, name: str, marker: str) -> str:
    ctx.mkdir(parents=True, exist_ok=True)
    (ctx / "Dockerfile").write_text("FROM debian:bookworm-slim\nCOPY marker /marker\n")
    (ctx / "marker").write_text(marker)
    image, _ = client.images.build(path=str(ctx), tag=name, network_mode="none", rm=True)
    return str(image.id)


async def marker_seen(backend: DockerBackend, task: Path, name: str) -> tuple[str, str]:
    """What /marker holds in a fresh sandbox of ``task``, and the image the sandbox ran."""
    box = await backend.start(sandbox_spec(backend, task, name))
    try:
        result = await backend.exec(box, ExecRequest(argv=["cat", "/marker"], phase=Phase.AGENT, timeout_s=20))
        return result.output.decode(), box.handle.image  # type: ignore[attr-defined]
    finally:
        await backend.stop(box)


async def test_a_base_image_replaced_under_its_name_is_built_on_again(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    client = docker.DockerClient(base_url=docker_engine.host)
    base = f"harnessrl-test/base-{uuid.uuid4().hex[:12]}:1"
    # The replaced image is only in a first stage, named through an ARG: both must count.
    dockerfile = f"ARG BASE={base}\nFROM ${{BASE}} AS base\nFROM debian:bookworm-slim\n"
    dockerfile += "COPY --from=base /marker /marker\nWORKDIR /app\n"
    task = make_task(tmp_path / "tasks", dockerfile=dockerfile)
    backend = DockerBackend(settings(tmp_path, docker_engine.host))
    try:
        old = build_base(client, tmp_path / "v1", base, "v1")
        assert (await marker_seen(backend, task, "one"))[0] == "v1"
        new = build_base(client, tmp_path / "v2", base, "v2")
        assert new != old, "the base image was replaced under the same name"
        seen, image = await marker_seen(backend, task, "two")
        assert seen == "v2", "the task kept running on its build of the old base image"
        again, same = await marker_seen(backend, task, "three")
        assert (again, same) == ("v2", image), "an unchanged base reuses the build and its preparation"
    finally:
        client.images.remove(base, force=True)
        client.close()


async def test_a_missing_image_is_named_as_missing(tmp_path: Path, docker_engine: DockerEngine) -> None:
    toml = '[task]\nname = "t/img"\n[environment]\ndocker_image = "harnessrl-test/absent:1"\n'
    task = load_task(make_task(tmp_path / "t", toml=toml, dockerfile=None))
    off = DockerBackendSettings(host=docker_engine.host, pull=False, verify_network="none")
    for backend, expected in (
        (DockerBackend(settings_for(tmp_path, backend="docker", docker=off)), "is not present and pulling is off"),
        # The engine answers: its registry lookup fails, and its answer is the message.
        (DockerBackend(settings(tmp_path, docker_engine.host)), r"could not be pulled: .*(registry|repository)"),
    ):
        with pytest.raises(EnvSetupError, match=expected) as caught:
            await backend.images.image_for(task, squash=True)
        assert not isinstance(caught.value, ContainerEngineError), caught.value


async def test_a_build_on_a_missing_base_image_names_it(tmp_path: Path, docker_engine: DockerEngine) -> None:
    """A Dockerfile whose FROM the engine lacks (and cannot pull) fails setup naming that image,
    not only the engine's registry error (the compose sidecar test checks the same for a sidecar)."""
    task = load_task(make_task(tmp_path / "t", dockerfile="FROM harnessrl-absent:3.12-slim\nWORKDIR /app\n"))
    backend = DockerBackend(settings(tmp_path, docker_engine.host))
    with pytest.raises(
        EnvSetupError, match=r"docker build failed: .*base image harnessrl-absent:3.12-slim: not present"
    ):
        await backend.images.image_for(task, squash=True)


async def test_an_engine_that_is_down_is_named_not_taken_for_a_missing_image(tmp_path: Path) -> None:
    prebuilt = make_task(tmp_path / "a", toml='[task]\nname = "t/a"\n[environment]\ndocker_image = "x:1"\n')
    built = make_task(tmp_path / "b")
    with DockerEngine() as engine:
        backend = DockerBackend(settings(tmp_path, engine.host))
        engine.stop()
        for task in (prebuilt, built):
            with pytest.raises(ContainerEngineError) as caught:
                await backend.images.image_for(load_task(task), squash=True)
            message = str(caught.value)
            assert f"Docker engine {engine.host} is unreachable" in message, message
            assert "could not be pulled" not in message and "build failed" not in message, message
        s = settings(tmp_path / "runner", engine.host)
        trial = TrialSpec(trial_id=f"down-{uuid.uuid4().hex[:8]}", task_path=str(built), harness="nop")
        outcome = await TrialRunner(s, backend).run(trial)
    assert outcome.termination_reason == TerminationReason.ENV_SETUP_FAILED and outcome.reward is None
    assert f"Docker engine {engine.host} is unreachable" in outcome.error, outcome.error
