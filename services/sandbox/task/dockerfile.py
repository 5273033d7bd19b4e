"""A small Dockerfile parser: enough to replay a task's environment without a
container engine (the local backend) and to know which instructions it
cannot honour. Line continuations, comments, exec (JSON) and shell forms,
``ARG``/``ENV`` substitution of ``$VAR``/``${VAR}``/``${VAR:-default}``, and
heredocs (Dockerfile 1.4: ``RUN <<EOF``, ``COPY <<EOF /path``, several in one
instruction, ``<<-``, quoted delimiters) as BuildKit's parser reads them: the body
lines follow the instruction up to a line that is the delimiter (after leading tabs
for ``<<-``), kept raw with each line's newline; what they mean is ``heredoc.py``.

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


# BuildKit's heredoc word (parser.ParseHeredoc): an optional fd, <<, an optional -, a name,
# quoted or not (quoted: the body is not expanded). Only RUN, COPY and ADD take heredocs.
_HEREDOC_RE = re.compile(r"^(\d*)<<(-?)(?:\"([^\"<]+)\"|'([^'<]+)'|([^\s\"'<]+))$")
HEREDOC_KEYWORDS = frozenset({"RUN", "COPY", "ADD"})


@dataclass(frozen=True)
class Heredoc:
    name: str
    content: str  # the body's lines, each with its newline, as written (tabs kept)
    chomp: bool  # <<-: leading tabs are stripped from each line (and the delimiter line)
    expand: bool  # the delimiter was not quoted

    @property
    def data(self) -> str:
        """The body as BuildKit uses it (ChompHeredocContent for <<-)."""
        if not self.chomp:
            return self.content
        return "".join(line.lstrip("\t") for line in self.content.splitlines(keepends=True))


def heredoc_word(word: str) -> tuple[str, bool, bool] | None:
    """(name, chomp, expand) when ``word`` is a heredoc marker, else None."""
    match = _HEREDOC_RE.match(word)
    if match is None:
        return None
    name = match.group(3) or match.group(4) or match.group(5)
    return name, match.group(2) == "-", match.group(5) is not None


def _heredoc_words(text: str) -> list[tuple[str, bool, bool]]:
    try:
        words = shlex.split(text, posix=False)
    except ValueError:
        words = text.split()
    return [found for word in words if (found := heredoc_word(word)) is not None]


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
    # RUN/COPY/ADD heredocs, in the order of their markers; ``end``: the last line of the
    # instruction and its bodies (the lines start..end of the Dockerfile are this instruction).
    heredocs: tuple[Heredoc, ...] = ()
    end: int = 0

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
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
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
        ins = _instruction(" ".join(part.strip() for part in buffer if part.strip()), start)
        buffer = []
        if ins.keyword in HEREDOC_KEYWORDS:
            bodies: list[Heredoc] = []
            for name, chomp, expand in _heredoc_words(ins.raw):
                content, number = _body(lines, number, name, chomp, start)
                bodies.append(Heredoc(name=name, content=content, chomp=chomp, expand=expand))
            ins = Instruction(ins.keyword, ins.raw, ins.line, ins.flags, tuple(bodies), number)
        else:
            ins = Instruction(ins.keyword, ins.raw, ins.line, ins.flags, (), number)
        instructions.append(ins)
    if buffer:
        ins = _instruction(" ".join(buffer), start)
        instructions.append(Instruction(ins.keyword, ins.raw, ins.line, ins.flags, (), len(lines)))
    return instructions


def _body(lines: list[str], number: int, name: str, chomp: bool, start: int) -> tuple[str, int]:
    """A heredoc's body from line index ``number`` on, and the index after its delimiter."""
    body: list[str] = []
    while number < len(lines):
        line = lines[number]
        number += 1
        if (line.lstrip("\t") if chomp else line) == name:
            return "".join(f"{b}\n" for b in body), number
        body.append(line)
    raise DockerfileError(f"line {start}: heredoc <<{name} is not terminated (no line {name!r} follows it)")


def _instruction(text: str, line: int) -> Instruction:
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
    """Sources and destination of COPY/ADD in either form; a heredoc's marker is not among the
    sources (its body is: ``heredoc.copy_files``)."""
    args = ins.exec_args() if ins.is_exec_form else shlex.split(ins.raw)
    heredocs = len(ins.heredocs)
    args = [substitute(a, variables) for a in args if not (ins.heredocs and heredoc_word(a))]
    if len(args) + heredocs < 2 or not args:
        raise DockerfileError(f"line {ins.line}: {ins.keyword} needs at least a source and a destination")
    return args[:-1], args[-1]
