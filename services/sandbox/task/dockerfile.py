"""A small Dockerfile parser: enough to replay a task's environment without a
container engine (the local backend) and to know which instructions it
cannot honour. Line continuations, comments, exec (JSON) and shell forms,
``ARG``/``ENV`` substitution of ``$VAR``/``${VAR}``/``${VAR:-default}``.

``DEFAULT_PATH`` is the one place Docker's default PATH is written down: the
local backend starts every layer's env from it, and the runner falls back to
it where a sandbox reports no PATH of its own."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

# Instructions that only describe the image (no files, no env): recorded, ignored.
METADATA_ONLY = frozenset({"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "MAINTAINER", "STOPSIGNAL", "HEALTHCHECK", "VOLUME"})
REPLAYED = frozenset({"FROM", "ARG", "ENV", "WORKDIR", "COPY", "ADD", "RUN", "USER"})

# Docker's PATH for an image whose config sets none (BuildKit writes it into the image config at
# FROM, so ``ENV PATH=/x:$PATH`` extends it and every RUN, and the container, sees it).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_VAR_RE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


class DockerfileError(ValueError):
    """A Dockerfile that cannot be parsed; the message names the line."""


@dataclass(frozen=True)
class Instruction:
    keyword: str
    # The raw argument text after the keyword (continuations joined).
    raw: str
    line: int
    # Flags such as --chown=1000 or --from=builder.
    flags: dict[str, str] = field(default_factory=dict)

    @property
    def is_exec_form(self) -> bool:
        return self.raw.lstrip().startswith("[")

    def exec_args(self) -> list[str]:
        try:
            value = json.loads(self.raw)
        except json.JSONDecodeError as e:
            raise DockerfileError(f"line {self.line}: {self.keyword} exec form is not valid JSON: {e}") from e
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DockerfileError(f"line {self.line}: {self.keyword} exec form must be a JSON list of strings")
        return value

    def describe(self) -> str:
        text = f"{self.keyword} {self.raw}".strip()
        return text if len(text) <= 80 else text[:77] + "..."


def parse(text: str) -> list[Instruction]:
    """Splits a Dockerfile into instructions (keywords upper-cased)."""
    instructions: list[Instruction] = []
    buffer: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped, like docker does
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1])
            continue
        buffer.append(stripped)
        instructions.append(_instruction(" ".join(part.strip() for part in buffer if part.strip()), start))
        buffer = []
    if buffer:
        instructions.append(_instruction(" ".join(buffer), start))
    return instructions


def _instruction(text: str, line: int) -> Instruction:
    if (
        "<<" in text
        and re.search(r"<<-?\s*['\"]?[A-Za-z_]+", text)
        and text.split(None, 1)[0].upper() in ("RUN", "COPY")
    ):
        raise DockerfileError(f"line {line}: heredocs are not supported")
    keyword, _, rest = text.partition(" ")
    flags: dict[str, str] = {}
    rest = rest.strip()
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        rest = rest.strip()
    return Instruction(keyword=keyword.upper(), raw=rest, line=line, flags=flags)


def substitute(text: str, variables: dict[str, str]) -> str:
    """Expands ``$VAR``, ``${VAR}`` and ``${VAR:-default}``; unknown variables expand to ''."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("plain")
        default = match.group("default")
        value = variables.get(name, "")
        return value if value or default is None else default

    return _VAR_RE.sub(replace, text)


def parse_env(raw: str, variables: dict[str, str], line: int) -> dict[str, str]:
    """``ENV A=1 B="two words"`` or the legacy ``ENV A value with spaces``."""
    try:
        tokens = shlex.split(raw, posix=True)
    except ValueError as e:
        raise DockerfileError(f"line {line}: ENV: {e}") from e
    if not tokens:
        raise DockerfileError(f"line {line}: ENV needs a value")
    if "=" not in tokens[0]:
        name, _, value = raw.partition(" ")
        return {name: substitute(value.strip(), variables)}
    out: dict[str, str] = {}
    for token in tokens:
        name, sep, value = token.partition("=")
        if not sep or not name:
            raise DockerfileError(f"line {line}: ENV expects NAME=value, got {token!r}")
        out[name] = substitute(value, {**variables, **out})
    return out


def copy_args(ins: Instruction, variables: dict[str, str]) -> tuple[list[str], str]:
    """Sources and destination of COPY/ADD in either form."""
    args = ins.exec_args() if ins.is_exec_form else shlex.split(ins.raw)
    args = [substitute(a, variables) for a in args]
    if len(args) < 2:
        raise DockerfileError(f"line {ins.line}: {ins.keyword} needs at least a source and a destination")
    return args[:-1], args[-1]
