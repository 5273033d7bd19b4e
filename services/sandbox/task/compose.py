"""A task's ``environment/docker-compose.yaml``, read as Harbor runs it.

Harbor merges the task's compose file over its own base, in which the service
``main`` is the task's environment (``environment/Dockerfile`` or ``[environment]
docker_image``, ``sleep infinity``); every other service is a sidecar started with
it and reachable by its service name. What is kept here:

- ``main``: ``depends_on`` (it starts once those conditions hold), ``environment``
  (under the task's env) and ``build`` (``context``, ``dockerfile``, ``args``: the
  image the docker backend builds for it; ``[environment] docker_image`` wins, as
  Harbor's prebuilt image does). Anything else of ``main`` is refused: its
  network and mounts are the sandbox's.
- each sidecar: ``image`` or ``build`` (``context`` relative to the compose file's
  folder, as ``docker compose`` resolves it, and inside the task; ``dockerfile``,
  ``args``), ``command``, ``entrypoint``, ``environment``, ``working_dir``, ``user``,
  ``healthcheck``, ``depends_on`` (service_started, service_healthy,
  service_completed_successfully), ``init``, ``expose`` (documentation: every service
  shares one loopback, so every port is reachable by name).
- ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``, ``$VAR``
  and ``$$`` are interpolated as ``docker compose`` does, from the ``.env`` file
  next to the compose file, then ``[environment] env``, then Harbor's own
  ``CONTEXT_DIR``. The worker's environment is not read (nothing of the host's
  reaches a sandbox): an unset variable without a default is refused by name.

Everything else (``ports``, ``networks``, ``network_mode``, ``volumes``,
``privileged``, ``cap_add``, top-level ``networks``/``volumes``/...) is refused
naming the file and the field: the services share the main container's network
namespace, with no bridge and no host mount (invariant 6).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from services.sandbox.common.errors import TaskError
from services.sandbox.task import compose_env

COMPOSE_FILE = "environment/docker-compose.yaml"
MAIN = "main"
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_TOP_KEYS = {"services", "version", "name"}
_MAIN_KEYS = {"depends_on", "environment", "build", "image", "command", "deploy"}
# Harbor's own keep-alive of main (its compose overlays, and the Terminal-Bench mapper's main service).
_KEEPALIVES = {("sh", "-c", "sleep infinity"), ("sleep", "infinity"), ("tail", "-f", "/dev/null")}
_SIDECAR_KEYS = {
    "image",
    "build",
    "command",
    "entrypoint",
    "environment",
    "working_dir",
    "user",
    "healthcheck",
    "depends_on",
    "init",
    "expose",
}
_BUILD_KEYS = {"context", "dockerfile", "args"}
_HEALTH_KEYS = {"test", "interval", "timeout", "retries", "start_period", "disable"}
# Keys refused for what the sandbox is: one network namespace, no bridge, no host mount, no privilege.
_ISOLATION = {
    "ports",
    "networks",
    "network_mode",
    "volumes",
    "volumes_from",
    "privileged",
    "cap_add",
    "devices",
    "hostname",
    "container_name",
    "extra_hosts",
    "dns",
    "pid",
    "ipc",
    "userns_mode",
    "security_opt",
    "configs",
    "secrets",
}
_WHY_ISOLATION = (
    "every service shares the main container's network namespace, with no bridge, no published port, no "
    "host mount and no extra privilege"
)


def _why_refused(key: str, allowed: set[str]) -> str:
    why = f" ({_WHY_ISOLATION})" if key in _ISOLATION else ""
    return f"not supported{why}; supported keys: {', '.join(sorted(allowed))}"


class Healthcheck(BaseModel):
    """A service's healthcheck, in the engine's form (``test``: ["CMD", ...] or ["CMD-SHELL", s])."""

    model_config = ConfigDict(frozen=True)

    test: tuple[str, ...]
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0


class Build(BaseModel):
    model_config = ConfigDict(frozen=True)

    context: Path  # absolute, inside the task
    dockerfile: str = "Dockerfile"  # relative to the context
    args: dict[str, str] = {}


class Service(BaseModel):
    """One sidecar of the task."""

    model_config = ConfigDict(frozen=True)

    name: str
    image: str | None = None
    build: Build | None = None
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    environment: dict[str, str] = {}
    working_dir: str | None = None
    user: str | None = None
    healthcheck: Healthcheck | None = None
    depends_on: dict[str, str] = {}
    init: bool | None = None


class ComposeSpec(BaseModel):
    """The sidecars in start order (each after what it depends on) and ``main``'s overrides."""

    model_config = ConfigDict(frozen=True)

    services: tuple[Service, ...]
    main_depends_on: dict[str, str] = {}
    main_environment: dict[str, str] = {}
    # main's build, where the file overrides Harbor's (context environment/, its Dockerfile).
    main_build: Build | None = None

    @property
    def names(self) -> list[str]:
        """Every name the task's processes may reach: ``main`` and each sidecar."""
        return [MAIN, *(s.name for s in self.services)]


def load_compose(
    task_root: Path, task_env: dict[str, str] | None = None, harbor: dict[str, str] | None = None
) -> ComposeSpec | None:
    """The task's compose file, or None without one; TaskError naming file and field.
    ``harbor``: Harbor's own compose variables (``compose_env.harbor_variables``)."""
    path = task_root / COMPOSE_FILE
    if not path.exists():
        return None
    return _Reader(task_root, path, task_env or {}, harbor or {}).read()


class _Reader:
    def __init__(self, task_root: Path, path: Path, task_env: dict[str, str], harbor: dict[str, str]) -> None:
        self.root, self.path, self.task_env, self.harbor = task_root, path, task_env, harbor
        dotenv = compose_env.read_dotenv(path.parent / ".env", task_root)
        # Harbor's own variables win over the task's, as in Harbor (merge_compose_env).
        self.variables = {**dotenv, **task_env, "CONTEXT_DIR": str(path.parent.resolve()), **harbor}

    def fail(self, field: str, why: str) -> TaskError:
        where = f"{COMPOSE_FILE}: {field}: " if field else f"{COMPOSE_FILE}: "
        return TaskError(str(self.root), where + why)

    # -- reading -------------------------------------------------------------------------
    def read(self) -> ComposeSpec:
        import yaml

        try:
            data = yaml.safe_load(self.path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise self.fail("", f"not valid YAML: {e}") from e
        if not isinstance(data, dict):
            raise self.fail("", "must be a mapping with 'services'")
        data = self.interpolate(data, "")
        extra = sorted(k for k in data if k not in _TOP_KEYS and not str(k).startswith("x-"))
        if extra:
            raise self.fail(str(extra[0]), _why_refused(str(extra[0]), _TOP_KEYS))
        services = data.get("services")
        if not isinstance(services, dict) or not services:
            raise self.fail("services", "must be a mapping of at least one service")
        main: dict[str, Any] = {}
        sidecars: dict[str, Service] = {}
        for name, body in services.items():
            field = f"services.{name}"
            if not isinstance(name, str) or not _NAME_RE.match(name):
                raise self.fail(field, "a service name is letters, digits, '_', '.', '-'")
            if body is None:
                body = {}
            if not isinstance(body, dict):
                raise self.fail(field, "must be a mapping")
            if name == MAIN:
                self._check_keys(field, body, _MAIN_KEYS)
                self.check_main(field, body)
                main = body
            else:
                sidecars[name] = self.service(name, body)
        main_deps = self.depends_on(f"services.{MAIN}.depends_on", main.get("depends_on"))
        for owner, deps in [(MAIN, main_deps), *((s.name, s.depends_on) for s in sidecars.values())]:
            for dep in deps:
                if dep not in sidecars:
                    raise self.fail(f"services.{owner}.depends_on", f"{dep!r} is not a service of this file")
        return ComposeSpec(
            services=tuple(sidecars[n] for n in _start_order(sidecars, self)),
            main_depends_on=main_deps,
            main_environment=self.environment(f"services.{MAIN}.environment", main.get("environment")),
            main_build=self.build(f"services.{MAIN}.build", main["build"]) if "build" in main else None,
        )

    def check_main(self, field: str, body: dict[str, Any]) -> None:
        """main's ``image``, ``command`` and ``deploy`` as Harbor's own compose files and its
        Terminal-Bench mapper write them (``${MAIN_IMAGE_NAME}``, ``sleep infinity``, limits of
        ``${CPUS}``/``${MEMORY}``) say what the sandbox does anyway: kept; anything else would
        change main and is refused naming the field."""
        image = body.get("image")
        if image is not None and image not in (compose_env.MAIN_IMAGE, self.harbor.get("PREBUILT_IMAGE_NAME")):
            raise self.fail(
                f"{field}.image",
                f"{image!r}: main runs the task's own image (environment/Dockerfile, or [environment] "
                "docker_image for a prebuilt one); only ${MAIN_IMAGE_NAME} or ${PREBUILT_IMAGE_NAME} may be named here",
            )
        if "command" in body and self.argv(f"{field}.command", body["command"]) not in _KEEPALIVES:
            raise self.fail(
                f"{field}.command",
                "main's process is the sandbox's own keep-alive (Harbor's 'sleep infinity'); another command is "
                "not supported: start a server in a sidecar or from the task's healthcheck",
            )
        deploy = body.get("deploy")
        if deploy is not None:
            resources = deploy.get("resources") if isinstance(deploy, dict) else None
            limits = resources.get("limits") if isinstance(resources, dict) else None
            want = {"cpus": self.harbor.get("CPUS"), "memory": self.harbor.get("MEMORY")}
            only_limits = set(deploy) == {"resources"} and isinstance(resources, dict) and set(resources) == {"limits"}
            if not (only_limits and isinstance(limits, dict)) or any(
                k not in want or str(v) != want[k] for k, v in limits.items()
            ):
                raise self.fail(
                    f"{field}.deploy",
                    "only resources.limits of ${CPUS} and ${MEMORY} (the task's own cpus and memory_mb, which "
                    "the sandbox applies anyway) are supported; set [environment] cpus and memory_mb instead",
                )

    def _check_keys(self, field: str, body: dict[str, Any], allowed: set[str]) -> None:
        for key in body:
            if key not in allowed and not str(key).startswith("x-"):
                raise self.fail(f"{field}.{key}", _why_refused(str(key), allowed))

    def service(self, name: str, body: dict[str, Any]) -> Service:
        field = f"services.{name}"
        self._check_keys(field, body, _SIDECAR_KEYS)
        build = self.build(f"{field}.build", body["build"]) if "build" in body else None
        image = body.get("image")
        if image is not None and not isinstance(image, str):
            raise self.fail(f"{field}.image", "must be a string")
        if build is None and not image:
            raise self.fail(field, "has neither 'image' nor 'build'")
        init = body.get("init")
        if init is not None and not isinstance(init, bool):
            raise self.fail(f"{field}.init", "must be true or false")
        for key in ("working_dir", "user"):
            if body.get(key) is not None and not isinstance(body[key], (str, int)):
                raise self.fail(f"{field}.{key}", "must be a string")
        expose = body.get("expose", [])
        if not isinstance(expose, list):
            raise self.fail(f"{field}.expose", "must be a list of ports")
        return Service(
            name=name,
            image=image or None,
            build=build,
            command=self.argv(f"{field}.command", body.get("command")),
            entrypoint=self.argv(f"{field}.entrypoint", body.get("entrypoint")),
            environment=self.environment(f"{field}.environment", body.get("environment")),
            working_dir=None if body.get("working_dir") is None else str(body["working_dir"]),
            user=None if body.get("user") is None else str(body["user"]),
            healthcheck=self.healthcheck(f"{field}.healthcheck", body.get("healthcheck")),
            depends_on=self.depends_on(f"{field}.depends_on", body.get("depends_on")),
            init=init,
        )

    def build(self, field: str, value: Any) -> Build:
        if isinstance(value, str):
            value = {"context": value}
        if not isinstance(value, dict):
            raise self.fail(field, "must be a path or a mapping with 'context'")
        self._check_keys(field, value, _BUILD_KEYS)
        context_text = value.get("context", ".")
        if not isinstance(context_text, str) or "://" in context_text or context_text.startswith("git@"):
            raise self.fail(f"{field}.context", "must be a folder of the task (a remote context is not supported)")
        context = (self.path.parent / context_text).resolve()
        if not context.is_relative_to(self.root.resolve()):
            raise self.fail(f"{field}.context", f"{context_text!r} is outside the task directory")
        if not context.is_dir():
            raise self.fail(f"{field}.context", f"{context_text!r} is not a folder")
        dockerfile = value.get("dockerfile", "Dockerfile")
        if not isinstance(dockerfile, str) or not (context / dockerfile).resolve().is_relative_to(context):
            raise self.fail(f"{field}.dockerfile", f"{dockerfile!r} must be a file inside the build context")
        if not (context / dockerfile).is_file():
            raise self.fail(f"{field}.dockerfile", f"{dockerfile!r} does not exist in {context_text!r}")
        args = self.environment(f"{field}.args", value.get("args"))
        return Build(context=context, dockerfile=dockerfile, args=args)

    def argv(self, field: str, value: Any) -> tuple[str, ...] | None:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as e:
                raise self.fail(field, f"cannot be split into words: {e}") from e
        if isinstance(value, list) and all(isinstance(w, (str, int, float)) for w in value):
            return tuple(str(w) for w in value)
        raise self.fail(field, "must be a string or a list of strings")

    def environment(self, field: str, value: Any) -> dict[str, str]:
        """A list of ``K=V`` (a bare ``K`` takes the variable of that name: refused when unset,
        since compose would read it from the worker's environment) or a mapping (a null value likewise)."""
        if value is None:
            return {}
        pairs: list[tuple[str, Any]] = []
        if isinstance(value, list):
            for item in value:
                if not isinstance(item, str):
                    raise self.fail(field, f"{item!r} is not 'KEY=VALUE'")
                key, sep, val = item.partition("=")
                pairs.append((key, val if sep else None))
        elif isinstance(value, dict):
            pairs = [(str(k), v) for k, v in value.items()]
        else:
            raise self.fail(field, "must be a list of 'KEY=VALUE' or a mapping")
        out: dict[str, str] = {}
        for key, val in pairs:
            if not key:
                raise self.fail(field, "an empty variable name")
            if val is None:
                if key not in self.variables:
                    raise self.fail(
                        f"{field}.{key}",
                        "takes its value from the environment, and the worker's own is never passed into a "
                        "sandbox; set it in [environment] env or environment/.env",
                    )
                out[key] = self.variables[key]
                continue
            if isinstance(val, (dict, list)):
                raise self.fail(f"{field}.{key}", "must be a string, a number or a boolean")
            out[key] = str(val).lower() if isinstance(val, bool) else str(val)
        return out

    def healthcheck(self, field: str, value: Any) -> Healthcheck | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(field, "must be a mapping")
        self._check_keys(field, value, _HEALTH_KEYS)
        if value.get("disable") is True:
            return None
        test = value.get("test")
        if isinstance(test, str):
            words: tuple[str, ...] = ("CMD-SHELL", test)
        elif isinstance(test, list) and test and all(isinstance(w, str) for w in test):
            words = tuple(test)
            if words[0] == "NONE":
                return None
            if words[0] not in ("CMD", "CMD-SHELL") or len(words) < 2:
                raise self.fail(f"{field}.test", "a list must start with CMD, CMD-SHELL or NONE and name a command")
        else:
            raise self.fail(f"{field}.test", "must be a string or a list")
        retries = value.get("retries", 3)
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 1:
            raise self.fail(f"{field}.retries", "must be a positive integer")
        return Healthcheck(
            test=words,
            interval_s=self.duration(f"{field}.interval", value.get("interval", "30s")),
            timeout_s=self.duration(f"{field}.timeout", value.get("timeout", "30s")),
            retries=retries,
            start_period_s=self.duration(f"{field}.start_period", value.get("start_period", "0s")),
        )

    def duration(self, field: str, value: Any) -> float:
        """Compose's durations: '1m30s', '500ms', '2s' (a bare number is seconds)."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        text = str(value).strip()
        parts = _DURATION_RE.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise self.fail(field, f"{value!r} is not a duration like '2s', '500ms' or '1m30s'")
        return sum(float(n) * _UNITS[u] for n, u in parts)

    def depends_on(self, field: str, value: Any) -> dict[str, str]:
        if value is None:
            return {}
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return dict.fromkeys(value, "service_started")
        if not isinstance(value, dict):
            raise self.fail(field, "must be a list of services or a mapping of service to condition")
        out: dict[str, str] = {}
        for name, spec in value.items():
            if isinstance(spec, dict):
                # restart (restart when the dependency restarts): nothing restarts during a trial.
                self._check_keys(f"{field}.{name}", spec, {"condition", "required", "restart"})
                if spec.get("required", True) is not True:
                    raise self.fail(f"{field}.{name}.required", "an optional dependency is not supported")
            condition = (spec or {}).get("condition", "service_started") if isinstance(spec, dict) else None
            if condition not in CONDITIONS:
                raise self.fail(f"{field}.{name}.condition", f"must be one of {list(CONDITIONS)}, got {condition!r}")
            out[str(name)] = condition
        return out

    def interpolate(self, value: Any, field: str) -> Any:
        return compose_env.interpolate(value, field, self.variables, self.fail)


def _start_order(services: dict[str, Service], reader: _Reader) -> list[str]:
    """Each service after everything it depends on; a cycle is refused."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise reader.fail(f"services.{name}.depends_on", f"a dependency cycle: {cycle}")
        state[name] = "visiting"
        for dep in services[name].depends_on:
            visit(dep, [*path, name])
        state[name] = "done"
        order.append(name)

    for name in services:
        visit(name, [])
    return order
