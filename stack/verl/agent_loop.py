"""The verl cluster path: harnessrl trials as a verl agent loop.

verl's fully-async trainer owns the GPUs: its rollout replicas (vLLM/SGLang)
sample, its FSDP/Megatron actor trains. This module plugs harnessrl's trial
machinery into it, unchanged:

    verl AgentLoopWorker ── HarnessAgentLoop.run(sampling_params, **row)
      │ 1. a gateway in this worker process, whose one engine is an adapter over
      │    verl's server manager: Generate(prompt ids) ->
      │    server_manager.generate(request_id, prompt_ids=..., sampling_params=...)
      │    -> token ids, log_probs, routed_experts (so verl's replicas sample and
      │    their logprobs are the ones captured);
      │ 2. SubmitTrial to the sandbox service with ``TrialSpec.gateway_target`` =
      │    that gateway (the sandbox registers it with the proxy, whose engine client
      │    for the trial dials it); the unmodified harness runs, the proxy captures
      │    segments, the verifier rewards;
      │ 3. GetTrajectory from the capture store -> AgentLoopOutput; an outcome that
      │    cannot be trained is a masked row (``masked_output``), never an exception.

The engine adapter and the worker's gateway are ``stack/verl/engine.py`` (its
sampling rules too). This file composes trainer + sandbox + gateway, so it lives
in ``stack/`` (services never import each other). The conversions of ``stack/verl/outputs.py`` are the part
the CPU tests pin against verl's own classes.

Segments (invariant 3: a trajectory whose history was rewritten, or that has
sub-agent threads, has several): with ``segments: last`` (verl's classic
``AgentLoopWorker``, which the fully-async trainer uses, takes one output per
sample) the main thread's last segment is the sample and every other trainable
segment is dropped and counted (``extra_fields["harnessrl_dropped_segments"]``,
a step metric ``harnessrl/dropped_segments`` through ``stack/verl/hooks.py``);
with ``segments: all`` (verl's v1 TransferQueue trainer, which takes a list of
outputs per session and gives each row its session's GRPO advantage) every
trainable segment is a sample. ``stack/verl/outputs.py`` has the conversion.
The CPU trainer (``services/trainer``) trains every segment with a GSPO ratio
spanning them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import grpc
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from harnessrl.errors import HarnessError, InvalidArgument
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2, sandbox_pb2, sandbox_pb2_grpc
from stack.verl import address as verl_address
from stack.verl.checks import AGENT_NAME, check_estimator, engine_context_window
from stack.verl.engine import VerlServerEngine, WorkerGateway, serve_engine
from stack.verl.outputs import masked_output, trajectory_to_output, trajectory_to_outputs

__all__ = [
    "AGENT_NAME",
    "HarnessAgentLoop",
    "VerlServerEngine",
    "masked_output",
    "serve_engine",
    "trajectory_to_output",
]

log = logging.getLogger(__name__)

SEGMENT_MODES = frozenset({"last", "all"})

# -- the agent loop -------------------------------------------------------------------------------


_GATEWAY = WorkerGateway()


@register(AGENT_NAME)
class HarnessAgentLoop(AgentLoopBase):
    """Runs one harnessrl trial (sandbox + unmodified harness + proxy) per verl sample.

    Configured by the keyword arguments of its entry in verl's
    ``agent_loop_config_path`` file (``stack/verl/agent_loops.yaml``), which
    Hydra passes to the constructor. Dataset rows carry ``task_path`` and
    ``task_id``; verl adds ``uid`` (the group) and ``global_steps``.

    ``segments``: ``last`` (one output per trial, for verl's classic worker) or
    ``all`` (a list, for verl's v1 worker), see the module docstring.
    ``temperature``: the harnessrl run's sampling temperature, when given; a verl
    rollout temperature that differs is refused when the loop is built.
    ``gateway_bind``/``gateway_address``: where the worker's gateway listens and the
    address the proxy dials, checked against the cluster's shape when the loop is built
    (``stack/verl/address.py``).
    """

    def __init__(
        self,
        *args: Any,
        sandbox_target: str = "",
        capture_target: str = "",
        run_id: str = "verl",
        harness: str = "mini-swe-agent",
        service_token: str | None = None,
        poll_s: float = 1.0,
        trial_deadline_s: float = 4 * 3600.0,
        harness_options: Mapping[str, str] | None = None,
        gateway_bind: str = "127.0.0.1",
        gateway_address: str = "",
        segments: str = "last",
        temperature: float | None = None,
        initial_policy_version: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        check_estimator(self.config)
        self.context_window = engine_context_window(self.config)
        self.initial_policy_version = int(initial_policy_version)
        if not sandbox_target or not capture_target:
            raise InvalidArgument(f"{AGENT_NAME}: sandbox_target and capture_target are required (host:port)")
        if segments not in SEGMENT_MODES:
            raise InvalidArgument(f"{AGENT_NAME}: segments must be one of {sorted(SEGMENT_MODES)}, got {segments!r}")
        verl_temperature = self.rollout_config.get("temperature")
        if temperature is not None and verl_temperature is not None and float(verl_temperature) != float(temperature):
            raise InvalidArgument(
                f"{AGENT_NAME}: verl's actor_rollout_ref.rollout.temperature={verl_temperature} differs from the "
                f"run's temperature={temperature}; set one value (harnessrl verl prepare writes both)"
            )
        self.segments = segments
        self.sandbox_target, self.capture_target = sandbox_target, capture_target
        self.run_id, self.harness, self.service_token, self.poll_s = run_id, harness, service_token, poll_s
        self.trial_deadline_s = trial_deadline_s
        self.harness_options = {str(k): str(v) for k, v in (harness_options or {}).items()}
        # Checked (and a wildcard bind's address derived) here, when verl builds the loop: a
        # gateway the proxy cannot dial would turn every trial into a masked row.
        address = verl_address.worker_host(self.config, gateway_bind, gateway_address or "", sandbox_target)
        self.gateway_bind, self.gateway_address = gateway_bind, address

    # verl's v1 worker takes a list of outputs per session (segments: all); its base class says one.
    async def run(  # type: ignore[override]
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        target, engine = await _GATEWAY.ensure(
            self.server_manager,
            len(self.tokenizer),  # type: ignore[arg-type]
            self.gateway_bind,
            self.gateway_address,
            context_window=self.context_window,
            initial_version=self.initial_policy_version,
        )
        # The weights' version is what verl's replicas report (VerlServerEngine); verl's rows
        # carry no step of their own (a `verl prepare` row never has global_steps).
        version = engine.policy_version
        trial_id = f"verl-{uuid.uuid4().hex[:16]}"
        if "task_path" not in kwargs:
            raise InvalidArgument(f"{AGENT_NAME}: dataset row has no 'task_path' column")
        spec = sandbox_pb2.TrialSpec(
            trial_id=trial_id,
            run_id=self.run_id,
            task_path=str(kwargs["task_path"]),
            task_id=str(kwargs.get("task_id", kwargs["task_path"])),
            group_id=str(kwargs.get("uid", trial_id)),
            group_size=int(self.rollout_config.n),
            step=int(kwargs.get("global_steps", version)),
            harness=self.harness,
            policy_version=version,
            harness_options=self.harness_options,
            # The proxy sends this trial's model calls to this worker's gateway (verl's replicas).
            gateway_target=target,
        )
        pad = _pad_id(self.tokenizer)
        info = {"trial_id": trial_id}
        response_length = int(self.rollout_config.response_length)
        # verl's sampling params govern every model call of this trial (a bad one is verl's
        # config, refused here for the whole run, not one trial's outcome).
        engine.govern(trial_id, sampling_params, response_length)
        try:
            status = await run_trial(self.sandbox_target, spec, self.service_token, self.poll_s, self.trial_deadline_s)
            log.info("trial finished", extra={"kv": {"trial": trial_id, "reward": status.reward}})
            traj = await fetch_trajectory(self.capture_target, spec.run_id, trial_id, self.service_token)
            latest = engine.latest(trial_id)
        except TimeoutError:
            return self._shaped(masked_output("trial_deadline", info, pad, engine.route_shape, engine.policy_version))
        except (grpc.aio.AioRpcError, HarnessError, OSError) as e:
            # One trial's infrastructure failure is a masked row, never the batch's failure.
            error = info | {"error": str(e)[:500]}
            return self._shaped(masked_output("sandbox_error", error, pad, engine.route_shape, engine.policy_version))
        finally:
            engine.release(trial_id)
        convert = trajectory_to_outputs if self.segments == "all" else trajectory_to_output
        out = convert(
            traj,
            response_length,
            prompt_length=int(self.rollout_config.prompt_length),
            pad_id=pad,
            route_shape=engine.route_shape,
            version=engine.policy_version,
        )
        final = out[-1] if isinstance(out, list) else out
        if latest is not None and final.extra_fields["harnessrl_valid"]:
            # A reply verl resumed across a weight sync reports its span, its tokens only the
            # oldest: the trial's last row (main's last segment) carries the newest as its max.
            final.extra_fields["max_global_steps"] = max(int(final.extra_fields["max_global_steps"]), latest)
        return out

    def _shaped(self, out: AgentLoopOutput) -> AgentLoopOutput | list[AgentLoopOutput]:
        return [out] if self.segments == "all" else out


def _pad_id(tokenizer: Any) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        if (value := getattr(tokenizer, name, None)) is not None:
            return int(value)
    return 0


async def run_trial(
    target: str, spec: sandbox_pb2.TrialSpec, token: str | None, poll_s: float, deadline_s: float = 0.0
) -> sandbox_pb2.TrialStatus:
    """Submits the trial and waits for a terminal state; past ``deadline_s`` (0: none)
    cancels it and raises TimeoutError."""
    async with connect(target, token) as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec), timeout=60)
        try:
            async with asyncio.timeout(deadline_s or None):
                while True:
                    request = sandbox_pb2.GetTrialRequest(trial_id=spec.trial_id)
                    # wait_for_ready: a sandbox front restarting mid-trial is waited for, not a failure.
                    status = await stub.GetTrial(request, timeout=60, wait_for_ready=True)
                    if status.state == sandbox_pb2.TRIAL_STATE_DONE:
                        return status
                    await asyncio.sleep(poll_s)
        except TimeoutError:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.CancelTrial(sandbox_pb2.CancelTrialRequest(trial_id=spec.trial_id), timeout=10)
            raise


async def fetch_trajectory(target: str, run_id: str, trial_id: str, token: str | None) -> records_pb2.Trajectory:
    async with connect(target, token) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)
        req = capture_pb2.GetTrajectoryRequest(run_id=run_id, trial_id=trial_id, include_tokens=True)
        return await stub.GetTrajectory(req)
