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
    _refuse_at_setup(report, task)
    return report


def _refuse_at_setup(report: TaskReport, task: Task) -> None:
    """What a valid task is refused for when a trial starts: the verifier's network (an
    'allowlist', set or inherited from [environment]), reported on verifier.network_mode."""
    try:
        verifier_policy.resolve(task)
    except EnvSetupError as e:
        report.fields = [f for f in report.fields if f.field != "verifier.network_mode"]
        report.fields.append(FieldReport("verifier.network_mode", Status.REFUSED, f"refused at setup: {e}"))


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
    return lines
