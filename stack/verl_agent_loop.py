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
import contextlib
import logging
import socket
import uuid
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import grpc
import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from harnessrl import arrays
from harnessrl.errors import FailedPrecondition, HarnessError, InvalidArgument
from harnessrl.rpc import check_target, connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2, sandbox_pb2, sandbox_pb2_grpc
from services.gateway.engine import Chunk, Engine, EngineInfo, GenerateInput

log = logging.getLogger(__name__)

AGENT_NAME = "harnessrl_agent"

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
        # (layers, top-k) of the routes verl's replicas returned, once seen: masked rows carry
        # zero routes of this shape so a batch where other rows have routes concatenates.
        self.route_shape: tuple[int, int] | None = None
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
        # verl's server manager routes by this id (sticky session: the same replica and its
        # prefix cache) and gives vLLM a fresh id per call itself; the proxy's request id
        # is new every call (the gateway needs it unique while running), so the sticky key
        # is the trial's thread, as verl's own agent loops keep one id per trajectory.
        sticky = f"{request.trial_id}/{request.thread}" if request.trial_id else request.request_id
        self._in_flight += 1
        try:
            out = await self.server_manager.generate(
                request_id=sticky, prompt_ids=request.prompt_ids.tolist(), sampling_params=params
            )
        finally:
            self._in_flight -= 1
        chunk = output_to_chunk(out, len(request.prompt_ids), self.policy_version)
        if chunk.routed_experts is not None and chunk.routed_experts.ndim == 3:
            self.route_shape = (int(chunk.routed_experts.shape[1]), int(chunk.routed_experts.shape[2]))
        yield chunk

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


POLICY_REASONS = frozenset(
    {
        records_pb2.TERMINATION_REASON_COMPLETED,
        records_pb2.TERMINATION_REASON_MAX_TURNS,
        records_pb2.TERMINATION_REASON_CONTEXT_OVERFLOW,
        records_pb2.TERMINATION_REASON_AGENT_TIMEOUT,
    }
)


def trajectory_to_output(
    traj: records_pb2.Trajectory,
    response_length: int,
    *,
    prompt_length: int | None = None,
    pad_id: int = 0,
    route_shape: tuple[int, int] | None = None,
) -> AgentLoopOutput:
    """The captured trajectory as verl's AgentLoopOutput, tokens exactly as captured.

    Never raises for one trial's outcome (verl gathers a batch's samples without
    ``return_exceptions``: one exception fails the whole batch). A trial that cannot
    be trained becomes a masked sample (``masked_output``): an infrastructure
    termination reason (invariant 5), no trainable main-thread segment (e.g. setup
    failed), a capture that does not fit ``response_length``/``prompt_length``
    (verl pads to them and cannot take a longer row; truncating a capture would
    train on a context the engine never finished in), or a malformed capture.
    """
    main = [s for s in traj.segments if s.trainable and s.key.thread == "main"]
    reason = records_pb2.TerminationReason.Name(traj.termination_reason)
    base = {"trial_id": traj.trial_id, "termination_reason": reason, "reward": traj.reward if traj.has_reward else None}
    if route_shape is None:
        route_shape = next((_route_shape(s) for s in traj.segments if _route_shape(s)), None)
    if traj.termination_reason not in POLICY_REASONS:
        return masked_output(f"infra:{reason.removeprefix('TERMINATION_REASON_').lower()}", base, pad_id, route_shape)
    if not traj.has_reward:
        return masked_output("no_reward", base, pad_id, route_shape)
    if not main:
        return masked_output("no_trainable_segment", base, pad_id, route_shape)
    seg = max(main, key=lambda s: s.key.segment_index)
    try:
        arrays.validate_tokens(seg.response)
        d = _segment_dict(seg)
        routes = arrays.unpack_routes(seg.response.routed_experts)
    except InvalidArgument as e:
        return masked_output("invalid_capture", base | {"error": str(e)}, pad_id, route_shape)
    if len(d["response_ids"]) > response_length:
        return masked_output("response_too_long", base | {"length": len(d["response_ids"])}, pad_id, route_shape)
    if prompt_length is not None and len(d["prompt_ids"]) > prompt_length:
        return masked_output("prompt_too_long", base | {"length": len(d["prompt_ids"])}, pad_id, route_shape)
    full_routes = None
    if routes is not None:
        # verl indexes routes by absolute position (prompt + response); prompt rows are not captured.
        full_routes = np.zeros((len(d["prompt_ids"]) + len(routes), *routes.shape[1:]), dtype=np.uint8)
        full_routes[len(d["prompt_ids"]) :] = routes
    others = [_segment_dict(s) for s in traj.segments if s is not seg]
    return AgentLoopOutput(
        prompt_ids=d["prompt_ids"],
        response_ids=d["response_ids"],
        response_mask=d["response_mask"],
        response_logprobs=d["response_logprobs"],
        routed_experts=full_routes,
        reward_score=float(traj.reward),
        num_turns=int(seg.num_turns) * 2,
        metrics=AgentLoopMetrics(),
        extra_fields=_extra(base, valid=True, masked="")
        | {"harnessrl_policy_versions": d["policy_versions"], "harnessrl_segments": others},
    )


def masked_output(
    why: str, info: Mapping[str, Any], pad_id: int = 0, route_shape: tuple[int, int] | None = None
) -> AgentLoopOutput:
    """A well-formed sample that weighs 0 in verl's loss.

    The weight is ``response_mask``: verl multiplies its policy loss by it
    (``AgentLoopWorker._agent_loop_postprocess`` makes ``response_mask`` of the
    batch from it; ``core_algos.agg_loss`` sums ``loss_mat * loss_mask`` and its
    ``seq-mean-*`` modes exclude fully masked rows), so an all-zero mask trains
    nothing. Two pad tokens (prompt 1, response 1) keep every tensor non-empty;
    ``reward_score`` is 0.0 so verl's ``rm_scores`` exist for every row. What
    this cannot do: the row still counts in its GRPO group's reward mean/std
    (verl computes those over all rows of a uid); a batch filter on
    ``extra_fields["harnessrl_valid"]`` is what removes it from the group.
    ``routed_experts`` (zeros) are given when their (layers, top-k) shape is known,
    so a batch where others carry routes still concatenates.
    """
    log.warning("masked sample", extra={"kv": {"why": why, **{k: v for k, v in info.items() if k != "reward"}}})
    routes = np.zeros((2, *route_shape), dtype=np.uint8) if route_shape else None
    return AgentLoopOutput(
        prompt_ids=[pad_id],
        response_ids=[pad_id],
        response_mask=[0],
        response_logprobs=[0.0],
        routed_experts=routes,
        reward_score=0.0,
        num_turns=0,
        metrics=AgentLoopMetrics(),
        extra_fields=_extra(info, valid=False, masked=why)
        | {"harnessrl_policy_versions": [], "harnessrl_segments": []},
    )


def _extra(info: Mapping[str, Any], *, valid: bool, masked: str) -> dict[str, Any]:
    return {
        "harnessrl_trial_id": info.get("trial_id", ""),
        "harnessrl_termination_reason": info.get("termination_reason", ""),
        # False: the row weighs 0 (response_mask all 0); a verl batch filter/reward hook reads it.
        "harnessrl_valid": valid,
        # Why the row is masked ("" when it trains): infra:<reason>, no_reward, no_trainable_segment,
        # response_too_long, prompt_too_long, invalid_capture, sandbox_error, trial_deadline.
        "harnessrl_masked": masked,
        # The verifier's reward (None when it gave none): reported, trained only when valid.
        "harnessrl_reward": info.get("reward"),
    }


def _route_shape(seg: records_pb2.Segment) -> tuple[int, int] | None:
    r = seg.response.routed_experts
    return (int(r.num_layers), int(r.top_k)) if r.data and r.num_layers and r.top_k else None


# -- the agent loop -------------------------------------------------------------------------------


class _WorkerGateway:
    """One in-process gateway per verl AgentLoopWorker, serving the engine adapter on 127.0.0.1."""

    def __init__(self) -> None:
        self.target: str | None = None
        self.engine: VerlServerEngine | None = None
        self._lock = asyncio.Lock()
        self._server: Any = None

    async def ensure(
        self, server_manager: Any, vocab_size: int, bind: str = "127.0.0.1", address: str = ""
    ) -> tuple[str, VerlServerEngine]:
        """The worker's gateway, started on first use: bound to ``bind`` and named to the
        proxy as ``address:port`` (``address`` defaults to ``bind``; with ``bind`` 0.0.0.0,
        to this host's address, which a proxy on another node can reach)."""
        async with self._lock:
            if self.target is None or self.engine is None:
                self.engine = VerlServerEngine(server_manager, vocab_size)
                self._server, port = await serve_engine(self.engine, bind)
                host = address or (socket.gethostbyname(socket.gethostname()) if bind in ("0.0.0.0", "::") else bind)
                self.target = check_target(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
            return self.target, self.engine

    async def close(self) -> None:
        """Stops the worker's gateway (verl ends workers by killing them; tests call this)."""
        async with self._lock:
            if self._server is not None:
                await self._server.stop(0)
            self._server, self.target, self.engine = None, None, None


async def serve_engine(engine: Engine, host: str = "127.0.0.1") -> tuple[Any, int]:
    """A real gateway (service + gRPC servicer) in this process with ``engine`` as its only replica."""
    from harnessrl.rpc import start_server
    from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc
    from services.gateway.server import GatewayServer, GatewayServicer
    from services.gateway.service import GatewayService
    from services.gateway.settings import Settings as GatewaySettings

    # The engine string is never used (the one replica is ``engine``); it only has to validate.
    fields = {
        "engine": "scripted:/dev/null",
        "model_name": "verl",
        "context_window": engine.info().context_window,
        "host": host,
    }
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
        trial_deadline_s: float = 4 * 3600.0,
        harness_options: Mapping[str, str] | None = None,
        gateway_bind: str = "127.0.0.1",
        gateway_address: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if not sandbox_target or not capture_target:
            raise InvalidArgument(f"{AGENT_NAME}: sandbox_target and capture_target are required (host:port)")
        self.sandbox_target, self.capture_target = sandbox_target, capture_target
        self.run_id, self.harness, self.service_token, self.poll_s = run_id, harness, service_token, poll_s
        self.trial_deadline_s = trial_deadline_s
        self.harness_options = {str(k): str(v) for k, v in (harness_options or {}).items()}
        self.gateway_bind, self.gateway_address = gateway_bind, gateway_address or ""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        target, engine = await _GATEWAY.ensure(
            self.server_manager,
            len(self.tokenizer),  # type: ignore[arg-type]
            self.gateway_bind,
            self.gateway_address,
        )
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
            harness_options=self.harness_options,
            # The proxy sends this trial's model calls to this worker's gateway (verl's replicas).
            gateway_target=target,
        )
        pad = _pad_id(self.tokenizer)
        info = {"trial_id": trial_id}
        try:
            status = await run_trial(self.sandbox_target, spec, self.service_token, self.poll_s, self.trial_deadline_s)
            log.info("trial finished", extra={"kv": {"trial": trial_id, "reward": status.reward}})
            traj = await fetch_trajectory(self.capture_target, spec.run_id, trial_id, self.service_token)
        except TimeoutError:
            return masked_output("trial_deadline", info, pad, engine.route_shape)
        except (grpc.aio.AioRpcError, HarnessError, OSError) as e:
            # One trial's infrastructure failure is a masked row, never the batch's failure.
            return masked_output("sandbox_error", info | {"error": str(e)[:500]}, pad, engine.route_shape)
        return trajectory_to_output(
            traj,
            int(self.rollout_config.response_length),
            prompt_length=int(self.rollout_config.prompt_length),
            pad_id=pad,
            route_shape=engine.route_shape,
        )


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
