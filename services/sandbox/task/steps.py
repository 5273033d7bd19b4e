"""Harbor's multi-step tasks (``[[steps]]``, task schema 1.1 and later), read and scored
as Harbor 0.26 does (``models/task/config.py`` StepConfig, ``models/task/paths.py``,
``trial/multi_step.py``, ``trial/trial.py``).

Layout::

    task.toml             [[steps]] name = "..." (in order), multi_step_reward_strategy
    steps/NAME/instruction.md    the step's instruction (required; the root instruction.md is unused)
    steps/NAME/tests/            overlaid on tests/ for the step's verify; its test.sh, else tests/test.sh
    steps/NAME/solution/         the oracle's solve.sh for the step, else solution/

Steps run in order in one sandbox; each is an agent phase (the step's instruction) then a
verify phase (the step's tests). After a step, the rest are skipped when its verifier gave
no result, or when ``min_reward`` is set and a gated key is below it (missing: -inf). The
trial's rewards combine the steps that ran: ``mean`` (Harbor's default), per key, over the
steps with a result, a missing key counting 0; ``final``, the last step's as they are.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.sandbox.task.artifacts import ArtifactEntry, normalize_entries
from services.sandbox.task.healthcheck import Healthcheck

STRATEGIES = ("mean", "final")
# A step's folder: ``workdir/`` is uploaded into the working directory before its agent, and
# ``workdir/setup.sh`` (a reserved name) runs then (trial/step_setup.py runs them).
WORKDIR = "workdir"
SETUP = "setup.sh"
_INVALID = set('<>:"/\\|?*') | {chr(c) for c in range(0x20)} | {"\x7f"}
_DEVICES = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"} | {f"{p}{n}" for p in ("COM", "LPT") for n in "123456789"}

# Keys of a step Harbor's StepConfig has, and those of its agent/verifier tables.
_STEP_KEYS = {"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"}
_AGENT_KEYS = {"timeout_sec", "user", "network_mode", "allowed_hosts"}
_VERIFIER_KEYS = {"timeout_sec", "env", "user", "network_mode", "allowed_hosts", "environment_mode", "environment"}
_VERIFIER_KEYS |= {"collect"}

# A step's fields that cannot run here yet, and why (a set value is refused by name).
REFUSED: dict[str, str] = {
    "agent.user": "every agent phase runs as the sandbox user 'agent' (uid 1000); remove it",
    "verifier.allowed_hosts": "only with network_mode = 'allowlist', which no backend here enforces (no egress proxy)",
    "verifier.environment_mode": "only the shared verifier is supported: the step verifies in the trial's sandbox",
    "verifier.environment": "a separate verifier environment is not supported yet",
    "verifier.collect": "[[verifier.collect]] hooks run in compose services, which steps do not support yet",
}


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepAgent(_Table):
    timeout_sec: float | None = Field(default=None, gt=0)
    user: str | int | None = None
    network_mode: str | None = None  # the agent reaches only the model proxy, as in single-step tasks
    allowed_hosts: list[str] | None = None


class StepVerifier(_Table):
    # Harbor's StepConfig reuses VerifierConfig: unset, a step's verifier timeout is 600 s,
    # not the task's [verifier] timeout_sec (Harbor 0.26 reads step.verifier.timeout_sec first).
    timeout_sec: float = Field(default=600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    # Over [verifier] network_mode (then [environment]'s), as Harbor; 'allowlist' is refused.
    network_mode: Literal["no-network", "public", "allowlist"] | None = None
    allowed_hosts: list[str] | None = None
    environment_mode: str | None = None
    environment: dict[str, Any] | None = None
    collect: list[dict[str, Any]] = Field(default_factory=list)


class StepConfig(_Table):
    """One ``[[steps]]`` table."""

    name: str
    agent: StepAgent = StepAgent()
    verifier: StepVerifier = StepVerifier()
    min_reward: float | dict[str, float] | None = None
    # Run before the step's agent, after the task's (``healthcheck``), as Harbor.
    healthcheck: Healthcheck | None = None
    # Collected after the step's agent with the task's (``artifacts``), into steps/NAME/artifacts/.
    artifacts: list[ArtifactEntry] = Field(default_factory=list)
    _artifacts = field_validator("artifacts", mode="before")(normalize_entries)

    @field_validator("name")
    @classmethod
    def _portable(cls, name: str) -> str:
        bad = (
            not name.strip()
            or name in (".", "..")
            or name.endswith((".", " "))
            or any(c in _INVALID for c in name)
            or name.partition(".")[0].rstrip(" ").upper() in _DEVICES
        )
        if bad:
            raise ValueError(
                f"invalid step name {name!r}: a portable directory name under steps/ (no path separators, "
                "control or reserved characters, device names, trailing dots or spaces)"
            )
        if len(name.encode()) > 255:
            raise ValueError("a step name is at most 255 UTF-8 bytes")
        return name


class Step(BaseModel):
    """A step as it runs: its config and the files Harbor reads for it."""

    model_config = ConfigDict(frozen=True)

    config: StepConfig
    instruction: str
    tests_dirs: tuple[Path, ...]  # overlaid in this order into /tests for the step's verify
    solution_dir: Path  # the oracle's: steps/NAME/solution, else the task's solution/

    @property
    def name(self) -> str:
        return self.config.name


class StepOutcome(BaseModel):
    """What one step of a multi-step trial did (``TrialOutcome.steps``)."""

    name: str
    # Every value the step's verifier wrote; {} when it gave no result.
    rewards: dict[str, float] = Field(default_factory=dict)
    verified: bool = False
    harness_exit_code: int = 0
    agent_timed_out: bool = False
    agent_s: float = 0.0
    verify_s: float = 0.0
    error: str = ""


def _key(name: str) -> str:
    return unicodedata.normalize("NFC", name).casefold()


def drop_unknown_keys(data: dict[str, Any]) -> list[str]:
    """Removes from each ``[[steps]]`` table of ``data`` the keys Harbor's StepConfig lacks
    (Harbor ignores them) and returns them dotted, for a warning. A malformed ``steps`` is
    left to validation."""
    steps, unknown = data.get("steps"), []
    if not isinstance(steps, list):
        return []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        for key in sorted(set(step) - _STEP_KEYS):
            unknown.append(f"steps[{i}].{key}")
            del step[key]
        for table, known in (("agent", _AGENT_KEYS), ("verifier", _VERIFIER_KEYS)):
            sub = step.get(table)
            if isinstance(sub, dict):
                for key in sorted(set(sub) - known):
                    unknown.append(f"steps[{i}].{table}.{key}")
                    step[table] = {k: v for k, v in sub.items() if k != key}
                    sub = step[table]
    return unknown


def refusal(steps: Any) -> str | None:
    """Why the ``steps`` value of a task.toml cannot run here (each refused field of each step
    by name), or None. Duplicate names are refused by validation."""
    if not isinstance(steps, list):
        return None
    lines = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        for dotted, why in REFUSED.items():
            table, _, key = dotted.rpartition(".")
            holder = step.get(table) if table else step
            if isinstance(holder, dict) and holder.get(key) not in (None, "", [], {}):
                lines.append(f"steps[{i}].{dotted}: {why}")
        verifier = step.get("verifier")
        if isinstance(verifier, dict) and verifier.get("network_mode") == "allowlist":
            lines.append(
                f"steps[{i}].verifier.network_mode: 'allowlist' is not supported: no backend here has an egress "
                "proxy to enforce allowed_hosts; use 'public' or 'no-network'"
            )
    return "; ".join(lines) or None


def unique_names(steps: list[StepConfig] | None) -> list[StepConfig] | None:
    """Harbor's rule: names unique, including case and Unicode normalization variants."""
    seen: set[str] = set()
    for i, step in enumerate(steps or []):
        if _key(step.name) in seen:
            raise ValueError(f"steps[{i}].name {step.name!r} is not unique (case and Unicode variants count)")
        seen.add(_key(step.name))
    return steps


def load_steps(root: Path, configs: list[StepConfig]) -> tuple[Step, ...]:
    """Each step's files, as Harbor resolves them; ValueError naming the file or field."""
    steps, root = [], root.resolve()
    for i, cfg in enumerate(configs):
        rel = f"steps/{cfg.name}"
        step_dir = root / "steps" / cfg.name
        if not step_dir.resolve().is_relative_to(root):
            raise ValueError(f"{rel}: steps[{i}].name leads out of the task directory")
        if not step_dir.is_dir():
            raise ValueError(f"{rel}/: missing (the directory of steps[{i}].name = {cfg.name!r})")
        try:
            instruction = (step_dir / "instruction.md").read_text()
        except FileNotFoundError:
            raise ValueError(f"{rel}/instruction.md: missing (steps[{i}]'s instruction)") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{rel}/instruction.md: not UTF-8: {e}") from None
        if not instruction.strip():
            raise ValueError(f"{rel}/instruction.md: empty (steps[{i}]'s instruction)")
        check_workdir(step_dir, rel)  # uploaded, its setup.sh run, before the step's agent
        shared, own = root / "tests", step_dir / "tests"
        tests_dirs = tuple(d for d in (shared, own) if d.is_dir())
        # The step's test.sh, overlaid on the shared tests/, else the shared one: /tests/test.sh.
        if not (own / "test.sh").is_file() and not (shared / "test.sh").is_file():
            raise ValueError(f"{rel}/tests/test.sh: missing, and no shared tests/test.sh (steps[{i}]'s verifier)")
        own_solution = step_dir / "solution"
        if own_solution.is_dir() and not (own_solution / "solve.sh").is_file():
            raise ValueError(f"{rel}/solution/solve.sh: missing (the oracle's solution of steps[{i}])")
        solution = own_solution if own_solution.is_dir() else root / "solution"
        steps.append(Step(config=cfg, instruction=instruction, tests_dirs=tests_dirs, solution_dir=solution))
    return tuple(steps)


def min_reward_failure(rewards: dict[str, float] | None, min_reward: float | dict[str, float] | None) -> str | None:
    """Harbor's early stop: why the steps after this one are skipped, or None. A float gates
    'reward'; a table gates each key; a missing result or key is -inf."""
    if min_reward is None:
        return None
    gates = {"reward": min_reward} if isinstance(min_reward, int | float) else min_reward
    for key, threshold in gates.items():
        actual = (rewards or {}).get(key, -math.inf)
        if actual < threshold:
            return f"{key}={actual} is below min_reward {threshold}"
    return None


def combine(strategy: Literal["mean", "final"] | None, results: Sequence[dict[str, float] | None]) -> dict[str, float]:
    """The trial's rewards from those of the steps that ran (in order; None: no result).
    ``final``: the last step's; ``mean`` (unset too): per key over the steps with a result,
    a missing key counting 0. {} when nothing is left (no reward)."""
    if strategy == "final":
        return dict(results[-1] or {}) if results else {}
    valid = [r for r in results if r is not None]
    keys = sorted({k for r in valid for k in r})
    return {k: math.fsum(r.get(k, 0.0) for r in valid) / len(valid) for k in keys}


def check_workdir(step_dir: Path, rel: str) -> None:
    """Load time: ``steps/NAME/workdir/`` is a directory of plain files and directories
    (ValueError naming the file)."""
    workdir = step_dir / WORKDIR
    if not workdir.exists() and not workdir.is_symlink():
        return
    if workdir.is_symlink() or not workdir.is_dir():
        raise ValueError(f"{rel}/{WORKDIR}: must be a directory (the files uploaded to the working directory)")
    for path in sorted(workdir.rglob("*")):
        name = f"{rel}/{path.relative_to(step_dir).as_posix()}"
        if path.is_symlink():
            raise ValueError(f"{name}: a link in a step's workdir/ is not supported; put the file itself there")
        if not (path.is_file() or path.is_dir()):
            raise ValueError(f"{name}: only files and directories can be uploaded")
    setup = workdir / SETUP
    if setup.exists() and not setup.is_file():
        raise ValueError(f"{rel}/{WORKDIR}/{SETUP}: must be a file (the step's setup script)")
