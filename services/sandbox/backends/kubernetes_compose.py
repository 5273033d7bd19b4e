"""A compose task's services in the trial's pod (``services.sandbox.task.compose``): the
Kubernetes twin of ``docker_compose``. A pod's containers share one network
namespace, so each service is one more container of the pod, and ``hostAliases``
maps every service name (``main`` too) to 127.0.0.1: the agent and the verifier
reach the services by name, as in Harbor, and the pod's NetworkPolicy bounds
them all alike (the agent phase reaches only the proxy).

A service's healthcheck becomes its readinessProbe, so the pod is Ready (and the
agent starts) only once every service is healthy, as ``up --wait``. What a pod
cannot do is refused naming the field: a ``build`` (the backend runs prebuilt
images only), a user name (a pod's user is a number), a name that is no DNS
label, and ``service_completed_successfully`` (a pod's containers do not run to
completion before the others start).
"""

from __future__ import annotations

import math
import re
from typing import Any

from services.sandbox.backends.base import SandboxSpec
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.settings import KubernetesBackendSettings
from services.sandbox.task import compose_env
from services.sandbox.task.compose import COMPOSE_FILE, ComposeSpec, Healthcheck, Service

PREFIX = "svc-"
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def _refuse(spec: SandboxSpec, field: str, why: str) -> EnvSetupError:
    return EnvSetupError(f"task {spec.task.task_id}: {COMPOSE_FILE}: {field}: {why}")


def host_aliases(compose: ComposeSpec) -> list[dict[str, Any]]:
    return [{"ip": "127.0.0.1", "hostnames": compose.names}]


def main_environment(spec: SandboxSpec) -> dict[str, str]:
    """``main``'s compose environment, under the task's own env (as Harbor's overlays merge)."""
    compose = spec.task.compose
    return dict(compose.main_environment) if compose else {}


def sidecars(spec: SandboxSpec, cfg: KubernetesBackendSettings, main_image: str) -> list[dict[str, Any]]:
    """One container per service of the task (none without a compose file); a service whose
    image is ``${MAIN_IMAGE_NAME}`` (Harbor's name of main's image) runs ``main_image``."""
    compose = spec.task.compose
    if compose is None:
        return []
    for owner, deps in [("main", compose.main_depends_on), *((s.name, s.depends_on) for s in compose.services)]:
        for dep, condition in deps.items():
            if condition == "service_completed_successfully":
                raise _refuse(
                    spec,
                    f"services.{owner}.depends_on.{dep}.condition",
                    "service_completed_successfully: a pod's containers run together, none to completion first",
                )
    return [
        _container(spec, cfg, s.model_copy(update={"image": main_image}) if s.image == compose_env.MAIN_IMAGE else s)
        for s in compose.services
    ]


def _container(spec: SandboxSpec, cfg: KubernetesBackendSettings, service: Service) -> dict[str, Any]:
    field = f"services.{service.name}"
    if not _DNS_LABEL.match(service.name) or len(service.name) > 63 - len(PREFIX):
        raise _refuse(spec, field, "a pod's host alias and container name must be a DNS label ([a-z0-9-])")
    if service.build is not None or not service.image:
        raise _refuse(spec, f"{field}.build", "the kubernetes backend runs prebuilt images only: give it an image")
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if service.user is not None:
        uid, _, gid = service.user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise _refuse(spec, f"{field}.user", f"{service.user!r}: a pod runs a container as a numeric uid only")
        security |= {"runAsUser": int(uid), **({"runAsGroup": int(gid)} if gid else {})}
    limits = spec.limits
    container: dict[str, Any] = {
        "name": PREFIX + service.name,
        "image": service.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "env": [{"name": k, "value": v} for k, v in sorted(service.environment.items())],
        "resources": {
            "limits": {"memory": f"{limits.memory_mb}Mi"},
            "requests": {"memory": "32Mi", "cpu": "10m"},
        },
        "securityContext": security,
    }
    if service.entrypoint is not None:
        container["command"] = list(service.entrypoint)
    if service.command is not None:
        container["args"] = list(service.command)
    if service.working_dir:
        container["workingDir"] = service.working_dir
    if service.healthcheck is not None:
        container["readinessProbe"] = readiness_probe(service.healthcheck)
    return container


def readiness_probe(check: Healthcheck) -> dict[str, Any]:
    """A compose healthcheck as a probe (Kubernetes counts whole seconds, at least 1)."""
    kind, *words = check.test
    command = ["/bin/sh", "-c", words[0]] if kind == "CMD-SHELL" else words
    return {
        "exec": {"command": command},
        "periodSeconds": max(1, math.ceil(check.interval_s)),
        "timeoutSeconds": max(1, math.ceil(check.timeout_s)),
        "failureThreshold": check.retries,
        "initialDelaySeconds": math.ceil(check.start_period_s),
    }
