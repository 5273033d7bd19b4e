"""The variables of a task's compose file, as ``docker compose`` reads them: the ``.env``
file beside it, and ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:+alt}``,
``${VAR:?error}``, ``$VAR`` and ``$$`` in every value (``compose`` says which variables
are known: never the worker's own environment)."""

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
        return _variable(name, field, variables, fail)
    braced = _BRACED_RE.match(match.group(2))
    if braced is None:
        raise fail(field, f"invalid interpolation {match.group(0)!r}")
    name, op, arg = braced.group(1), braced.group(2), braced.group(3) or ""
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


def _variable(name: str, field: str, variables: dict[str, str], fail: Fail) -> str:
    if name not in variables:
        raise fail(
            field,
            f"variable {name} is set neither in environment/.env nor in [environment] env, and has no "
            "default (the worker's own environment is not read); give it a default: ${" + name + ":-value}",
        )
    return variables[name]
