"""Harbor-format tasks, read natively.

A task is a directory::

    task.toml            schema 1.x: [task] [metadata] [verifier] [agent] [environment] [solution]
    instruction.md       what the agent is asked to do
    environment/         Dockerfile and its build context (or [environment] docker_image)
    tests/test.sh        writes /logs/verifier/reward.txt or reward.json
    solution/solve.sh    the oracle's solution

Every error names the task directory and the offending field. What each field
of Harbor's schema does here (supported, mapped differently, refused) is the
table in ``services.sandbox.task.harbor_fields``: a refused field fails loading by
name and why, never silently; a key Harbor's schema lacks is ignored, as Harbor
ignores it, with a warning naming it.
"""

from __future__ import annotations

import logging
import re
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harnessrl.config import format_validation_error
from services.sandbox.common.errors import TaskError
from services.sandbox.task import build_inputs, compose_env, harbor_fields
from services.sandbox.task import steps as task_steps
from services.sandbox.task.agent_extras import McpServer, check_servers, check_skills_dir, unreachable_servers
from services.sandbox.task.artifacts import ArtifactEntry, normalize_entries
from services.sandbox.task.compose import ComposeSpec, load_compose
from services.sandbox.task.healthcheck import Healthcheck

log = logging.getLogger(__name__)

SUPPORTED_SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class NetworkMode(StrEnum):
    """Harbor's per-phase network policy. ``allowlist`` needs an egress proxy,
    which the local backend treats as ``no-network`` (stricter, never looser)."""

    NO_NETWORK = "no-network"
    PUBLIC = "public"
    ALLOWLIST = "allowlist"


class _Section(BaseModel):
    # Keys Harbor's schema lacks are dropped with a warning before validation
    # (load_task); one that still gets here is ours to reject, not to ignore.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Author(_Section):
    name: str
    email: str | None = None


class PackageInfo(_Section):
    """``[task]``: the task's identity in a registry."""

    name: str = Field(description="org/name")
    version: str | None = None
    description: str = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _org_name(cls, v: str) -> str:
        if not _NAME_RE.match(v) or ".." in v:
            raise ValueError(f"must be 'org/name' (letters, digits, '.', '_', '-'), got {v!r}")
        return v


class PhaseNetwork(_Section):
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None

    @model_validator(mode="after")
    def _hosts_need_allowlist(self) -> PhaseNetwork:
        if self.allowed_hosts and self.network_mode != NetworkMode.ALLOWLIST:
            raise ValueError("allowed_hosts is only valid with network_mode = 'allowlist'")
        return self


class AgentConfig(PhaseNetwork):
    """``[agent]``."""

    timeout_sec: float | None = Field(default=None, gt=0)
    user: str | int | None = None


class VerifierConfig(PhaseNetwork):
    """``[verifier]``."""

    timeout_sec: float = Field(default=600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    # Refused values (separate environments, collect hooks) are refused by harbor_fields.
    environment_mode: Literal["shared", "separate"] | None = None
    environment: dict[str, Any] | None = None
    collect: list[dict[str, Any]] = Field(default_factory=list)


class EnvironmentConfig(PhaseNetwork):
    """``[environment]``."""

    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: str | None = None
    os: str = "linux"
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    storage_mb: int | None = Field(default=None, gt=0)
    gpus: int | None = Field(default=None, ge=0)
    gpu_types: list[str] | None = None
    tpu: dict[str, Any] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    skills_dir: str | None = None
    healthcheck: Healthcheck | None = None  # run before the agent: services.sandbox.trial.healthcheck
    mcp_servers: list[McpServer] = Field(default_factory=list)
    allow_internet: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_sizes(cls, data: Any) -> Any:
        # Harbor's deprecated memory = "2G" / storage = "10G" become memory_mb / storage_mb.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old in ("memory", "storage"):
            if old not in data:
                continue
            size = _size_mb(old, data.pop(old))
            new = f"{old}_mb"
            if data.get(new, size) != size:
                raise ValueError(f"{old} = {size} MB conflicts with {new} = {data[new]!r}")
            data[new] = size
        return data

    # skills_dir and mcp_servers: task_agent_extras says what they mean here.
    _skills_dir = field_validator("skills_dir")(check_skills_dir)
    _mcp_servers = field_validator("mcp_servers")(check_servers)

    @field_validator("os")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.lower()  # other values than linux are refused by harbor_fields

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"must be an absolute path, got {v!r}")
        return v

    @model_validator(mode="after")
    def _legacy_allow_internet(self) -> EnvironmentConfig:
        if self.allow_internet is not None and self.network_mode is None:
            mode = NetworkMode.PUBLIC if self.allow_internet else NetworkMode.NO_NETWORK
            object.__setattr__(self, "network_mode", mode)
        return self


class SolutionConfig(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class TaskConfig(_Section):
    """The whole ``task.toml``."""

    schema_version: str = "1.4"
    task: PackageInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = VerifierConfig()
    agent: AgentConfig = AgentConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    solution: SolutionConfig = SolutionConfig()
    source: str | None = None
    artifacts: list[ArtifactEntry] = Field(default_factory=list)  # collected: services.sandbox.trial.artifacts
    steps: list[task_steps.StepConfig] | None = None  # multi-step tasks: task_steps
    multi_step_reward_strategy: Literal["mean", "final"] | None = None
    _unique_steps = field_validator("steps")(task_steps.unique_names)

    @model_validator(mode="before")
    @classmethod
    def _version_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            data.setdefault("schema_version", data.pop("version"))
        return data

    _artifacts = field_validator("artifacts", mode="before")(normalize_entries)

    @field_validator("schema_version", mode="before")
    @classmethod
    def _known_version(cls, v: Any) -> str:
        text = str(v)
        if text not in SUPPORTED_SCHEMA_VERSIONS:
            raise ValueError(f"unknown schema version {text!r}; supported: {list(SUPPORTED_SCHEMA_VERSIONS)}")
        return text


class Task(BaseModel):
    """A parsed task directory."""

    model_config = ConfigDict(frozen=True)

    path: Path
    config: TaskConfig
    instruction: str
    warnings: tuple[str, ...] = ()  # what Harbor ignores and so does harnessrl, named
    steps: tuple[task_steps.Step, ...] = ()  # [[steps]], in order (then ``instruction`` is unused)
    solution_path: Path | None = None  # a step's solution/ (``for_step``); None: the task's
    compose: ComposeSpec | None = None  # environment/docker-compose.yaml's sidecars (``compose``)

    @property
    def task_id(self) -> str:
        """The registry name when the task has one, else the directory name."""
        return self.config.task.name if self.config.task else self.path.name

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def dockerfile(self) -> Path | None:
        path = self.environment_dir / "Dockerfile"
        return path if path.is_file() else None

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.solution_path or self.path / "solution"

    def for_step(self, step: task_steps.Step) -> Task:
        """The task as a step's agent phase sees it: the step's instruction and solution, the task's
        artifacts then the step's, and the step's healthcheck (the task's ran once, at setup)."""
        own = step.config
        env = self.config.environment.model_copy(update={"healthcheck": own.healthcheck})
        config = self.config.model_copy(
            update={"artifacts": [*self.config.artifacts, *own.artifacts], "environment": env}
        )
        return self.model_copy(
            update={"instruction": step.instruction, "solution_path": step.solution_dir, "config": config}
        )

    def build_inputs(self) -> build_inputs.BuildInputs:
        """Everything that decides the built environment, gathered once for the layer key and
        the local builder alike (``build_inputs``)."""
        env = self.config.environment
        main = self.compose.main_build if self.compose else None
        return build_inputs.gather(
            self.environment_dir, env.docker_image, env.workdir, env.env, dict(main.args) if main else None
        )

    def environment_hash(self) -> str:
        """sha256 of everything that decides the built environment (``build_inputs``), so a
        layer cache keyed by it is never stale."""
        return self.build_inputs().digest()


def load_task(path: str | Path) -> Task:
    """Parses a task directory; raises TaskError naming the task and field."""
    root = Path(path).expanduser()
    name = str(root)
    if not root.is_dir():
        raise TaskError(name, "not a directory")
    config, warnings = _load_config(root, name)
    steps, instruction = _load_steps(root, name, config) if config.steps else ((), _load_instruction(root, name))
    env = config.environment
    unreachable = unreachable_servers(root, env.mcp_servers)
    if unreachable:
        raise TaskError(name, "task.toml: " + "; ".join(unreachable))
    harbor = compose_env.harbor_variables(
        root.resolve() / "environment", docker_image=env.docker_image, cpus=env.cpus, memory_mb=env.memory_mb
    )
    compose = load_compose(root.resolve(), config.environment.env, harbor)
    main_build = compose is not None and compose.main_build is not None  # Harbor: a compose file may build main
    if env.docker_image is None and not (root / "environment" / "Dockerfile").is_file() and not main_build:
        raise TaskError(name, "missing environment/Dockerfile and no [environment] docker_image is set")
    for warning in warnings:
        log.warning("task %s: %s", name, warning)
    return Task(
        path=root.resolve(),
        config=config,
        instruction=instruction,
        warnings=tuple(warnings),
        steps=steps,
        compose=compose,
    )


def _load_steps(root: Path, name: str, config: TaskConfig) -> tuple[tuple[task_steps.Step, ...], str]:
    """Each step's instruction and tests, as Harbor reads them; the root instruction.md is unused."""
    try:
        return task_steps.load_steps(root, config.steps or []), ""
    except ValueError as e:
        raise TaskError(name, str(e)) from e


def _load_instruction(root: Path, name: str) -> str:
    instruction_file = root / "instruction.md"
    if not instruction_file.is_file():
        raise TaskError(name, "missing instruction.md")
    try:
        instruction = instruction_file.read_text()
    except UnicodeDecodeError as e:
        raise TaskError(name, f"instruction.md is not UTF-8: {e}") from e
    if not instruction.strip():
        raise TaskError(name, "instruction.md is empty")
    if not (root / "tests" / "test.sh").is_file():
        raise TaskError(name, "missing tests/test.sh (the verifier)")
    return instruction


def read_task_toml(root: Path, name: str) -> dict[str, Any]:
    """The parsed task.toml of ``root``; TaskError when missing or not TOML."""
    toml_file = root / "task.toml"
    if not toml_file.is_file():
        raise TaskError(name, "missing task.toml")
    try:
        return tomllib.loads(toml_file.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskError(name, f"task.toml is not valid TOML: {e}") from e


def harbor_keys(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Each harbor_fields.FIELDS path ``data`` sets, with its value, and the dotted keys
    Harbor's schema lacks. A section that is not a table is left to validation."""
    known: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in data.items():
        if key in harbor_fields.SECTIONS and isinstance(value, dict):
            for sub, sub_value in value.items():
                path = f"{key}.{sub}"
                if path in harbor_fields.FIELDS:
                    known[path] = sub_value
                else:
                    unknown.append(path)
        elif key in harbor_fields.FIELDS or key in harbor_fields.SECTIONS:
            known[key] = value
        else:
            unknown.append(key)
    return known, unknown


def refusals(root: Path, known: dict[str, Any]) -> list[str]:
    """Why the task at ``root`` cannot run as Harbor would run it: one line per field or file."""
    lines = []
    for path, value in known.items():
        why = harbor_fields.refusal(path, value) if path in harbor_fields.FIELDS else None
        if why is not None:
            lines.append(f"task.toml: {path}: {why}")
    lines += [f"{file}: {why}" for file, why in harbor_fields.file_refusals(root).items()]
    return lines


def _load_config(root: Path, name: str) -> tuple[TaskConfig, list[str]]:
    data = read_task_toml(root, name)
    known, unknown = harbor_keys(data)
    refused = refusals(root, known)
    if refused:
        raise TaskError(name, "; ".join(refused))
    for dotted in unknown:
        section, _, key = dotted.rpartition(".")
        if section:
            data[section] = {k: v for k, v in data[section].items() if k != key}
        else:
            del data[dotted]
    unknown += task_steps.drop_unknown_keys(data)  # inside [[steps]] tables, dropped there
    warnings = []
    if unknown:
        warnings.append(
            f"task.toml: unknown key(s) {', '.join(unknown)}: not in Harbor's task schema, ignored as Harbor "
            "ignores them (a misspelt field keeps its default)"
        )
    try:
        return TaskConfig.model_validate(data), warnings
    except ValidationError as e:
        raise TaskError(name, f"task.toml: {format_validation_error(e)}") from e


def _size_mb(field: str, value: Any) -> int:
    """Harbor's legacy sizes: '2G' (GiB), '512M', '2048K'."""
    text = value.strip().upper() if isinstance(value, str) else ""
    units = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    try:
        return int(float(text[:-1]) * units[text[-1:]])
    except (KeyError, ValueError):
        raise ValueError(f"{field} must be a size like '2G' or '512M', got {value!r}") from None
