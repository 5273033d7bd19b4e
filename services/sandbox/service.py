"""The sandbox service object behind the gRPC servicer: submit, get, watch,
cancel over the queue. Validates a submission before it is queued, so a bad
spec is a clear InvalidArgument instead of a failed trial later."""

from __future__ import annotations

from collections.abc import AsyncIterator

from pydantic import ValidationError

from harnessrl import telemetry
from harnessrl.config import format_validation_error
from harnessrl.errors import InvalidArgument
from harnessrl.v1 import sandbox_pb2
from services.sandbox.harnesses import get_harness
from services.sandbox.queue.base import TrialQueue
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TrialRecord, TrialSpec


class SandboxService:
    def __init__(self, queue: TrialQueue, *, validate_tasks: bool = True) -> None:
        self.queue = queue
        self.validate_tasks = validate_tasks

    @staticmethod
    def parse_spec(msg: sandbox_pb2.TrialSpec) -> TrialSpec:
        try:
            return TrialSpec.from_proto(msg)
        except ValidationError as e:
            raise InvalidArgument(f"invalid trial spec: {format_validation_error(e)}") from e

    async def submit(self, spec: TrialSpec) -> tuple[TrialRecord, bool]:
        get_harness(spec.harness)
        if self.validate_tasks:
            load_task(spec.task_path)
        if not spec.trace_context:
            spec = spec.model_copy(update={"trace_context": telemetry.inject()})
        return await self.queue.submit(spec)

    async def get(self, trial_id: str) -> TrialRecord:
        if not trial_id:
            raise InvalidArgument("trial_id is required")
        return await self.queue.get(trial_id)

    def watch(self, run_id: str, trial_ids: list[str]) -> AsyncIterator[TrialRecord]:
        if not run_id and not trial_ids:
            raise InvalidArgument("watch needs a run_id or trial_ids")
        return self.queue.watch(run_id, trial_ids)

    async def cancel(self, trial_id: str) -> bool:
        if not trial_id:
            raise InvalidArgument("trial_id is required")
        return await self.queue.cancel(trial_id)
