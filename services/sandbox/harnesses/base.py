"""The harness adapter interface. An adapter is small: it knows where setup
installed its harness, writes the harness's own config so it talks only to
the trial's proxy URL with the trial token, builds the command line, and
collects the harness's logs afterwards. It never patches the harness."""

from __future__ import annotations

import abc
import shutil
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import ClassVar

from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.task.model import Task


class ModelAccess(StrEnum):
    REQUIRED = "required"  # a model harness: no proxy, no trial
    OPTIONAL = "optional"  # gets the proxy URL when one is configured (shell scripts)
    NONE = "none"  # oracle, nop


@dataclass(frozen=True)
class AgentContext:
    """Everything an adapter may use. ``home`` and ``runtime`` are host paths
    mounted at ``paths.home`` (read-write) and ``paths.runtime`` (read-only)."""

    trial_id: str
    task: Task
    instruction: str
    model: str
    max_turns: int
    base_url: str | None
    token: str | None
    options: dict[str, str]
    paths: SandboxPaths
    home: Path
    runtime: Path

    @property
    def proxy_root(self) -> str | None:
        """The base URL without its ``/v1`` suffix (Anthropic SDKs append ``/v1`` themselves)."""
        if self.base_url is None:
            return None
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url


@dataclass
class AgentCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stdin: bytes | None = None
    # Host paths to copy into the sandbox before the agent phase.
    uploads: list[tuple[Path, PurePosixPath]] = field(default_factory=list)
    # Run in the sandbox (the agent's user, no network) before ``argv``; non-zero exit is
    # env_setup_failed (agent_extras.run_setup): e.g. installing the task's skills.
    setup: list[str] | None = None


class HarnessAdapter(abc.ABC):
    name: ClassVar[str]
    model_access: ClassVar[ModelAccess] = ModelAccess.REQUIRED

    def install_paths(self) -> list[Path]:
        """Host paths the harness needs, mounted read-only at the same place."""
        return []

    def check_installed(self) -> None:
        """Raises EnvSetupError naming what setup should have installed."""
        for path in self.install_paths():
            if not path.exists():
                raise EnvSetupError(
                    f"harness {self.name!r}: {path} not found; run `harnessrl harness install {self.name}` "
                    "(scripts/setup installs only the default harness and those its configs name)"
                )

    @abc.abstractmethod
    def prepare(self, ctx: AgentContext) -> AgentCommand:
        """Writes the harness's config under ``ctx.home``/``ctx.runtime`` and returns its command."""

    def collect_logs(self, ctx: AgentContext, dest: Path) -> None:
        """Copies the harness's own logs (session files, trajectories) from its HOME into ``dest``."""
        home = ctx.home.resolve()
        for rel in self.log_paths():
            src = ctx.home / rel
            # The agent owns HOME: a symlinked path could point at any host file.
            if not src.resolve().is_relative_to(home) or any(p.is_symlink() for p in (src, *src.parents)):
                continue
            if src.is_dir():
                shutil.copytree(src, dest / rel, symlinks=True, dirs_exist_ok=True)
            elif src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)

    def log_paths(self) -> list[str]:
        """HOME-relative paths of the harness's logs."""
        return []


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
