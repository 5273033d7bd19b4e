"""FinalizeTrajectory for the trials the front ends itself (every attempt lost, or
cancelled with its executor gone): the trainer counts a group complete from the
capture store, so a trial reported DONE is finalized there first (CONTRACT.md,
guarantee 7). Trials an executor finished were finalized by the executor."""

from __future__ import annotations

from pathlib import PurePosixPath

from harnessrl import telemetry
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, sandbox_pb2


class CaptureFinalizer:
    def __init__(self, target: str, token: str | None) -> None:
        self._channel = connect(target, token, service="sandbox")
        self._stub = capture_pb2_grpc.CaptureStoreStub(self._channel)

    async def finalize(
        self, spec: sandbox_pb2.TrialSpec, trial_id: str, status: sandbox_pb2.TrialStatus, trace: dict[str, str]
    ) -> None:
        """The trajectory of ``trial_id`` (the last attempt's id) with ``status``'s reason and no reward."""
        metadata = {"policy_version": str(spec.policy_version), "tamper_events": "0", "suspicious_events": "0"}
        if trace_id := telemetry.trace_id_of(trace):
            metadata["trace_id"] = trace_id
        request = capture_pb2.FinalizeTrajectoryRequest(
            run_id=spec.run_id,
            trial_id=trial_id,
            task_id=spec.task_id or PurePosixPath(spec.task_path).name or "unknown",
            group_id=spec.group_id,
            group_size=spec.group_size,
            step=spec.step,
            harness=spec.harness,
            has_reward=False,
            termination_reason=status.termination_reason,
            timings=status.timings,
            verifier_summary=status.error[-4000:],
            metadata=metadata,
        )
        await self._stub.FinalizeTrajectory(request, timeout=60, wait_for_ready=True)

    async def close(self) -> None:
        await self._channel.close()
