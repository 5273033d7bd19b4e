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
      │ 2. SubmitTrial to the sandbox service (the trial's proxy is pointed at that
      │    gateway through ``harness_options["harnessrl.gateway_target"]``); the
      │    unmodified harness runs, the proxy captures segments, the verifier rewards;
      │ 3. GetTrajectory from the capture store -> AgentLoopOutput.

This file composes trainer + sandbox + gateway, so it lives in ``stack/`` (services
never import each other). ``trajectory_to_output`` is the part the CPU tests pin
against verl's own classes.

What verl's AgentLoopOutput cannot carry: one output is one prompt + one
response. A trajectory whose history was rewritten has several segments
(invariant 3); here only its main thread's *last* segment becomes the sample and
the others travel in ``extra_fields["harnessrl_segments"]`` (token arrays as
lists), so nothing is silently lost, but verl trains on one segment per trial.
The CPU trainer (``services/trainer``) trains every segment with a GSPO ratio
spanning them all; doing that on the cluster needs a verl-side change (a batch
row per segment plus a trajectory index for the loss, see
``services/trainer/losses.py``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from harnessrl import arrays
from harnessrl.errors import FailedPrecondition, InvalidArgument
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2, sandbox_pb2, sandbox_pb2_grpc
from services.gateway.engine import Chunk, Engine, EngineInfo, GenerateInput

log = logging.getLogger(__name__)

AGENT_NAME = "harnessrl_agent"
GATEWAY_OPTION = "harnessrl.gateway_target"

# -- the engine adapter ---------------------------------------------------------------------


class VerlServerEngine(Engine):
    """A gateway engine whose sampler is verl's server manager (its vLLM/SGLang replicas).

    Weight versions are verl's business (its trainer syncs its replicas); the
    version stamped on tokens is ``policy_version``, which the agent loop sets
    from verl's global step.
    """

    kind = "verl"

    def __init__(self, server_manager: Any, vocab_size: int, name: str = "verl-0", context_window: int = 32768) -> None:
        super().__init__(name)
        self.vocab_size = vocab_size
        self.server_manager = server_manager
        self.policy_version = 0
        self.context_window = context_window
        self._in_flight = 0

    async def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        s = request.sampling
        params: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p or 1.0, "logprobs": True}
        if s.top_k:
            params["top_k"] = s.top_k
        if s.max_tokens:
            params["max_tokens"] = s.max_tokens
        if s.seed:
            params["seed"] = s.seed
        self._in_flight += 1
        try:
            out = await self.server_manager.generate(
                request_id=request.request_id, prompt_ids=request.prompt_ids.tolist(), sampling_params=params
            )
        finally:
            self._in_flight -= 1
        yield output_to_chunk(out, len(request.prompt_ids), self.policy_version)

    async def abort(self, request_id: str) -> bool:
        return False  # verl's server manager has no per-request abort

    async def pause(self, timeout_s: float) -> int:
        return 0  # verl pauses its own replicas around its weight syncs

    async def resume(self) -> int:
        return 0

    async def load_weights(self, version: int, checkpoint_path: str, options: Mapping[str, str]) -> None:
        raise FailedPrecondition("weights of verl's replicas are synced by verl's trainer, not through the gateway")

    def info(self) -> EngineInfo:
        return EngineInfo(
            model="verl",
            context_window=self.context_window,
            vocab_size=self.vocab_size,
            policy_version=self.policy_version,
            in_flight=self._in_flight,
            capacity=1024,
        )


def output_to_chunk(out: Any, prompt_len: int, version: int) -> Chunk:
    """verl's TokenOutput -> one gateway chunk (all tokens sampled, mask 1)."""
    ids = np.asarray(out.token_ids, dtype=np.int32)
    if out.log_probs is None or len(out.log_probs) != len(ids):
        raise InvalidArgument("verl server manager returned no logprob per token; enable rollout logprobs")
    routes = None
    if out.routed_experts is not None:
        # verl's routes cover prompt + response rows; the capture keeps the response rows.
        all_routes = np.asarray(out.routed_experts, dtype=np.uint8)
        routes = all_routes[prompt_len : prompt_len + len(ids)] if len(all_routes) > len(ids) else all_routes
    finish = "abort" if out.stop_reason == "aborted" else "stop"
    return Chunk(
        ids=ids,
        logprobs=np.asarray(out.log_probs, dtype=np.float32),
        versions=np.full(len(ids), version, dtype=np.int32),
        routed_experts=routes,
        finish_reason=finish,
    )


# -- capture -> AgentLoopOutput ---------------------------------------------------------------


def _segment_dict(seg: records_pb2.Segment) -> dict[str, Any]:
    r = seg.response
    return {
        "thread": seg.key.thread,
        "index": seg.key.segment_index,
        "prompt_ids": arrays.unpack_i32(seg.prompt_ids).tolist(),
        "response_ids": arrays.unpack_i32(r.ids).tolist(),
        "response_mask": np.frombuffer(r.mask, dtype=np.uint8).tolist(),
        "response_logprobs": arrays.unpack_f32(r.logprobs).tolist(),
        "policy_versions": arrays.unpack_i32(r.policy_versions).tolist(),
    }


def trajectory_to_output(traj: records_pb2.Trajectory, response_length: int) -> AgentLoopOutput:
    """The captured trajectory as verl's AgentLoopOutput (tokens exactly as captured)."""
    main = [s for s in traj.segments if s.trainable and s.key.thread == "main"]
    if not main:
        raise InvalidArgument(f"trial {traj.trial_id}: no trainable main-thread segment to train on")
    seg = max(main, key=lambda s: s.key.segment_index)
    arrays.validate_tokens(seg.response)
    d = _segment_dict(seg)
    if len(d["response_ids"]) > response_length:
        raise InvalidArgument(
            f"trial {traj.trial_id}: response of {len(d['response_ids'])} tokens exceeds "
            f"rollout.response_length={response_length}; raise it rather than truncating a capture"
        )
    routes = arrays.unpack_routes(seg.response.routed_experts)
    full_routes = None
    if routes is not None:
        # verl indexes routes by absolute position (prompt + response); prompt rows are not captured.
        full_routes = np.zeros((len(d["prompt_ids"]) + len(routes), *routes.shape[1:]), dtype=np.uint8)
        full_routes[len(d["prompt_ids"]) :] = routes
    valid = traj.termination_reason in (
        records_pb2.TERMINATION_REASON_COMPLETED,
        records_pb2.TERMINATION_REASON_MAX_TURNS,
        records_pb2.TERMINATION_REASON_CONTEXT_OVERFLOW,
        records_pb2.TERMINATION_REASON_AGENT_TIMEOUT,
    )
    others = [_segment_dict(s) for s in traj.segments if s is not seg]
    return AgentLoopOutput(
        prompt_ids=d["prompt_ids"],
        response_ids=d["response_ids"],
        response_mask=d["response_mask"],
        response_logprobs=d["response_logprobs"],
        routed_experts=full_routes,
        reward_score=float(traj.reward) if valid and traj.has_reward else 0.0,
        num_turns=int(seg.num_turns) * 2,
        metrics=AgentLoopMetrics(),
        extra_fields={
            "harnessrl_trial_id": traj.trial_id,
            "harnessrl_termination_reason": records_pb2.TerminationReason.Name(traj.termination_reason),
            # Infra failures must weigh 0 (invariant 5): a verl reward function/filter reads this.
            "harnessrl_valid": bool(valid and traj.has_reward),
            "harnessrl_policy_versions": d["policy_versions"],
            "harnessrl_segments": others,
        },
    )


# -- the agent loop -------------------------------------------------------------------------------


class _WorkerGateway:
    """One in-process gateway per verl AgentLoopWorker, serving the engine adapter on 127.0.0.1."""

    def __init__(self) -> None:
        self.target: str | None = None
        self.engine: VerlServerEngine | None = None
        self._lock = asyncio.Lock()
        self._server: Any = None

    async def ensure(self, server_manager: Any, vocab_size: int) -> tuple[str, VerlServerEngine]:
        async with self._lock:
            if self.target is None or self.engine is None:
                self.engine = VerlServerEngine(server_manager, vocab_size)
                self._server, port = await serve_engine(self.engine)
                self.target = f"127.0.0.1:{port}"
            return self.target, self.engine

    async def close(self) -> None:
        """Stops the worker's gateway (verl ends workers by killing them; tests call this)."""
        async with self._lock:
            if self._server is not None:
                await self._server.stop(0)
            self._server, self.target, self.engine = None, None, None


async def serve_engine(engine: Engine) -> tuple[Any, int]:
    """A real gateway (service + gRPC servicer) in this process with ``engine`` as its only replica."""
    from harnessrl.rpc import start_server
    from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc
    from services.gateway.server import GatewayServer, GatewayServicer
    from services.gateway.service import GatewayService
    from services.gateway.settings import Settings as GatewaySettings

    # The engine string is never used (the one replica is ``engine``); it only has to validate.
    fields = {"engine": "scripted:/dev/null", "model_name": "verl", "context_window": engine.info().context_window}
    settings = GatewaySettings.model_validate(fields)
    service = GatewayService([engine], settings)
    await service.start()
    name = gateway_pb2.DESCRIPTOR.services_by_name["RolloutGateway"].full_name

    def register(server: Any) -> list[str]:
        gateway_pb2_grpc.add_RolloutGatewayServicer_to_server(GatewayServicer(service), server)
        return [name]

    running = await start_server(settings, "verl-gateway", register)
    return GatewayServer(running, service), running.port


_GATEWAY = _WorkerGateway()


@register(AGENT_NAME)
class HarnessAgentLoop(AgentLoopBase):
    """Runs one harnessrl trial (sandbox + unmodified harness + proxy) per verl sample.

    Configured by the keyword arguments of its entry in verl's
    ``agent_loop_config_path`` file (``stack/verl/agent_loops.yaml``), which
    Hydra passes to the constructor. Dataset rows carry ``task_path`` and
    ``task_id``; verl adds ``uid`` (the group) and ``global_steps``.
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
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if not sandbox_target or not capture_target:
            raise InvalidArgument(f"{AGENT_NAME}: sandbox_target and capture_target are required (host:port)")
        self.sandbox_target, self.capture_target = sandbox_target, capture_target
        self.run_id, self.harness, self.service_token, self.poll_s = run_id, harness, service_token, poll_s

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        target, engine = await _GATEWAY.ensure(self.server_manager, len(self.tokenizer))  # type: ignore[arg-type]
        engine.policy_version = int(kwargs.get("global_steps", 0))
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
            step=int(kwargs.get("global_steps", 0)),
            harness=self.harness,
            policy_version=engine.policy_version,
            harness_options={GATEWAY_OPTION: target},
        )
        status = await run_trial(self.sandbox_target, spec, self.service_token, self.poll_s)
        log.info("trial finished", extra={"kv": {"trial": trial_id, "reward": status.reward}})
        traj = await fetch_trajectory(self.capture_target, spec.run_id, trial_id, self.service_token)
        return trajectory_to_output(traj, int(self.rollout_config.response_length))


async def run_trial(
    target: str, spec: sandbox_pb2.TrialSpec, token: str | None, poll_s: float
) -> sandbox_pb2.TrialStatus:
    """Submits the trial and waits for a terminal state."""
    async with connect(target, token) as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec))
        while True:
            status = await stub.GetTrial(sandbox_pb2.GetTrialRequest(trial_id=spec.trial_id))
            if status.state == sandbox_pb2.TRIAL_STATE_DONE:
                return status
            await asyncio.sleep(poll_s)


async def fetch_trajectory(target: str, run_id: str, trial_id: str, token: str | None) -> records_pb2.Trajectory:
    async with connect(target, token) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)
        req = capture_pb2.GetTrajectoryRequest(run_id=run_id, trial_id=trial_id, include_tokens=True)
        return await stub.GetTrajectory(req)
