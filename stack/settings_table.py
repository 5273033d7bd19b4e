"""The table of every service's environment variables and ports in
``docs/settings.md``, generated from the settings classes
(``services/*/settings.py`` or ``services/*/common/settings.py``, whose common fields come from
``harnessrl.config.ServiceSettings``) so that it cannot drift.

``scripts/settings_table`` prints it; ``--write [FILE]`` replaces what lies
between the marker comments; ``--check [FILE]`` exits 1 when they differ
(FILE defaults to ``docs/settings.md``).
Defaults under the harnessrl home are shown as ``$HARNESSRL_HOME/...`` and the
checkout as ``<checkout>``, so the output is the same on every machine."""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import json
import os
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from harnessrl import paths

BEGIN = "<!-- settings-table:begin -->"
END = "<!-- settings-table:end -->"
TARGET = paths.PROJECT_ROOT / "docs" / "settings.md"  # where the table lives; --write/--check default
REGENERATE = "scripts/settings_table --write docs/settings.md"
_HOME = "/HARNESSRL_HOME"  # stands for $HARNESSRL_HOME while defaults are computed


def service_settings() -> dict[str, type[BaseSettings]]:
    """``Settings`` of every ``services/<name>/settings.py`` (or ``services/<name>/common/settings.py``,
    where a service in layers keeps it on its ground floor), by service name."""
    found: dict[str, type[BaseSettings]] = {}
    root = paths.PROJECT_ROOT / "services"
    for path in sorted([*root.glob("*/settings.py"), *root.glob("*/common/settings.py")]):
        name = path.relative_to(root).parts[0]
        module = importlib.import_module(".".join(("services", *path.relative_to(root).with_suffix("").parts)))
        cls = getattr(module, "Settings", None)
        if isinstance(cls, type) and issubclass(cls, BaseSettings):
            found[name] = cls
    return found


@contextlib.contextmanager
def _neutral_env() -> Iterator[None]:
    """Defaults that read the environment (paths.home(), runs_dir()) computed machine-independently."""
    names = ("HARNESSRL_HOME", "HARNESSRL_RUNS_DIR", "HARNESSRL_TOOLS_DIR")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({"HARNESSRL_HOME": _HOME})
    for name in names[1:]:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def rows(cls: type[BaseModel], prefix: str, delimiter: str) -> Iterator[tuple[str, str, str, str]]:
    """(env var, type, default, description) of every field, nested tables flattened."""
    for name, info in cls.model_fields.items():
        env = f"{prefix}{name}".upper()
        nested = _nested_model(info.annotation)
        if nested is not None:
            yield from rows(nested, f"{prefix}{name}{delimiter}", delimiter)
            continue
        yield env, _type(info), _default(info), _cell(info.description or "")


def _type(info: FieldInfo) -> str:
    text = _annotation(info.annotation)
    bounds = []
    for meta in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if isinstance(meta, getattr(annotated_types, attr.capitalize())):
                bounds.append(f"{sign}{getattr(meta, attr)}")
        if getattr(meta, "pattern", None):
            bounds.append(f"pattern `{meta.pattern}`")
    return _cell(" ".join([text, *bounds]))


def _annotation(annotation: Any) -> str:
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(str(m.value) for m in annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_annotation(a) for a in args if a is not type(None)]
        return " | ".join(parts) + (" (optional)" if type(None) in args else "")
    if origin in (list, tuple, set, frozenset):
        return f"list of {_annotation(args[0])}" if args else "list"
    if origin is dict:
        return "table (JSON)"
    if isinstance(annotation, type):
        return "path" if issubclass(annotation, Path) else annotation.__name__
    return str(annotation)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        with _neutral_env():
            value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        value = value.replace(str(paths.PROJECT_ROOT), "<checkout>").replace(_HOME, "$HARNESSRL_HOME")
        return f"`{_cell(value)}`" if value else '`""`'
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, (tuple, list, dict)):
        text = json.dumps(list(value) if isinstance(value, tuple) else value)
        return f"`{_cell(text)}`" if len(text) <= 60 else f"`{_cell(text[:57])}...`"
    return f"`{_cell(str(value).lower() if isinstance(value, bool) else str(value))}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    """The markdown that goes between the markers of ``docs/settings.md``."""
    services = service_settings()
    out = [f"<!-- generated by scripts/settings_table from the settings classes; regenerate: {REGENERATE} -->", ""]
    out += ["| service | env prefix | ports (env var = default; 0 picks a free port) |", "| --- | --- | --- |"]
    tables: list[str] = []
    for name, cls in services.items():
        prefix = str(cls.model_config.get("env_prefix", ""))
        delimiter = str(cls.model_config.get("env_nested_delimiter") or "__")
        found = list(rows(cls, prefix, delimiter))
        ports = [
            f"`{env}` = {default}" for env, _, default, _ in found if env.endswith("PORT") and delimiter not in env
        ]
        out.append(f"| `{name}` | `{prefix}` | {'<br>'.join(ports) or '—'} |")
        tables += ["", f"#### `{name}`", "", "| env var | type | default | description |", "| --- | --- | --- | --- |"]
        tables += [f"| `{env}` | {kind} | {default} | {text} |" for env, kind, default, text in found]
    return "\n".join(out + tables) + "\n"


def splice(readme: str, table: str) -> str:
    """``readme`` with ``table`` between the markers; ValueError naming what is wrong."""
    begin, end = readme.find(BEGIN), readme.find(END)
    if begin < 0 or end < 0 or end < begin or readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ValueError(
            f"the file needs exactly one {BEGIN} and, after it, one {END} line around the settings table; "
            f"add them, then run {REGENERATE}"
        )
    return readme[: begin + len(BEGIN)] + "\n" + table + readme[end:]


def drift(readme: Path) -> str | None:
    """Why ``readme``'s table differs from the generator's output, or None."""
    text = readme.read_text()
    try:
        wanted = splice(text, render())
    except ValueError as e:
        return f"{readme}: {e}"
    if wanted != text:
        return f"{readme}: the settings table is out of date with the settings classes; run {REGENERATE}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/settings_table", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--write", type=Path, nargs="?", const=TARGET, metavar="FILE", help=f"Replace the table (default {TARGET})."
    )
    group.add_argument(
        "--check", type=Path, nargs="?", const=TARGET, metavar="FILE", help="Exit 1 when the table is out of date."
    )
    args = parser.parse_args(argv)
    if args.check is not None:
        problem = drift(args.check)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    if args.write is not None:
        try:
            args.write.write_text(splice(args.write.read_text(), render()))
        except (ValueError, OSError) as e:
            print(f"{args.write}: {e}", file=sys.stderr)
            return 2
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
