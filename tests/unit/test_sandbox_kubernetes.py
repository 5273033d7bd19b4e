"""The Kubernetes backend: no cluster can run here, so the pod manifest and the
network policies are what is tested (the exec plans: test_sandbox_kubernetes_plans.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from services.sandbox.backends import kubernetes as kubernetes_backend_module
from services.sandbox.backends.base import Phase, SandboxSpec
from services.sandbox.backends.kubernetes_manifests import (
    ProxyTarget,
    dns_name,
    network_policy,
    orphan_selector,
    pod_manifest,
    proxy_target,
    volume_table,
)
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.common.settings import IntegrityPolicy, KubernetesBackendSettings, Settings
from tests.sandbox_support import DEFAULT_TOML, sandbox_spec

K8S_TOML = DEFAULT_TOML + 'docker_image = "registry/env:1"\nworkdir = "/work"\n'


def k8s(**kw: Any) -> KubernetesBackendSettings:
    return KubernetesBackendSettings(**kw)


def proxy(host: str = "harnessrl-proxy.harnessrl.svc", port: int = 8080) -> ProxyTarget:
    return ProxyTarget(host=host, port=port, target_port=9000, pod_labels={"app": "proxy"}, namespace="hrl")


def build_pod(spec: SandboxSpec, cfg: KubernetesBackendSettings | None = None, **kw: Any) -> dict[str, Any]:
    policy = kw.pop("policy", IntegrityPolicy())
    args: dict[str, Any] = {"deadline_s": 900, "proxy": proxy(), "proxy_port": 4100, **kw}
    return pod_manifest(spec, cfg or k8s(), policy, **args)


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"]["containers"]}


def mounts(container: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {m["mountPath"]: (m["name"], m.get("readOnly", False)) for m in container.get("volumeMounts", [])}


def test_kubernetes_pod_manifest(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, toml=K8S_TOML)
    pod = build_pod(spec, k8s(namespace="ns"), run_id="run 7")
    assert pod["metadata"]["name"] == "hrl-trial-42-x" and pod["metadata"]["namespace"] == "ns"
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "harnessrl-sandbox",
        "harnessrl.io/trial": "hrl-trial-42-x",
        "harnessrl.io/run": "run-7",
    }
    body = pod["spec"]
    assert body["activeDeadlineSeconds"] == 900 and body["restartPolicy"] == "Never"
    assert body["automountServiceAccountToken"] is False and body["enableServiceLinks"] is False
    agent = containers(pod)["agent"]
    assert agent["image"] == "registry/env:1" and agent["workingDir"] == "/work"
    assert agent["resources"]["limits"] == {"memory": "1024Mi", "ephemeral-storage": "512Mi", "cpu": "1.5"}
    assert orphan_selector() == "app.kubernetes.io/managed-by=harnessrl-sandbox"


def test_kubernetes_needs_a_prebuilt_image(tmp_path: Path) -> None:
    with pytest.raises(EnvSetupError, match="docker_image"):
        build_pod(sandbox_spec(tmp_path))


def test_kubernetes_network_policies(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path)
    agent = network_policy(spec, Phase.AGENT, namespace="ns", proxy=proxy())
    assert agent["spec"]["podSelector"] == {"matchLabels": {"harnessrl.io/trial": dns_name(spec.trial_id)}}
    assert agent["spec"]["policyTypes"] == ["Ingress", "Egress"] and agent["spec"]["ingress"] == []
    assert network_policy(spec, Phase.VERIFY, namespace="ns", proxy=proxy())["spec"]["egress"] == []
    assert network_policy(spec, Phase.VERIFY, namespace="ns", proxy=None, public=True)["spec"]["egress"] == [{}]


def test_dns_names_are_valid() -> None:
    assert dns_name("A" * 100).startswith("hrl-a") and len(dns_name("A" * 100)) <= 63
    assert dns_name("x--") == "hrl-x"


# -- the pod: identities, volumes, relay -------------------------------------------
def test_agent_and_verifier_are_different_identities(tmp_path: Path) -> None:
    pod = build_pod(sandbox_spec(tmp_path, toml=K8S_TOML))
    c = containers(pod)
    assert set(c) == {"agent", "verifier", "helper", "relay"}
    agent, verifier = c["agent"]["securityContext"], c["verifier"]["securityContext"]
    assert (agent["runAsUser"], agent["runAsGroup"]) == (1000, 1000)
    # Harbor's verifier: the image's USER, root for task images (verifier_uid's default).
    assert (verifier["runAsUser"], verifier["runAsNonRoot"]) == (0, False)
    assert verifier["capabilities"]["add"] == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"]
    assert not verifier["allowPrivilegeEscalation"] and not verifier["privileged"]
    for sec in (agent, c["relay"]["securityContext"]):
        assert sec["runAsNonRoot"] and not sec["allowPrivilegeEscalation"] and sec["capabilities"] == {"drop": ["ALL"]}
    helper = c["helper"]["securityContext"]
    assert helper["runAsUser"] == 0 and helper["capabilities"]["add"] == ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
    assert not helper["allowPrivilegeEscalation"] and not helper["privileged"]
    body = pod["spec"]
    assert body["shareProcessNamespace"] is False and body["automountServiceAccountToken"] is False
    assert not (body["hostNetwork"] or body["hostPID"] or body["hostIPC"])
    # Only the agent reserves the trial's quota; agent and verifier never run at once.
    assert c["agent"]["resources"]["requests"]["memory"] == "1024Mi"
    assert c["verifier"]["resources"]["limits"]["memory"] == "1024Mi"
    assert c["verifier"]["resources"]["requests"]["memory"] == "64Mi"


@pytest.mark.parametrize(
    ("user", "cfg", "uid"),
    [("", {}, 0), ("user = 'root'\n", {}, 0), ("user = 1001\n", {}, 1001), ("", {"verifier_uid": 2000}, 2000)],
)
def test_the_verifier_runs_as_the_tasks_user(tmp_path: Path, user: str, cfg: dict[str, Any], uid: int) -> None:
    toml = K8S_TOML.replace("[verifier]\n", "[verifier]\n" + user)
    verifier = containers(build_pod(sandbox_spec(tmp_path, toml=toml), k8s(**cfg)))["verifier"]["securityContext"]
    assert (verifier["runAsUser"], verifier["runAsNonRoot"]) == (uid, uid != 0)
    assert ("add" in verifier["capabilities"]) == (uid == 0)


@pytest.mark.parametrize(("user", "message"), [("'app'", "numeric uid only"), ("1000", "the agent's uid")])
def test_a_verifier_user_a_pod_cannot_be_is_refused(tmp_path: Path, user: str, message: str) -> None:
    spec = sandbox_spec(tmp_path, toml=K8S_TOML.replace("[verifier]\n", f"[verifier]\nuser = {user}\n"))
    with pytest.raises(EnvSetupError, match=message) as info:
        build_pod(spec)
    assert "[verifier] user" in str(info.value)


def test_the_agent_never_mounts_the_reward_dir_or_the_tests(tmp_path: Path) -> None:
    c = containers(build_pod(sandbox_spec(tmp_path, toml=K8S_TOML)))
    agent, verifier = mounts(c["agent"]), mounts(c["verifier"])
    assert "/logs/verifier" not in agent and "/tests" not in agent
    assert agent["/work"] == ("workspace", False) and agent["/logs/agent"] == ("agent-logs", False)
    assert agent["/run/harnessrl"] == ("runtime", True) and agent["/home/agent"] == ("agent-home", False)
    assert verifier["/logs/verifier"] == ("verifier-logs", False) and verifier["/logs/agent"] == ("agent-logs", True)
    assert verifier["/home/agent"] == ("verifier-home", False) and "/solution" not in verifier
    assert verifier["/work"] == ("workspace", False)
    # Harbor's publish folder: the agent's, never the verifier's (no sweep of planted links reaches it)
    assert agent["/logs/artifacts"] == ("artifacts", False) and "/logs/artifacts" not in verifier
    helper = mounts(c["helper"])
    assert {name for name, _ in helper.values()} == {v.name for v in volume_table(SandboxPaths(), IntegrityPolicy())}
    assert all(path.startswith("/hrl/") for path in helper)


def test_switching_a_defence_off_is_what_shows_the_agent_its_target(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, toml=K8S_TOML)
    open_reward = mounts(containers(build_pod(spec, policy=IntegrityPolicy(protect_reward_files=False)))["agent"])
    assert open_reward["/logs/verifier"] == ("verifier-logs", False)
    open_tests = mounts(containers(build_pod(spec, policy=IntegrityPolicy(hide_tests_and_solution=False)))["agent"])
    assert open_tests["/tests"] == ("tests", True)


def test_init_copies_the_image_workdir_into_the_workspace(tmp_path: Path) -> None:
    pod = build_pod(sandbox_spec(tmp_path, toml=K8S_TOML))
    (init,) = pod["spec"]["initContainers"]
    assert init["image"] == "registry/env:1" and init["securityContext"]["runAsUser"] == 0
    script = init["command"][2]
    assert "cp -a /work/. /hrl/workspace/" in script and "chown -R 1000:1000 /hrl/workspace" in script
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["workspace"] == {"name": "workspace", "emptyDir": {"sizeLimit": "512Mi"}}


def test_the_relay_listens_on_the_pod_loopback_and_dials_the_proxy(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, toml=K8S_TOML)
    relay = containers(build_pod(spec, k8s(relay_image="socat:pinned")))["relay"]
    assert relay["image"] == "socat:pinned" and relay["securityContext"]["readOnlyRootFilesystem"]
    assert relay["command"] == [
        "socat",
        "TCP-LISTEN:4100,bind=127.0.0.1,fork,reuseaddr",
        "TCP:harnessrl-proxy.harnessrl.svc:8080",
    ]
    assert "relay" not in containers(build_pod(spec, proxy=None))


def test_pod_options_from_settings(tmp_path: Path) -> None:
    cfg = k8s(
        namespace="rl",
        runtime_class_name="gvisor",
        node_selector={"pool": "sandbox"},
        image_pull_secrets=("regcred",),
        image_pull_policy="Always",
        helper_image="busybox:1.36",
    )
    pod = build_pod(sandbox_spec(tmp_path, toml=K8S_TOML), cfg)
    body = pod["spec"]
    assert pod["metadata"]["namespace"] == "rl" and body["runtimeClassName"] == "gvisor"
    assert body["nodeSelector"] == {"pool": "sandbox"} and body["imagePullSecrets"] == [{"name": "regcred"}]
    assert {c["imagePullPolicy"] for c in body["containers"]} == {"Always"}
    assert containers(pod)["helper"]["image"] == "busybox:1.36"


# -- harness runtime volumes ---------------------------------------------------------
def test_harness_installs_come_from_a_read_only_runtime_volume(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, toml=K8S_TOML, ro_mounts=(Path("/opt/tools/npm"), Path("/opt/tools/venvs/mini")))
    cfg = k8s(
        runtime_volumes=[
            {"name": "tools", "mount_path": "/opt/tools/", "source": {"persistentVolumeClaim": {"claimName": "t"}}}
        ]
    )
    pod = build_pod(spec, cfg)
    assert mounts(containers(pod)["agent"])["/opt/tools"] == ("rt-tools", True)
    assert "/opt/tools" not in mounts(containers(pod)["verifier"])
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["rt-tools"] == {"name": "rt-tools", "persistentVolumeClaim": {"claimName": "t", "readOnly": True}}


def test_a_harness_install_outside_every_runtime_volume_fails_setup_naming_it(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, toml=K8S_TOML, ro_mounts=(Path("/usr/local/lib/node"),))
    with pytest.raises(EnvSetupError, match=r"/usr/local/lib/node.*runtime_volumes"):
        build_pod(spec)


def test_a_workdir_over_a_reserved_path_is_refused(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, toml=DEFAULT_TOML + 'docker_image = "x:1"\nworkdir = "/logs"\n')
    with pytest.raises(EnvSetupError, match="reserves"):
        build_pod(spec)


# -- network ---------------------------------------------------------------------
def test_agent_egress_reaches_the_proxy_pods_and_dns_only_for_a_name(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path)
    egress = network_policy(spec, Phase.AGENT, namespace="ns", proxy=proxy())["spec"]["egress"]
    to_proxy, to_dns = egress
    assert to_proxy["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "hrl"}},
            "podSelector": {"matchLabels": {"app": "proxy"}},
        }
    ]
    assert to_proxy["ports"] == [{"protocol": "TCP", "port": 9000}]
    assert to_dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    assert {p["port"] for p in to_dns["ports"]} == {53}
    by_ip = network_policy(spec, Phase.AGENT, namespace="ns", proxy=proxy("10.0.0.7"))["spec"]["egress"]
    assert len(by_ip) == 1 and by_ip[0]["ports"] == [{"protocol": "TCP", "port": 9000}]
    assert network_policy(spec, Phase.AGENT, namespace="ns", proxy=None)["spec"]["egress"] == []
    assert network_policy(spec, Phase.AGENT, namespace="ns", proxy=proxy(), isolate=False)["spec"]["egress"] == [{}]


def test_proxy_target_from_settings_and_proxy_url() -> None:
    assert proxy_target(k8s(), None) is None
    from_url = proxy_target(k8s(), "http://harnessrl-proxy.rl.svc:8080/x")
    assert from_url is not None and (from_url.host, from_url.port, from_url.target_port) == (
        "harnessrl-proxy.rl.svc",
        8080,
        8080,
    )
    assert from_url.namespace == "harnessrl" and from_url.needs_dns
    given = proxy_target(k8s(proxy_address="10.1.2.3:80", proxy_target_port=8080, proxy_namespace="px"), "http://x:1")
    assert given is not None and (given.host, given.port, given.target_port, given.namespace) == (
        "10.1.2.3",
        80,
        8080,
        "px",
    )
    assert not given.needs_dns
    with pytest.raises(EnvSetupError, match=r"loopback.*proxy_address"):
        proxy_target(k8s(), "http://127.0.0.1:8080")


# -- settings ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"agent_uid": 1000, "verifier_uid": 1000}, "must differ"),
        ({"agent_uid": 0}, "greater than or equal to 1"),
        ({"namespace": "Bad_NS"}, "namespace"),
        ({"proxy_address": "proxy-without-port"}, "host:port"),
        ({"runtime_volumes": [{"name": "t", "mount_path": "rel", "source": {"hostPath": {"path": "/x"}}}]}, "absolute"),
        ({"runtime_volumes": [{"name": "t", "mount_path": "/t", "source": {"gitRepo": {}}}]}, "exactly one of"),
        (
            {
                "runtime_volumes": [
                    {"name": "t", "mount_path": "/a", "source": {"hostPath": {"path": "/a"}}},
                    {"name": "t", "mount_path": "/b", "source": {"hostPath": {"path": "/b"}}},
                ]
            },
            "duplicate name",
        ),
        ({"namespce": "typo"}, "namespce"),
    ],
)
def test_bad_kubernetes_settings_are_clear_errors(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings.model_validate({"work_dir": tmp_path, "kubernetes": fields})


def test_kubernetes_settings_defaults() -> None:
    cfg = Settings.model_validate({}).kubernetes
    assert cfg.namespace == "harnessrl" and cfg.agent_uid != cfg.verifier_uid and cfg.runtime_volumes == ()
    assert cfg.verifier_uid == 0
    assert "namespace" in (KubernetesBackendSettings.model_fields["namespace"].description or "").lower()


def test_kubernetes_squashes_and_passes_the_default_policy() -> None:
    source = Path(kubernetes_backend_module.__file__).read_text()
    assert "squashes_git_history=True" in source and "hides_verifier_files=True" in source
