"""A task's environment/docker-compose.yaml read as Harbor runs it (services.sandbox.task.compose),
and what the Docker backend asks the engine for (docker_compose's specs): no engine needed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from services.sandbox.backends.base import Limits, SandboxSpec
from services.sandbox.backends.docker_compose import holder_spec, sidecar_spec
from services.sandbox.common.errors import TaskError
from services.sandbox.common.paths import TrialDirs
from services.sandbox.task.compose import load_compose
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task

GOOD = """\
services:
  main:
    depends_on:
      api:
        condition: service_healthy
    environment:
      API_URL: http://api:${API_PORT:-5000}
  api:
    build:
      context: ./api
      args: {GREETING: "${GREETING}"}
    expose: ["5000"]
    command: python3 /srv/server.py ${API_PORT:-5000}
    environment:
      - TOKEN=$$literal
      - MODE
    healthcheck:
      test: ["CMD", "python3", "-c", "print(1)"]
      interval: 500ms
      timeout: 1m30s
      retries: 5
  cache:
    image: python:3.11-slim
    depends_on: [api]
    entrypoint: ["python3", "-m", "http.server"]
    user: "1000"
"""


def task_with(tmp_path: Path, compose: str, *, toml: str | None = None, dotenv: str = "") -> Path:
    root = make_task(tmp_path, "c", toml=toml, context={"api/Dockerfile": "FROM python:3.11-slim\n"})
    (root / "environment" / "docker-compose.yaml").write_text(textwrap.dedent(compose))
    if dotenv:
        (root / "environment" / ".env").write_text(dotenv)
    return root


def test_a_compose_file_is_read_as_docker_compose_reads_it(tmp_path: Path) -> None:
    toml = '[task]\nname = "o/{name}"\n[environment]\nenv = {{ MODE = "fast" }}\n'
    root = task_with(tmp_path, GOOD, toml=toml, dotenv="# comment\nGREETING='hi there'\nMODE=slow\n")
    task = load_task(root)
    spec = task.compose
    assert spec is not None and [s.name for s in spec.services] == ["api", "cache"]
    assert spec.names == ["main", "api", "cache"]
    assert spec.main_depends_on == {"api": "service_healthy"}
    assert spec.main_environment == {"API_URL": "http://api:5000"}
    api, cache = spec.services
    assert api.build is not None and api.build.context == (root / "environment" / "api").resolve()
    assert api.build.args == {"GREETING": "hi there"}  # from .env
    assert api.command == ("python3", "/srv/server.py", "5000")
    assert api.environment == {"TOKEN": "$literal", "MODE": "fast"}  # [environment] env over .env
    assert api.healthcheck is not None and api.healthcheck.test == ("CMD", "python3", "-c", "print(1)")
    assert (api.healthcheck.interval_s, api.healthcheck.timeout_s, api.healthcheck.retries) == (0.5, 90.0, 5)
    assert cache.depends_on == {"api": "service_started"} and cache.image == "python:3.11-slim"
    assert cache.entrypoint == ("python3", "-m", "http.server") and cache.user == "1000"


def test_services_start_after_what_they_depend_on(tmp_path: Path) -> None:
    compose = """\
    services:
      web: {image: a, depends_on: {db: {condition: service_healthy}, queue: {condition: service_started}}}
      queue: {image: b, depends_on: [db]}
      db: {image: c, healthcheck: {test: "true"}}
    """
    spec = load_compose(task_with(tmp_path, compose))
    assert spec is not None and [s.name for s in spec.services] == ["db", "queue", "web"]
    assert spec.services[0].healthcheck is not None and spec.services[0].healthcheck.test == ("CMD-SHELL", "true")


@pytest.mark.parametrize(
    ("compose", "field", "why"),
    [
        ("services: [unclosed", "", "not valid YAML"),
        ("- a list\n", "", "must be a mapping"),
        ("version: '3'\n", "services", "at least one service"),
        (
            "services:\n  main: {environment: [AWS_KEY]}\n",
            "services.main.environment.AWS_KEY",
            "the worker's own is never passed into a sandbox",
        ),
        ("services:\n  main: {image: x}\n", "services.main.image", "main runs the task's own image"),
        ("services:\n  main: {command: [python, app.py]}\n", "services.main.command", "keep-alive"),
        ("services:\n  main: {deploy: {replicas: 2}}\n", "services.main.deploy", "set [environment] cpus"),
        (
            "services:\n  main: {deploy: {resources: {limits: {cpus: '${CPUS}'}}}}\n",
            "services.main.deploy",
            "Harbor's compose variable CPUS is set only where the task sets [environment] cpus",
        ),
        (
            "services:\n  main: {volumes: ['${HOST_VERIFIER_LOGS_PATH}:/logs/verifier']}\n",
            "services.main.volumes",
            "Harbor's compose variable HOST_VERIFIER_LOGS_PATH is a host folder",
        ),
        ("services:\n  api: {image: a, environment: ['C=${DOCKER_CONFIG:-x}']}\n", "api", "DOCKER_CONFIG is"),
        ("services:\n  api: {image: '${EGRESS_CONTROL_SIDECAR_IMAGE_NAME}'}\n", "api.image", "allowlist"),
        ("services:\n  api: {image: a, ports: ['80:80']}\n", "services.api.ports", "no published port"),
        ("services:\n  api: {image: a, privileged: true}\n", "services.api.privileged", "not supported"),
        ("services:\n  api: {image: a, volumes: ['/:/host']}\n", "services.api.volumes", "not supported"),
        ("services:\n  main: {networks: [n]}\n  api: {image: a}\n", "services.main.networks", "not supported"),
        ("services:\n  api: {image: a}\nnetworks: {n: {}}\n", "networks", "not supported"),
        ("services:\n  api: {build: {context: ../..}}\n", "services.api.build.context", "outside the task"),
        ("services:\n  api: {build: ./nope}\n", "services.api.build.context", "not a folder"),
        (
            "services:\n  api: {build: {context: ./api, dockerfile: ../../x}}\n",
            "services.api.build.dockerfile",
            "inside",
        ),
        ("services:\n  api: {command: x}\n", "services.api", "neither 'image' nor 'build'"),
        ("services:\n  api: {image: a, depends_on: [db]}\n", "services.api.depends_on", "'db' is not a service"),
        ("services:\n  a: {image: a, depends_on: [b]}\n  b: {image: b, depends_on: [a]}\n", "depends_on", "cycle"),
        ("services:\n  api: {image: '${NOPE}'}\n", "services.api.image", "variable NOPE is set neither"),
        ("services:\n  api: {image: '${NOPE:?give it}'}\n", "services.api.image", "NOPE is required: give it"),
        ("services:\n  api: {image: a, healthcheck: {test: x, interval: soon}}\n", "interval", "not a duration"),
        (
            "services:\n  api: {image: a, depends_on: {b: {required: false}}}\n  b: {image: b}\n",
            "services.api.depends_on.b.required",
            "an optional dependency is not supported",
        ),
        (
            "services:\n  api: {image: a, depends_on: {b: {condtion: x}}}\n  b: {image: b}\n",
            "services.api.depends_on.b.condtion",
            "not supported",
        ),
        (
            "services:\n  api: {image: a, depends_on: {b: {condition: up}}}\n  b: {image: b}\n",
            "services.api.depends_on.b.condition",
            "must be one of",
        ),
    ],
)
def test_malformed_or_unsupported_compose_is_refused_naming_file_and_field(
    tmp_path: Path, compose: str, field: str, why: str
) -> None:
    root = task_with(tmp_path, compose)
    with pytest.raises(TaskError) as info:
        load_task(root)
    message = str(info.value)
    assert "environment/docker-compose.yaml" in message and field in message and why in message, message


def test_engine_specs_share_one_namespace_with_the_names_mapped(tmp_path: Path) -> None:
    task = load_task(task_with(tmp_path, GOOD, dotenv="GREETING=x\nMODE=m\n"))
    assert task.compose is not None
    spec = SandboxSpec(trial_id="t1", task=task, dirs=TrialDirs(tmp_path / "t"), limits=Limits(memory_mb=300, pids=40))
    holder = holder_spec(spec, task.compose, "img", isolate_network=True)
    assert holder["network_mode"] == "none" and holder["cap_drop"] == ["ALL"]
    assert holder["extra_hosts"] == {"main": "127.0.0.1", "api": "127.0.0.1", "cache": "127.0.0.1"}
    assert holder["labels"]["io.harnessrl.trial"] == "t1" and "io.harnessrl.worker" in holder["labels"]
    api = sidecar_spec(spec, task.compose.services[0], "api-img", "container:abc")
    assert api["network_mode"] == "container:abc" and api["security_opt"] == ["no-new-privileges"]
    assert (api["mem_limit"], api["pids_limit"]) == ("300m", 40)
    assert api["healthcheck"]["interval"] == 500_000_000 and api["healthcheck"]["retries"] == 5
    assert api["labels"]["io.harnessrl.service"] == "api" and "privileged" not in api


def test_main_may_be_built_by_the_compose_file_and_stand_alone(tmp_path: Path) -> None:
    from services.sandbox.backends.docker_images import ImageStore, base_images, build_hash

    compose = "services:\n  main:\n    build: {context: .., dockerfile: img/Main.df, args: {V: '${V:-2}'}}\n"
    root = make_task(tmp_path, "m")
    (root / "environment" / "Dockerfile").unlink()
    (root / "img").mkdir()
    (root / "img" / "Main.df").write_text("ARG BASE=debian:bookworm-slim\nFROM $BASE\nCOPY tests/ /t/\n")
    (root / "environment" / "docker-compose.yaml").write_text(compose)
    task = load_task(root)  # no environment/Dockerfile: the compose file builds main, as Harbor allows
    assert task.compose is not None and task.compose.services == ()
    store = ImageStore(None, build_network="host", pull=False, cache_dir=tmp_path, engine="e")
    kwargs = store.build_kwargs(task, "tag")
    assert (kwargs["path"], kwargs["dockerfile"], kwargs["buildargs"]) == (
        str(root.resolve()),
        "img/Main.df",
        {"V": "2"},
    )
    assert base_images(task) == ["debian:bookworm-slim"]
    before = build_hash(task)
    (root / "img" / "extra.txt").write_text("changes the build context")
    assert build_hash(load_task(root)) != before, "the main build's whole context keys the image"


def test_dotenv_and_interpolation_forms(tmp_path: Path) -> None:
    compose = "services:\n  a:\n    image: 'x${TAG:+-$TAG}${EMPTY:-:d}${EMPTY-:e}'\n"
    spec = load_compose(task_with(tmp_path / "ok", compose, dotenv="export TAG=1\nEMPTY=\n"))
    assert spec is not None and spec.services[0].image == "x-1:d"
    with pytest.raises(TaskError, match=r"environment/.env: line 2: not KEY=VALUE: 'oops'"):
        load_compose(task_with(tmp_path / "bad", compose, dotenv="TAG=1\noops\n"))


# What Harbor's Terminal-Bench mapper writes for main (harbor 0.26, mappers/terminal_bench.py), plus a
# sidecar on main's own image and the variables of Harbor's log mounts.
HARBOR_MAIN = """\
services:
  main:
    build: {context: "${CONTEXT_DIR}"}
    image: ${MAIN_IMAGE_NAME}
    command: ["sh", "-c", "sleep infinity"]
    environment: ["TEST_DIR=${TEST_DIR}", "LOGS=${ENV_VERIFIER_LOGS_PATH}", "AGENT=${ENV_AGENT_LOGS_PATH}"]
    deploy: {resources: {limits: {cpus: "${CPUS}", memory: "${MEMORY}"}}}
  twin:
    image: ${MAIN_IMAGE_NAME}
    environment: ["OUT=${ENV_ARTIFACTS_PATH}"]
"""


def test_harbors_own_compose_variables_mean_the_same_here(tmp_path: Path) -> None:
    from services.sandbox.backends.kubernetes_compose import sidecars
    from services.sandbox.common.settings import KubernetesBackendSettings
    from services.sandbox.task import compose_env
    from tests.sandbox_support import DEFAULT_TOML

    root = task_with(tmp_path, HARBOR_MAIN, toml=DEFAULT_TOML + "cpus = 1.5\n")
    task = load_task(root)
    compose = task.compose
    assert compose is not None and compose.main_build is not None
    assert compose.main_build.context == (root / "environment").resolve()
    assert compose.main_environment == {"TEST_DIR": "/tests", "LOGS": "/logs/verifier", "AGENT": "/logs/agent"}
    twin = compose.services[0]
    assert twin.image == compose_env.MAIN_IMAGE and twin.environment == {"OUT": "/logs/artifacts"}
    # The sidecar on ${MAIN_IMAGE_NAME} runs the trial's own image, on docker and on kubernetes.
    spec = SandboxSpec(trial_id="t1", task=task, dirs=TrialDirs(tmp_path / "t"), limits=Limits(memory_mb=512))
    assert sidecar_spec(spec, twin, "sha256:trial", "container:x")["image"] == "sha256:trial"
    [pod_twin] = sidecars(spec, KubernetesBackendSettings(), "registry/env:1")
    assert pod_twin["image"] == "registry/env:1"
    # Without [environment] cpus, ${CPUS} is unset, as in Harbor: refused by name.
    bare = task_with(tmp_path / "b", HARBOR_MAIN)
    with pytest.raises(TaskError, match="variable CPUS is set neither"):
        load_task(bare)


def test_prebuilt_image_name_is_the_tasks_docker_image(tmp_path: Path) -> None:
    from tests.sandbox_support import DEFAULT_TOML

    compose = "services:\n  main: {image: '${PREBUILT_IMAGE_NAME}'}\n  side: {image: '${PREBUILT_IMAGE_NAME}'}\n"
    root = task_with(tmp_path, compose, toml=DEFAULT_TOML + 'docker_image = "registry/env:1"\n')
    task = load_task(root)
    assert task.compose is not None and task.compose.services[0].image == "registry/env:1"
    without = task_with(tmp_path / "n", compose)
    with pytest.raises(TaskError, match="variable PREBUILT_IMAGE_NAME is set neither"):
        load_task(without)
