"""A trial's clients of other services, over their public contracts only: the proxy's
HTTP admin API (register a trial, close it: segments durable) and the capture store's
FinalizeTrajectory. (The Unix-socket relay that lets a network-less sandbox reach the proxy
is ``common/relay.py``: the backends use it too.)
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from opentelemetry.context import Context

from harnessrl import telemetry, tls
from harnessrl.errors import HarnessError, Unavailable
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.sandbox.task.steps import StepOutcome
from services.sandbox.trial.lifecycle import REASON_TO_PROTO, PhaseTimings, TrialOutcome, TrialSpec

log = logging.getLogger(__name__)
# A close whose connection broke under it is sent again (a fresh connection each time).
CLOSE_ATTEMPTS = 3


@dataclass(frozen=True)
class ProxyTrial:
    trial_id: str
    token: str
    base_path: str


@dataclass
class ProxySummary:
    """The proxy's close answer (services/proxy/README.md, "Admin API")."""

    num_segments: int = 0
    num_turns: int = 0
    threads: list[Any] = field(default_factory=list)
    context_overflow: bool = False
    engine_error: bool = False
    max_turns_reached: bool = False
    malformed_tool_calls: int = 0
    # Requests the proxy refused itself (a 4xx of its own) or failed inside: infrastructure.
    refused_requests: int = 0
    proxy_errors: int = 0
    refusals: list[str] = field(default_factory=list)
    # Model names the harness asked for -> calls (every name serves the trial's policy).
    requested_models: dict[str, int] = field(default_factory=dict)
    # Sampling parameters the harness asked for that the run pinned to its own (calls x fields).
    sampling_overrides: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProxySummary:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


class ProxyAdmin:
    """``POST /admin/trials`` and ``POST /admin/trials/<id>/close``."""

    def __init__(
        self,
        url: str,
        admin_token: str | None,
        timeout_s: float = 60.0,
        tls_settings: tls.TlsSettings | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # An https proxy is verified against the CA of the process's TLS (or of
        # ``tls_settings``), which also holds the client certificate mTLS asks for.
        self.tls = tls.client() if tls_settings is None else tls_settings
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        # No connection cap: a worker runs up to 256 trials, each holding a call (close waits
        # until its parts are durable); httpx's default pool of 100 made the rest time out.
        # An idle connection is dropped here (2 s) before the proxy's server drops it (uvicorn's
        # keep-alive timeout, 5 s): reusing one the server is closing at that moment fails the
        # request with a ReadError (measured: one trial in a quickstart lost its close so).
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
        verify = tls.client_context(self.tls) or True
        self._client = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout_s, limits=limits, verify=verify
        )

    @property
    def address(self) -> tuple[str, int, bool]:
        """(host, port, TLS?) of the proxy, for the relay that is a sandbox's way out."""
        parsed = httpx.URL(self.url)
        secure = parsed.scheme == "https"
        return parsed.host or "127.0.0.1", parsed.port or (443 if secure else 80), secure

    async def register(self, spec: TrialSpec, task_id: str, context: Context | None = None) -> ProxyTrial:
        """Registers the trial; ``context`` (the trial's trace) travels as ``traceparent``."""
        body = {
            "trial_id": spec.trial_id,
            "run_id": spec.run_id,
            "task_id": task_id,
            "group_id": spec.group_id,
            "model": spec.model,
            "max_turns": spec.max_turns,
        }
        if spec.gateway_target:  # absent otherwise: a proxy without per-trial routing still accepts the body
            body["gateway_target"] = spec.gateway_target
        data = await self._post("/admin/trials", body, context)
        return ProxyTrial(trial_id=data["trial_id"], token=data["token"], base_path=data["base_path"])

    async def close(self, trial_id: str) -> ProxySummary:
        # Closing is idempotent on the proxy (a second close waits for the first and returns
        # the same summary), so a connection that broke under the request is retried.
        path = f"/admin/trials/{trial_id}/close"
        return ProxySummary.from_json(await self._post(path, None, attempts=CLOSE_ATTEMPTS))

    async def _post(
        self, path: str, body: dict[str, Any] | None, context: Context | None = None, attempts: int = 1
    ) -> dict[str, Any]:
        try:
            for attempt in range(attempts):
                try:
                    resp = await self._client.post(path, json=body, headers=telemetry.inject(context=context))
                    break
                except httpx.TransportError as e:
                    if attempt + 1 == attempts or isinstance(e, httpx.TimeoutException):
                        raise
                    log.warning(
                        "proxy call broke; retrying",
                        extra={"kv": {"path": path, "attempt": attempt, "error": f"{type(e).__name__}: {e}"}},
                    )
        except httpx.HTTPError as e:
            host, port, secure = self.address
            why = await asyncio.to_thread(tls.probe, host, port, self.tls) if secure else ""
            detail = f"TLS: {why}; " if why else ""
            raise Unavailable(f"proxy at {self.url} unreachable: {detail}{type(e).__name__}: {e}") from e
        if resp.status_code >= 300:
            raise HarnessError(f"proxy {path} answered {resp.status_code}: {resp.text[:500]}")
        data: dict[str, Any] = resp.json()
        return data

    async def aclose(self) -> None:
        await self._client.aclose()


class CaptureFinalizer:
    """FinalizeTrajectory, once per trial, after the proxy's close returned."""

    def __init__(self, target: str, token: str | None, tls_settings: tls.TlsSettings | None = None) -> None:
        self._channel = connect(target, token, service="sandbox", tls_settings=tls_settings)
        self._stub = capture_pb2_grpc.CaptureStoreStub(self._channel)

    async def finalize(self, spec: TrialSpec, task_id: str, outcome: TrialOutcome) -> bool:
        request = capture_pb2.FinalizeTrajectoryRequest(
            run_id=spec.run_id,
            trial_id=spec.trial_id,
            task_id=task_id,
            group_id=spec.group_id,
            group_size=spec.group_size,
            step=spec.step,
            harness=spec.harness,
            reward=outcome.reward or 0.0,
            has_reward=outcome.reward is not None,
            rewards=outcome.rewards,
            task_steps=[
                records_pb2.TaskStepResult(name=s.name, rewards=s.rewards, verified=s.verified) for s in outcome.steps
            ],
            termination_reason=REASON_TO_PROTO[outcome.termination_reason],
            timings=outcome.timings.to_proto(),
            verifier_summary=outcome.verifier_summary[-4000:],
            harness_exit_code=outcome.harness_exit_code,
            metadata={
                "policy_version": str(spec.policy_version),
                "tamper_events": str(len(outcome.tamper_events)),
                "suspicious_events": str(len(outcome.suspicious_events)),
                **({"requested_models": ",".join(outcome.requested_models)[:4096]} if outcome.requested_models else {}),
                **({"sampling_overrides": str(outcome.sampling_overrides)} if outcome.sampling_overrides else {}),
                # Stable across attempts: the trace of the submitter (a redelivered trial's
                # finalize must stay identical), absent when the trial came without one.
                **({"trace_id": trace_id} if (trace_id := telemetry.trace_id_of(spec.trace_context)) else {}),
            },
        )
        response = await self._stub.FinalizeTrajectory(request, timeout=60, wait_for_ready=True)
        return bool(response.group_ready)

    async def finalized_outcome(self, run_id: str, trial_id: str) -> TrialOutcome | None:
        """The outcome a finalized trajectory records, or None when it is not finalized
        (a worker that died after FinalizeTrajectory but before reporting the trial)."""
        request = capture_pb2.GetTrajectoryRequest(run_id=run_id, trial_id=trial_id)
        try:
            traj = await self._stub.GetTrajectory(request, timeout=60, wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        if not traj.finalized:
            return None
        return TrialOutcome(
            termination_reason=_REASON_FROM_PROTO[traj.termination_reason],
            reward=traj.reward if traj.has_reward else None,
            rewards=dict(traj.rewards),
            steps=[StepOutcome(name=s.name, rewards=dict(s.rewards), verified=s.verified) for s in traj.task_steps],
            timings=PhaseTimings(**{f: getattr(traj.timings, f) for f in PhaseTimings.model_fields}),
            num_segments=len(traj.segments),
            harness_exit_code=traj.harness_exit_code,
            verifier_summary=traj.verifier_summary,
            task_id=traj.task_id,
            events=["outcome recovered from the capture store after the worker was lost"],
        )

    async def aclose(self) -> None:
        await self._channel.close()


_REASON_FROM_PROTO = {proto: reason for reason, proto in REASON_TO_PROTO.items()}
