"""Where things live inside a sandbox and on the worker's disk.

Inside every sandbox (all backends)::

    <workdir>              the task repo, read-write for the agent (default /app)
    /logs/agent/           the harness's logs, written during the agent phase
    /logs/artifacts/       Harbor's publish folder: what the agent, a step's setup or the
                           verifier writes here is collected into the trial's artifacts/
    /logs/verifier/        verify phase only: the verifier's output and the reward files
    /tests/                verify phase only: a fresh copy of the task's pristine tests
    /solution/             the oracle's agent phase only
    /run/harnessrl/        the trial's private runtime: proxy socket, forwarder, agent script
    /home/agent            a fresh HOME per phase

The reward files are ``/logs/verifier/reward.json`` (preferred, a JSON object with
a ``reward`` key or a single number) or ``/logs/verifier/reward.txt`` (one float).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_P = PurePosixPath


@dataclass(frozen=True)
class SandboxPaths:
    workdir: PurePosixPath = _P("/app")  # noqa: RUF009 - immutable value
    logs: PurePosixPath = _P("/logs")  # noqa: RUF009
    agent_logs: PurePosixPath = _P("/logs/agent")  # noqa: RUF009
    published: PurePosixPath = _P("/logs/artifacts")  # noqa: RUF009
    verifier_logs: PurePosixPath = _P("/logs/verifier")  # noqa: RUF009
    tests: PurePosixPath = _P("/tests")  # noqa: RUF009
    solution: PurePosixPath = _P("/solution")  # noqa: RUF009
    runtime: PurePosixPath = _P("/run/harnessrl")  # noqa: RUF009
    home: PurePosixPath = _P("/home/agent")  # noqa: RUF009
    reward_txt: PurePosixPath = _P("/logs/verifier/reward.txt")  # noqa: RUF009
    reward_json: PurePosixPath = _P("/logs/verifier/reward.json")  # noqa: RUF009

    @classmethod
    def for_workdir(cls, workdir: str | None) -> SandboxPaths:
        return cls(workdir=PurePosixPath(workdir)) if workdir else cls()


@dataclass(frozen=True)
class TrialDirs:
    """The worker-side directory of one trial attempt; removed at teardown
    unless the settings keep it (artifacts are copied out first)."""

    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def agent_logs(self) -> Path:
        return self.root / "logs" / "agent"

    @property
    def verifier_logs(self) -> Path:
        return self.root / "logs" / "verifier"

    @property
    def published(self) -> Path:
        """Behind /logs/artifacts, in every phase (Harbor's bind mount of the trial's folder)."""
        return self.root / "logs" / "artifacts"

    @property
    def tests(self) -> Path:
        return self.root / "tests"

    @property
    def solution(self) -> Path:
        return self.root / "solution"

    @property
    def runtime(self) -> Path:
        return self.root / "run"

    def home(self, phase: str) -> Path:
        return self.root / "home" / phase

    def create(self) -> TrialDirs:
        for path in (self.agent_logs, self.verifier_logs, self.published, self.runtime, self.root / "home"):
            path.mkdir(parents=True, exist_ok=True)
        return self
