"""The Kubernetes backend: no cluster can run here, so the pod manifest, the
network policies and the exec plans are what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.sandbox.backends.base import Limits, Phase, SandboxSpec
from services.sandbox.backends.kubernetes import dns_name, network_policy, orphan_selector, pod_manifest
from services.sandbox.errors import EnvSetupError
from services.sandbox.paths import TrialDirs
from services.sandbox.tasks import load_task
from tests.sandbox_support import DEFAULT_TOML, make_task


def sandbox_spec(tmp_path: Path, toml: str | None = None, **kw: object) -> SandboxSpec:
    task = load_task(make_task(tmp_path / "tasks", toml=toml))
    return SandboxSpec(
        trial_id="Trial_42.x",
        task=task,
        dirs=TrialDirs(tmp_path / "trial"),
        limits=Limits(memory_mb=1024, storage_mb=512, pids=128, cpus=1.5),
        **kw,  # type: ignore[arg-type]
    )


def test_kubernetes_pod_manifest(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, toml=DEFAULT_TOML + 'docker_image = "registry/env:1"\nworkdir = "/work"\n')
    pod = pod_manifest(spec, deadline_s=900, namespace="ns", run_id="run 7")
    assert pod["metadata"]["name"] == "hrl-trial-42-x"
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "harnessrl-sandbox",
        "harnessrl.io/trial": "hrl-trial-42-x",
        "harnessrl.io/run": "run-7",
    }
    body = pod["spec"]
    assert body["activeDeadlineSeconds"] == 900 and body["restartPolicy"] == "Never"
    assert body["automountServiceAccountToken"] is False
    (container,) = body["containers"]
    assert container["image"] == "registry/env:1" and container["workingDir"] == "/work"
    assert container["resources"]["limits"] == {"memory": "1024Mi", "ephemeral-storage": "512Mi", "cpu": "1.5"}
    sec = container["securityContext"]
    assert sec["runAsNonRoot"] and sec["runAsUser"] == 1000 and sec["capabilities"] == {"drop": ["ALL"]}
    assert not sec["allowPrivilegeEscalation"]
    assert orphan_selector() == "app.kubernetes.io/managed-by=harnessrl-sandbox"


def test_kubernetes_needs_a_prebuilt_image(tmp_path: Path) -> None:
    with pytest.raises(EnvSetupError, match="docker_image"):
        pod_manifest(sandbox_spec(tmp_path), deadline_s=60, namespace="ns")


def test_kubernetes_network_policies(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path)
    agent = network_policy(spec, Phase.AGENT, namespace="ns", proxy_port=4100)
    assert agent["spec"]["podSelector"] == {"matchLabels": {"harnessrl.io/trial": dns_name(spec.trial_id)}}
    assert agent["spec"]["policyTypes"] == ["Ingress", "Egress"] and agent["spec"]["ingress"] == []
    to_proxy = agent["spec"]["egress"][0]
    assert to_proxy["to"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "harnessrl-proxy"}}}]
    assert to_proxy["ports"] == [{"protocol": "TCP", "port": 4100}]
    assert network_policy(spec, Phase.VERIFY, namespace="ns", proxy_port=0)["spec"]["egress"] == []
    assert network_policy(spec, Phase.VERIFY, namespace="ns", proxy_port=0, public=True)["spec"]["egress"] == [{}]


def test_dns_names_are_valid() -> None:
    assert dns_name("A" * 100).startswith("hrl-a") and len(dns_name("A" * 100)) <= 63
    assert dns_name("x--") == "hrl-x"
