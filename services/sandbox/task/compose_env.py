"""The variables of a task's compose file, as ``docker compose`` reads them: the ``.env``
file beside it, and ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:+alt}``,
``${VAR:?error}``, ``$VAR`` and ``$$`` in every value (``compose`` says which variables
are known: never the worker's own environment).

Harbor's docker environment puts variables of its own in compose's environment
(``ComposeInfraEnvVars`` and the log mounts' variables, harbor 0.26), and real tasks
use them (``image: ${MAIN_IMAGE_NAME}``). ``harbor_variables`` defines each with the
value that means the same thing here, on every backend; ``REFUSED`` names those that
have no meaning here, and using one fails naming it and why."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.sandbox.common.errors import TaskError

_VAR_RE = re.compile(r"\$(?:(\$)|\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_BRACED_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?$", re.S)
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
Fail = Callable[[str, str], Exception]

# The value of ${MAIN_IMAGE_NAME}: a name, not an image of any engine. Harbor tags the image it
# builds for ``main`` with it; here it stands for "the trial's own image" wherever it is used
# (main's ``image``, or a sidecar's: the backend runs that sidecar on the trial's image).
MAIN_IMAGE = "harnessrl-main-image"
# Where a sandbox has Harbor's log folders (as Harbor's ENV_*_PATH: the mount targets).
LOG_DIRS = {"VERIFIER_LOGS": "/logs/verifier", "AGENT_LOGS": "/logs/agent", "ARTIFACTS": "/logs/artifacts"}
_HOST_MOUNT = (
    "is a host folder that Harbor bind-mounts into main; no host folder is mounted into a sandbox here "
    "(invariant 6: the logs are copied out by the worker), so a compose file cannot name one"
)
REFUSED = {
    **{f"HOST_{name}_PATH": _HOST_MOUNT for name in LOG_DIRS},
    "DOCKER_CONFIG": "is the host's Docker credential folder, which no sandbox or build may read",
    "EGRESS_CONTROL_SIDECAR_IMAGE_NAME": "belongs to Harbor's allowlist egress sidecar; network_mode 'allowlist' "
    "is refused (no backend has an egress proxy)",
    "EGRESS_CONTROL_INITIAL_NETWORK_MODE": "belongs to Harbor's allowlist egress sidecar, which is refused",
    "EGRESS_CONTROL_INITIAL_ALLOWED_HOSTS": "belongs to Harbor's allowlist egress sidecar, which is refused",
    "HARBOR_CONTAINER_NAME": "names Harbor's Windows container; [environment] os 'windows' is refused",
}


# Harbor's variables that it sets only where the task sets what they stand for.
UNSET_UNLESS = {
    "PREBUILT_IMAGE_NAME": "[environment] docker_image",
    "CPUS": "[environment] cpus",
    "MEMORY": "[environment] memory_mb",
}


def harbor_variables(
    compose_dir: Path, *, docker_image: str | None, cpus: float | None, memory_mb: int | None
) -> dict[str, str]:
    """Harbor's compose variables with their meaning here (docs/harbor.md lists each). Like
    Harbor's, they win over environment/.env and [environment] env; PREBUILT_IMAGE_NAME,
    CPUS and MEMORY are set only where the task sets what they stand for, as in Harbor."""
    out = {"MAIN_IMAGE_NAME": MAIN_IMAGE, "CONTEXT_DIR": str(compose_dir.resolve()), "TEST_DIR": "/tests"}
    out |= {f"ENV_{name}_PATH": path for name, path in LOG_DIRS.items()}
    if docker_image:
        out["PREBUILT_IMAGE_NAME"] = docker_image
    if cpus is not None:
        out["CPUS"] = f"{cpus:g}"
    if memory_mb is not None:
        out["MEMORY"] = f"{memory_mb}M"
    return out


def read_dotenv(path: Path, task_root: Path) -> dict[str, str]:
    """``path`` (a compose file's ``.env``) as KEY=VALUE lines; {} when absent."""
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not _KEY_RE.match(key.strip()):
            raise TaskError(str(task_root), f"environment/.env: line {n}: not KEY=VALUE: {line!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def interpolate(value: Any, field: str, variables: dict[str, str], fail: Fail) -> Any:
    """``value`` (a parsed YAML tree) with every variable substituted; ``fail(field, why)`` on error."""
    if isinstance(value, str):
        return _VAR_RE.sub(lambda m: _substitute(m, field, variables, fail), value)
    if isinstance(value, dict):
        return {k: interpolate(v, f"{field}.{k}" if field else str(k), variables, fail) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, field, variables, fail) for v in value]
    return value


def _substitute(match: re.Match[str], field: str, variables: dict[str, str], fail: Fail) -> str:
    if match.group(1):
        return "$"
    name = match.group(3)
    if name is not None:
        _refuse_harbors(name, field, fail)
        return _variable(name, field, variables, fail)
    braced = _BRACED_RE.match(match.group(2))
    if braced is None:
        raise fail(field, f"invalid interpolation {match.group(0)!r}")
    name, op, arg = braced.group(1), braced.group(2), braced.group(3) or ""
    _refuse_harbors(name, field, fail)
    value = variables.get(name)
    empty = value is None or (op is not None and op.startswith(":") and value == "")
    if op in ("-", ":-"):  # a default or an alternative is itself interpolated, as compose does
        return interpolate(arg, field, variables, fail) if empty else str(value)
    if op in ("+", ":+"):
        return "" if empty else interpolate(arg, field, variables, fail)
    if op in ("?", ":?"):
        if empty:
            raise fail(field, f"variable {name} is required: {arg or 'unset'}")
        return str(value)
    return _variable(name, field, variables, fail)


def _refuse_harbors(name: str, field: str, fail: Fail) -> None:
    """Harbor always sets these itself (its own values win over the task's), so a task that
    names one means Harbor's meaning, which has none here: refused whatever the task defines."""
    if name in REFUSED:
        raise fail(field, f"Harbor's compose variable {name} {REFUSED[name]}")


def _variable(name: str, field: str, variables: dict[str, str], fail: Fail) -> str:
    if name not in variables and name in UNSET_UNLESS:
        raise fail(
            field,
            f"variable {name} is set neither in environment/.env nor in [environment] env: Harbor's compose "
            f"variable {name} is set only where the task sets {UNSET_UNLESS[name]}, as in Harbor",
        )
    if name not in variables:
        raise fail(
            field,
            f"variable {name} is set neither in environment/.env nor in [environment] env, and has no "
            "default (the worker's own environment is not read); give it a default: ${" + name + ":-value}",
        )
    return variables[name]
