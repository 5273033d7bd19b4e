"""The verl cluster path's engine side: a gateway engine whose sampler is verl's server
manager (``VerlServerEngine``), and the in-process gateway each verl AgentLoopWorker serves
it from (``WorkerGateway``, ``serve_engine``); ``stack/verl/agent_loop.py`` is the loop.

Sampling: verl's ``sampling_params`` (temperature, top_p, top_k,
repetition_penalty: verl's ``actor_rollout_ref.rollout`` settings, or its
``val_kwargs`` when validating) govern every model call of the trial: the engine
adapter sends them to verl's replicas whatever the harness or the proxy asked, and
caps each call's max tokens at verl's ``response_length``. ``harnessrl verl
prepare`` writes the run config's temperature into verl's rollout settings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import numpy as np

from harnessrl.errors import FailedPrecondition, InvalidArgument
from harnessrl.rpc import check_target
from services.gateway.engines.base import Chunk, Engine, EngineInfo, GenerateInput
from services.gateway.errors import ContextLengthExceeded
from stack.verl import address as verl_address
from stack.verl.checks import AGENT_NAME

log = logging.getLogger(__name__)


# -- the engine adapter ---------------------------------------------------------------------


class VerlServerEngine(Engine):
    """A gateway engine whose sampler is verl's server manager (its vLLM/SGLang replicas).

    Weight versions are verl's business (its trainer syncs its replicas and tells
    each its version, ``set_global_steps``); every reply of verl's server manager
    reports the versions that sampled it (``TokenOutput.extra_fields``:
    ``min_global_steps``/``max_global_steps``, a span when verl resumed the call
    across a weight sync, partial rollout). A call's tokens are stamped with its
    ``min_global_steps``: verl does not say which token came from which version, and
    the oldest never makes a token look fresher than it is. ``policy_version`` is the
    latest version reported; before any report (a replica not yet synced reports
    None) it is ``initial_version``, the agent loop's explicit setting, and the
    engine logs that it fell back.

    ``context_window`` is verl's replicas' real limit (``engine_context_window``):
    the gateway refuses a longer prompt as ``ContextLengthExceeded`` before verl is
    called (and a refusal by verl's server is mapped to the same), so the proxy ends
    the trial ``context_overflow``. That termination reason is chosen on purpose: it
    is a *policy* reason (trained with the verifier's reward, as on the CPU path), not
    an infrastructure one. The window is the run's configuration, the same for every
    trial of a group; a policy whose context outgrows it (verbose tool use, loops) did
    so by its own actions, and masking those trials as infra failures would hide
    exactly the behaviour the reward should discourage. A window wrongly reported
    (the old fixed 32768) would instead have surfaced as verl's engine error, an
    infra reason, silently dropping those trials.
    """

    kind = "verl"

    def __init__(
        self,
        server_manager: Any,
        vocab_size: int,
        name: str = "verl-0",
        *,
        context_window: int,
        initial_version: int = 0,
    ) -> None:
        super().__init__(name)
        if context_window < 2:
            raise InvalidArgument(f"verl engine: context_window must be >= 2, got {context_window}")
        self.vocab_size = vocab_size
        self.server_manager = server_manager
        self.policy_version = initial_version
        self.reported = False  # True once a replica reported a version
        self.context_window = context_window
        # (layers, top-k) of the routes verl's replicas returned, once seen: masked rows carry
        # zero routes of this shape so a batch where other rows have routes concatenates.
        self.route_shape: tuple[int, int] | None = None
        self._in_flight = 0
        # trial id -> (verl's sampling params, verl's response_length): what governs its calls.
        self._governed: dict[str, tuple[dict[str, Any], int]] = {}
        self._latest: dict[str, int] = {}  # governed trial -> newest version a reply reported

    def govern(self, trial_id: str, sampling_params: Mapping[str, Any], response_length: int) -> None:
        """From now until ``release``, the trial's calls sample with verl's parameters."""
        numeric = (int, float)
        if not isinstance(sampling_params.get("temperature"), numeric) or not all(
            isinstance(sampling_params[k], numeric) for k in ("top_p", "top_k") if sampling_params.get(k) is not None
        ):
            raise InvalidArgument(
                f"verl's sampling_params need a numeric temperature (top_p, top_k): {sampling_params}"
            )
        if response_length < 1:
            raise InvalidArgument(f"verl's response_length must be >= 1, got {response_length}")
        self._governed[trial_id] = (dict(sampling_params), response_length)

    def release(self, trial_id: str) -> None:
        self._governed.pop(trial_id, None)
        self._latest.pop(trial_id, None)

    def sampling_for(self, request: GenerateInput) -> dict[str, Any]:
        """The parameters sent to verl's server manager: verl's for a governed trial (the
        request's own only where verl has none: seed, a budget below verl's cap)."""
        s = request.sampling
        asked = request.budget or s.max_tokens
        params: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p or 1.0, "logprobs": True}
        if s.top_k:
            params["top_k"] = s.top_k
        if request.trial_id in self._governed:
            verl, cap = self._governed[request.trial_id]
            keys = ("temperature", "top_p", "top_k", "repetition_penalty")
            params = {k: verl[k] for k in keys if verl.get(k) is not None}
            params["logprobs"] = True  # always: the captured logprobs are the replicas'
            asked = min(asked, cap) if asked else cap
        if asked:
            params["max_tokens"] = int(asked)
        if s.seed:
            params["seed"] = s.seed
        return params

    async def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        params = self.sampling_for(request)
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
        except ValueError as e:  # through Ray too: a RayTaskError is also its cause's class
            if "context length" not in str(e):
                raise
            # verl's vLLM server: "Prompt length (n) leaves no room ... maximum context length".
            # The same outcome as the gateway's own check: context_overflow, a policy reason.
            raise ContextLengthExceeded(len(request.prompt_ids), self.context_window, str(e)[:300]) from e
        finally:
            self._in_flight -= 1
        chunk = output_to_chunk(out, len(request.prompt_ids), self._version_of(out, request.trial_id))
        if chunk.routed_experts is not None and chunk.routed_experts.ndim == 3:
            self.route_shape = (int(chunk.routed_experts.shape[1]), int(chunk.routed_experts.shape[2]))
        yield chunk

    def _version_of(self, out: Any, trial_id: str) -> int:
        """The version stamped on one reply's tokens (see the class docstring); the
        reply's span widens its governed trial's (``latest``)."""
        extra = getattr(out, "extra_fields", None) or {}
        low = extra.get("min_global_steps", extra.get("global_steps"))
        high = extra.get("max_global_steps", extra.get("global_steps", low))
        if low is None:
            if not self.reported:
                log.warning(
                    "verl replica reported no weight version; stamping initial_policy_version",
                    extra={"kv": {"version": self.policy_version}},
                )
            return self.policy_version
        low, high = int(low), int(high if high is not None else low)
        self.reported = True
        self.policy_version = max(self.policy_version, high)
        if trial_id in self._governed:
            self._latest[trial_id] = max(self._latest.get(trial_id, high), high)
        return low

    def latest(self, trial_id: str) -> int | None:
        """The newest version any reply of the trial reported (its tokens carry each
        reply's oldest), None before one; kept until ``release``."""
        return self._latest.get(trial_id)

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


# -- the worker's gateway -------------------------------------------------------------------


class WorkerGateway:
    """One in-process gateway per verl AgentLoopWorker, serving the engine adapter on 127.0.0.1."""

    def __init__(self) -> None:
        self.target: str | None = None
        self.engine: VerlServerEngine | None = None
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._server: Any = None

    async def ensure(
        self,
        server_manager: Any,
        vocab_size: int,
        bind: str = "127.0.0.1",
        address: str = "",
        *,
        context_window: int,
        initial_version: int = 0,
    ) -> tuple[str, VerlServerEngine]:
        """The worker's gateway, started on first use: bound to ``bind`` and named to the
        proxy as ``address:port`` (``address`` defaults to ``bind``; with ``bind`` 0.0.0.0,
        to this node's address as its routes pick it, ``verl_address.advertised_host``)."""
        async with self._lock():
            if self.target is None or self.engine is None:
                self.engine = VerlServerEngine(
                    server_manager, vocab_size, context_window=context_window, initial_version=initial_version
                )
                self._server, port = await serve_engine(self.engine, bind)
                # Never gethostbyname(gethostname()): 127.0.1.1 on stock Debian (stack/verl/address.py).
                host = verl_address.advertised_host(bind, address)
                self.target = check_target(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
            elif self.engine.context_window != context_window:
                # One worker process runs one verl config: two windows are a bug, not a choice.
                raise FailedPrecondition(
                    f"{AGENT_NAME}: this worker's gateway serves a {self.engine.context_window}-token window, "
                    f"a loop asks for {context_window}"
                )
            return self.target, self.engine

    def _lock(self) -> asyncio.Lock:
        # One lock per event loop: verl runs one loop per worker, a process that runs several
        # loops in turn (tests) must not reuse a lock bound to a finished one.
        loop = asyncio.get_running_loop()
        if loop not in self._locks:
            self._locks = {loop: asyncio.Lock()}
        return self._locks[loop]

    async def close(self) -> None:
        """Stops the worker's gateway (verl ends workers by killing them; tests call this)."""
        async with self._lock():
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
