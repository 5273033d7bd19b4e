"""What harnessrl would do with each field of a Harbor task or dataset, before running it
(``harnessrl tasks check-harbor``): per task, the fields that run as in Harbor, those
mapped differently, those refused (and why), and the keys Harbor's schema lacks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.sandbox.common.errors import EnvSetupError, TaskError
from services.sandbox.task import harbor_fields, verifier_policy
from services.sandbox.task.harbor_fields import Status
from services.sandbox.task.model import Task, harbor_keys, load_task, read_task_toml


@dataclass(frozen=True)
class FieldReport:
    field: str  # a dotted task.toml key, or a file relative to the task
    status: Status
    note: str  # how it runs, or why it is refused


@dataclass
class TaskReport:
    path: str
    task_id: str | None = None
    fields: list[FieldReport] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # ignored, as Harbor ignores them
    error: str | None = None  # not a valid task for another reason than a refused field
    # Does tests/ name reward.json (the verifier may write several keys)? And the keys its oracle
    # wrote, where a preflight has run it (None: not known without running it).
    writes_reward_json: bool = False
    reward_keys: list[str] | None = None
    # Does its verifier (or a step's) ask for a public network? A backend with none to give
    # (verify_network 'auto': local, docker without a bridge) refuses its trials at start.
    public_verifier: bool = False

    @property
    def multi_key(self) -> bool:
        """Several rewards, none named 'reward': a training run must choose what trains."""
        return self.reward_keys is not None and len(self.reward_keys) > 1 and "reward" not in self.reward_keys

    @property
    def runs(self) -> bool:
        return self.error is None and all(f.status != Status.REFUSED for f in self.fields)

    def as_json(self) -> dict[str, Any]:
        fields = [{**asdict(f), "status": str(f.status)} for f in self.fields]
        return {
            "path": self.path,
            "task_id": self.task_id,
            "runs": self.runs,
            "fields": fields,
            "unknown": self.unknown,
            "error": self.error,
            "writes_reward_json": self.writes_reward_json,
            "reward_keys": self.reward_keys,
            "multi_key": self.multi_key,
            "public_verifier": self.public_verifier,
        }


def task_dirs(root: Path) -> list[Path]:
    """``root`` when it is a task, else every task below it (a dataset); TaskError when none."""
    if not root.is_dir():
        raise TaskError(str(root), "not a directory")
    if (root / "task.toml").is_file():
        return [root]
    found = sorted(p.parent for p in root.rglob("task.toml") if p.is_file())
    if not found:
        raise TaskError(str(root), "no task.toml in it or below it: not a Harbor task or dataset")
    return found


def check_task(root: Path) -> TaskReport:
    """The report of one task directory; TaskError only when its task.toml cannot be read."""
    report = TaskReport(path=str(root))
    known, report.unknown = harbor_keys(read_task_toml(root, str(root)))
    for path, value in known.items():
        rule = harbor_fields.FIELDS.get(path)
        if rule is None:  # a section that is not a table: validation names it below
            continue
        why = harbor_fields.refusal(path, value)
        report.fields.append(
            FieldReport(path, Status.REFUSED, why) if why else FieldReport(path, rule.status, rule.note)
        )
    refused_files = harbor_fields.file_refusals(root)
    for name, rule in harbor_fields.FILES.items():
        if (root / name).exists():
            report.fields.append(FieldReport(name, rule.status, refused_files.get(name, rule.note)))
    try:
        task = load_task(root)
    except TaskError as e:
        if report.runs:  # a refusal is reported field by field already
            report.error = str(e)
        return report
    report.task_id = task.task_id
    report.writes_reward_json = _names_reward_json(task.tests_dir)
    _refuse_at_setup(report, task)
    return report


def _names_reward_json(tests: Path) -> bool:
    for path in sorted(tests.rglob("*")) if tests.is_dir() else []:
        try:
            if path.is_file() and path.stat().st_size < 1 << 20 and b"reward.json" in path.read_bytes():
                return True
        except OSError:
            continue
    return False


def _refuse_at_setup(report: TaskReport, task: Task) -> None:
    """What a valid task is refused for when a trial starts: the verifier's network (an
    'allowlist', set or inherited from [environment]), reported on verifier.network_mode; else
    whether a verifier asks for a public network, which a backend may have none to give."""
    try:
        run = verifier_policy.resolve(task)
    except EnvSetupError as e:
        report.fields = [f for f in report.fields if f.field != "verifier.network_mode"]
        report.fields.append(FieldReport("verifier.network_mode", Status.REFUSED, f"refused at setup: {e}"))
        return
    steps = (verifier_policy.for_step(run, None, s.config.verifier.network_mode) for s in task.steps)
    report.public_verifier = run.public or any(step.public for step in steps)


def check(roots: list[Path]) -> list[TaskReport]:
    return [check_task(d) for root in roots for d in task_dirs(root)]


def format_report(report: TaskReport, *, verbose: bool) -> list[str]:
    """Human lines: the verdict, then refused fields (and, verbose, all others)."""
    verdict = "runs" if report.runs else ("INVALID" if report.error else "REFUSED")
    label = f"{report.task_id}  ({report.path})" if report.task_id else report.path
    lines = [f"{verdict:8} {label}"]
    counts = {s: sum(f.status == s for f in report.fields) for s in Status}
    lines.append("         " + ", ".join(f"{n} {s}" for s, n in counts.items()) + f", {len(report.unknown)} unknown")
    for f in report.fields:
        if f.status == Status.REFUSED or verbose:
            lines.append(f"    {f.status:9} {f.field}: {f.note}")
    if report.unknown:
        lines.append(f"    unknown   {', '.join(report.unknown)}: ignored, as Harbor ignores them")
    if report.error:
        lines.append(f"    error     {report.error}")
    if report.multi_key:
        lines.append(
            f"    rewards   its oracle wrote several rewards ({', '.join(report.reward_keys or [])}), none named "
            "'reward': a training run must set [run] reward_key or reward_weights (preflight refuses it otherwise); "
            "trial run and eval complete with each key shown and no trial reward"
        )
    elif report.writes_reward_json and report.reward_keys is None:
        lines.append(
            "    rewards   tests/ writes reward.json: if it holds several keys and none named 'reward', a training "
            "run must set [run] reward_key or reward_weights (its keys are known once `harnessrl preflight` ran "
            "its oracle)"
        )
    if report.public_verifier:
        lines.append(
            "    network   its verifier asks for a public network (Harbor's default): a backend must give it one "
            "([sandbox.docker] verify_network: the engine's bridge); where none can be given (local, an engine "
            "without a bridge) its trials are refused at start, never scored without it; if its tests need no "
            "network, set [verifier] network_mode = 'no-network'"
        )
    return lines
