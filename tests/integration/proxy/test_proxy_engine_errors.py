"""Engine failures reach the harness as the status its SDK retries on (or
does not): retryable trouble is 503 / Anthropic 529 with x-should-retry: true,
a permanent failure 500 with x-should-retry: false; a failure mid-stream is an
error event; none of them records a turn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import grpc
import numpy as np
import openai
import pytest
from prometheus_client import REGISTRY

from harnessrl.arrays import F32, I32, U8
from harnessrl.localservers import free_port
from harnessrl.paths import default_model_dir
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc, records_pb2
from services.proxy.chat.tokenizer import Tokenizer
from tests.integration.proxy.stack import MODEL, Stack, script

MSG = [{"role": "user", "content": "hi"}]


def test_engine_down_is_retryable_for_both_sdks(tmp_path: Path) -> None:
    stack = Stack(tmp_path, script(tmp_path, {"*": [{"content": "x"}]}))
    try:
        base, token = stack.new_trial("down")
        stack.run(stack.gateway.stop(0))
        with pytest.raises(openai.InternalServerError) as oe:
            openai.OpenAI(base_url=base, api_key=token, max_retries=1).chat.completions.create(
                model=MODEL, messages=MSG
            )  # type: ignore[arg-type]
        assert oe.value.status_code == 503 and oe.value.response.headers["x-should-retry"] == "true"
        client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as ae:
            client.messages.create(model=MODEL, max_tokens=5, messages=MSG)  # type: ignore[arg-type]
        assert ae.value.status_code == 529 and ae.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        summary = stack.close_trial("down")
        assert summary["engine_error"] and summary["engine_errors"] == 3, "the openai SDK retried once"
        assert summary["num_turns"] == 0 and stack.export("down") == []
    finally:
        stack.stop()


def test_permanent_engine_failure_is_not_retried(tmp_path: Path) -> None:
    stack = Stack(tmp_path, script(tmp_path, {"*": [{"content": "once"}]}, on_exhausted="error"))
    try:
        base, token = stack.new_trial("permanent")
        c = openai.OpenAI(base_url=base, api_key=token, max_retries=3)
        assert c.chat.completions.create(model=MODEL, messages=MSG).choices[0].message.content == "once"  # type: ignore[arg-type]
        with pytest.raises(openai.InternalServerError) as oe:
            c.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
        assert oe.value.status_code == 500 and oe.value.response.headers["x-should-retry"] == "false"
        assert "engine error" in str(oe.value)
        summary = stack.close_trial("permanent")
        assert summary["engine_errors"] == 1, "x-should-retry: false stops the SDK's retries"
        assert summary["num_turns"] == 1
    finally:
        stack.stop()


def test_engine_dying_mid_stream_is_an_error_event_and_no_turn(tmp_path: Path) -> None:
    slow = {"*": [{"content": "word " * 200}]}
    stack = Stack(tmp_path, script(tmp_path, slow, chunk_tokens=1, chunk_delay_s=0.02))
    try:
        base, token = stack.new_trial("midstream")
        c = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
        stream = c.chat.completions.create(model=MODEL, messages=MSG, stream=True)  # type: ignore[arg-type]
        got = []
        with pytest.raises(openai.APIError):
            for chunk in stream:
                got.append(chunk)
                if len(got) == 5:
                    stack.run(stack.gateway.stop(0))
        summary = stack.close_trial("midstream")
        assert summary["num_turns"] == 0 and summary["aborted_turns"] == 1 and summary["engine_error"]
        assert stack.export("midstream") == []
    finally:
        stack.stop()


class ShortLogprobsGateway(gateway_pb2_grpc.RolloutGatewayServicer):
    """A real gRPC gateway whose engine is broken: its replies carry one logprob
    (and one policy version) fewer than token ids. The proxy's only defence is its
    own check; our gateway would refuse to send such a chunk."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = np.asarray(ids, I32)

    async def Health(self, request: Any, context: Any) -> gateway_pb2.GatewayHealthResponse:
        return gateway_pb2.GatewayHealthResponse(model=MODEL, context_window=4096)

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[gateway_pb2.GenerateChunk]:
        n = len(self.ids)
        tokens = records_pb2.TokenArrays(
            ids=self.ids.tobytes(),
            mask=np.ones(n, U8).tobytes(),
            logprobs=np.full(n - 1, -0.5, F32).tobytes(),
            policy_versions=np.zeros(n - 1, I32).tobytes(),
        )
        usage = records_pb2.Usage(completion_tokens=n)
        yield gateway_pb2.GenerateChunk(tokens=tokens, finish_reason="stop", usage=usage)

    async def Abort(self, request: Any, context: Any) -> gateway_pb2.AbortResponse:
        return gateway_pb2.AbortResponse()


def _failures(kind: str) -> float:
    value = REGISTRY.get_sample_value("harnessrl_failures_total", {"service": "proxy", "kind": kind})
    return value or 0.0


async def _serve_gateway(servicer: gateway_pb2_grpc.RolloutGatewayServicer, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    gateway_pb2_grpc.add_RolloutGatewayServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


def test_engine_arrays_of_different_lengths_fail_the_turn(tmp_path: Path) -> None:
    tokenizer = Tokenizer(default_model_dir())
    ids = [*tokenizer.encode("Hello there."), tokenizer.stop_ids[0]]
    port = free_port()
    stack = Stack(tmp_path, script(tmp_path, {"*": [{"content": "unused"}]}), gateway_target=f"127.0.0.1:{port}")
    server = stack.run(_serve_gateway(ShortLogprobsGateway(ids), port))
    try:
        base, token = stack.new_trial("short")
        before = _failures("engine_arrays_mismatch")
        client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
        assert e.value.status_code == 500 and e.value.response.headers["x-should-retry"] == "false"
        assert f"{len(ids)} token ids but {len(ids) - 1} logprobs" in str(e.value)
        stream = client.chat.completions.create(model=MODEL, messages=MSG, stream=True)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError, match="logprobs"):
            list(stream)
        summary = stack.close_trial("short")
        assert summary["engine_error"] and summary["engine_errors"] == 2
        assert summary["num_turns"] == 0 and summary["aborted_turns"] == 2 and summary["proxy_errors"] == 0
        assert stack.export("short") == [], "no placeholder logprob reaches the capture"
        assert _failures("engine_arrays_mismatch") == before + 2
    finally:
        stack.run(server.stop(0))
        stack.stop()
