"""A compose task on the Kubernetes backend, through its manifests (no cluster runs here):
each service is a container of the trial's pod, its names map to the pod's loopback,
its healthcheck gates the pod's readiness; what a pod cannot do is refused by field."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from services.sandbox.backends.base import Limits, Phase, SandboxSpec
from services.sandbox.backends.kubernetes_manifests import network_policy, pod_manifest
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import IntegrityPolicy, KubernetesBackendSettings
from services.sandbox.task.model import load_task
from tests.sandbox_support import DEFAULT_TOML, make_task

TOML = DEFAULT_TOML + 'docker_image = "registry/env:1"\nworkdir = "/work"\nenv = {{ MODE = "task" }}\n'
COMPOSE = """\
services:
  main:
    depends_on:
      kv: {condition: service_healthy}
    environment: {KV_URL: "http://kv:5000/", MODE: compose}
  kv:
    image: registry/kv:2
    entrypoint: ["python3"]
    command: ["/srv/server.py", "5000"]
    environment: [LEVEL=3]
    working_dir: /srv
    user: "1000:1000"
    healthcheck:
      test: curl -f http://localhost:5000/
      interval: 500ms
      timeout: 3s
      retries: 7
      start_period: 2s
  cache:
    image: registry/cache:1
    depends_on: [kv]
"""


def spec_for(tmp_path: Path, compose: str) -> SandboxSpec:
    root = make_task(tmp_path / "tasks", toml=TOML)
    (root / "environment" / "docker-compose.yaml").write_text(textwrap.dedent(compose))
    return SandboxSpec(
        trial_id="trial-c", task=load_task(root), dirs=TrialDirs(tmp_path / "t"), limits=Limits(memory_mb=512)
    )


def pod(spec: SandboxSpec) -> dict[str, Any]:
    return pod_manifest(spec, KubernetesBackendSettings(), IntegrityPolicy(), deadline_s=900, proxy=None, proxy_port=1)


def test_services_are_containers_of_the_trial_pod_reachable_by_name(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, COMPOSE)
    body = pod(spec)["spec"]
    by_name = {c["name"]: c for c in body["containers"]}
    assert list(by_name) == ["agent", "verifier", "helper", "svc-kv", "svc-cache"]
    assert body["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["main", "kv", "cache"]}]
    kv = by_name["svc-kv"]
    assert (kv["image"], kv["command"], kv["args"]) == ("registry/kv:2", ["python3"], ["/srv/server.py", "5000"])
    assert kv["env"] == [{"name": "LEVEL", "value": "3"}] and kv["workingDir"] == "/srv"
    assert kv["securityContext"]["runAsUser"] == 1000 and kv["securityContext"]["allowPrivilegeEscalation"] is False
    assert kv["readinessProbe"] == {
        "exec": {"command": ["/bin/sh", "-c", "curl -f http://localhost:5000/"]},
        "periodSeconds": 1,
        "timeoutSeconds": 3,
        "failureThreshold": 7,
        "initialDelaySeconds": 2,
    }
    assert "readinessProbe" not in by_name["svc-cache"] and "command" not in by_name["svc-cache"]
    # main's compose environment, under the task's own env, for the agent and the verifier alike.
    for name in ("agent", "verifier"):
        env = {e["name"]: e["value"] for e in by_name[name]["env"]}
        assert env == {"KV_URL": "http://kv:5000/", "MODE": "task"}
    # One pod, one NetworkPolicy: the services' egress is the agent phase's (nothing but the proxy).
    policy = network_policy(spec, Phase.AGENT, namespace="ns", proxy=None)
    assert policy["spec"]["egress"] == [] and policy["spec"]["podSelector"]["matchLabels"]
    assert (
        "hostAliases"
        not in pod(spec.model_copy(update={"task": spec.task.model_copy(update={"compose": None})}))["spec"]
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("image: registry/cache:1", "build: ."), "services.cache.build: the kubernetes backend runs prebuilt"),
        (('user: "1000:1000"', "user: postgres"), "services.kv.user: 'postgres': a pod runs a container as a numeric"),
        (("  cache:\n", "  Cache_1:\n"), "services.Cache_1: a pod's host alias and container name must be a DNS"),
        (
            ("depends_on: [kv]", "depends_on: {kv: {condition: service_completed_successfully}}"),
            "services.cache.depends_on.kv.condition: service_completed_successfully",
        ),
    ],
)
def test_what_a_pod_cannot_do_is_refused_naming_the_field(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    spec = spec_for(tmp_path, COMPOSE.replace(*change))
    with pytest.raises(EnvSetupError, match="environment/docker-compose.yaml: " + field.replace("(", r"\(")):
        pod(spec)
