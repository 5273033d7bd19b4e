"""gRPC server of the gateway: a thin servicer over :class:`GatewayService`.

``create_server(settings)`` builds the engines named by ``settings.engine``,
starts them (loads the model), then serves; stopping the server closes them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import grpc
import numpy as np

from harnessrl.arrays import make_tokens, unpack_i32
from harnessrl.rpc import RunningServer, start_server
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc, records_pb2
from services.gateway.engines.base import F32, I32, Chunk, Sampling
from services.gateway.errors import EngineFailed
from services.gateway.registry import create_engines
from services.gateway.service import GatewayService, Output
from services.gateway.settings import Settings

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["RolloutGateway"].full_name


def sampling_from_proto(msg: gateway_pb2.SamplingParams) -> Sampling:
    return Sampling(
        temperature=msg.temperature,
        top_p=msg.top_p,
        top_k=msg.top_k,
        max_tokens=msg.max_tokens,
        stop_token_ids=tuple(msg.stop_token_ids),
        seed=msg.seed,
        return_routed_experts=msg.return_routed_experts,
        top_logprobs=msg.top_logprobs,
        stop=tuple(msg.stop),
    )


def chunk_tokens(c: Chunk) -> records_pb2.TokenArrays:
    """The chunk's arrays on the wire (every token sampled: mask 1). One message per
    token on a streamed reply: bytes straight from the arrays, lengths checked."""
    n = len(c)
    ids = np.asarray(c.ids, I32).tobytes()
    logprobs, versions = np.asarray(c.logprobs, F32).tobytes(), np.asarray(c.versions, I32).tobytes()
    if len(logprobs) != 4 * n or len(versions) != 4 * n:
        raise EngineFailed(f"the engine sent {n} ids, {len(logprobs) // 4} logprobs, {len(versions) // 4} versions")
    if c.routed_experts is not None:
        return make_tokens(c.ids, np.ones(n, np.uint8), c.logprobs, c.versions, c.routed_experts)
    return records_pb2.TokenArrays(ids=ids, mask=b"\x01" * n, logprobs=logprobs, policy_versions=versions)


def chunk_to_proto(out: Output) -> gateway_pb2.GenerateChunk:
    c = out.chunk
    msg = gateway_pb2.GenerateChunk(tokens=chunk_tokens(c), finish_reason=c.finish_reason, replica=out.replica)
    if c.top_ids is not None and c.top_logprobs is not None:
        msg.top_logprobs.CopyFrom(
            gateway_pb2.TopLogprobs(
                k=c.top_ids.shape[1] if c.top_ids.ndim == 2 else 0,
                ids=c.top_ids.astype(I32, copy=False).tobytes(),
                logprobs=c.top_logprobs.astype(F32, copy=False).tobytes(),
            )
        )
    if out.usage is not None:
        u = out.usage
        msg.usage.CopyFrom(
            records_pb2.Usage(
                prompt_tokens=u.prompt_tokens,
                completion_tokens=u.completion_tokens,
                cached_prompt_tokens=u.cached_prompt_tokens,
            )
        )
    return msg


class GatewayServicer(gateway_pb2_grpc.RolloutGatewayServicer):
    def __init__(self, service: GatewayService) -> None:
        self.service = service

    async def Generate(
        self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.GenerateChunk]:
        prompt = unpack_i32(request.prompt_ids, "prompt_ids")
        sampling = sampling_from_proto(request.sampling)
        stream = self.service.generate(
            request.request_id,
            request.trial_id,
            request.thread,
            prompt,
            sampling,
            whole=request.whole_reply,
            wide=request.wide_events,
        )
        async for out in stream:
            yield chunk_to_proto(out)

    async def Abort(
        self, request: gateway_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.AbortResponse:
        return gateway_pb2.AbortResponse(aborted=await self.service.abort(request.request_id, request.trial_id))

    async def Pause(
        self, request: gateway_pb2.PauseRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.PauseResponse:
        return gateway_pb2.PauseResponse(held=await self.service.pause(request.timeout_s))

    async def Resume(
        self, request: gateway_pb2.ResumeRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ResumeResponse:
        return gateway_pb2.ResumeResponse(resumed=await self.service.resume())

    async def UpdateWeights(
        self, request: gateway_pb2.UpdateWeightsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.UpdateWeightsResponse:
        seconds = await self.service.update_weights(request.version, request.checkpoint_path, dict(request.options))
        return gateway_pb2.UpdateWeightsResponse(version=request.version, seconds=seconds)

    async def Health(
        self, request: gateway_pb2.GatewayHealthRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.GatewayHealthResponse:
        h = self.service.health()
        replicas = [
            gateway_pb2.ReplicaHealth(
                name=r.name,
                state=r.state,
                in_flight=r.in_flight,
                policy_version=r.policy_version,
                engine=r.engine,
                error=r.error,
            )
            for r in h.replicas
        ]
        return gateway_pb2.GatewayHealthResponse(
            model=h.model,
            context_window=h.context_window,
            policy_version=h.policy_version,
            paused=h.paused,
            replicas=replicas,
        )


class GatewayServer(RunningServer):
    """A running gateway: the gRPC server plus the service whose engines it closes on stop."""

    def __init__(self, running: RunningServer, service: GatewayService) -> None:
        super().__init__(running.server, running.port, running.health, running.services, running.grace)
        self.service = service

    async def stop(self, grace: float | None = None) -> None:
        await super().stop(grace)
        await self.service.close()


async def create_server(settings: Settings) -> GatewayServer:
    """Builds and starts the engines (model loading happens here), then serves."""
    service = GatewayService(create_engines(settings), settings)
    await service.start()
    servicer = GatewayServicer(service)

    def register(server: grpc.aio.Server) -> Iterable[str]:
        gateway_pb2_grpc.add_RolloutGatewayServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    try:
        running = await start_server(settings, "gateway", register)
    except BaseException:
        await service.close()
        raise
    return GatewayServer(running, service)
