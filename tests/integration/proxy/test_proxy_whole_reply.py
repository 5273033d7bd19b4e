"""The proxy asks the gateway for a whole reply (``GenerateRequest.whole_reply``: one
message at the end) exactly when its client takes the reply only at its end and no
stop string has to be watched for while it is sampled: every API unstreamed; never
streamed, never with ``stop`` / ``stop_sequences``, never when tool forcing stops at
the parser's markers. It asks for wide events (``GenerateRequest.wide_events``) exactly
when no stop string is watched, streamed or not. A real gRPC server records what the
real proxy sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import openai

from harnessrl.arrays import F32, I32, U8
from harnessrl.localservers import free_port
from harnessrl.paths import default_model_dir
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc, records_pb2
from services.proxy.chat.tokenizer import Tokenizer
from tests.integration.proxy.stack import MODEL, Stack, script
from tests.integration.proxy.test_proxy_engine_errors import _serve_gateway

MSG = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]


class RecordingGateway(gateway_pb2_grpc.RolloutGatewayServicer):
    """Answers every call "Hello there." in one chunk and keeps what each asked."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = np.asarray(ids, I32)
        self.whole: list[bool] = []
        self.wide: list[bool] = []

    async def Health(self, request: Any, context: Any) -> gateway_pb2.GatewayHealthResponse:
        return gateway_pb2.GatewayHealthResponse(model=MODEL, context_window=4096)

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[gateway_pb2.GenerateChunk]:
        self.whole.append(request.whole_reply)
        self.wide.append(request.wide_events)
        n = len(self.ids)
        tokens = records_pb2.TokenArrays(
            ids=self.ids.tobytes(),
            mask=np.ones(n, U8).tobytes(),
            logprobs=np.full(n, -0.5, F32).tobytes(),
            policy_versions=np.zeros(n, I32).tobytes(),
        )
        usage = records_pb2.Usage(completion_tokens=n)
        yield gateway_pb2.GenerateChunk(tokens=tokens, finish_reason="stop", usage=usage)

    async def Abort(self, request: Any, context: Any) -> gateway_pb2.AbortResponse:
        return gateway_pb2.AbortResponse()


def test_only_calls_without_stop_strings_ask_for_a_whole_reply_or_wide_events(tmp_path: Path) -> None:
    tokenizer = Tokenizer(default_model_dir())
    gateway = RecordingGateway([*tokenizer.encode("Hello there."), tokenizer.stop_ids[0]])
    port = free_port()
    stack = Stack(tmp_path, script(tmp_path, {"*": [{"content": "unused"}]}), gateway_target=f"127.0.0.1:{port}")
    server = stack.run(_serve_gateway(gateway, port))
    try:
        base, token = stack.new_trial("whole")
        oa = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
        an = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0)
        texts = [
            oa.chat.completions.create(model=MODEL, messages=MSG).choices[0].message.content,  # type: ignore[arg-type]
            "".join(
                c.choices[0].delta.content or ""
                for c in oa.chat.completions.create(model=MODEL, messages=MSG, stream=True)  # type: ignore[arg-type]
                if c.choices
            ),
            oa.chat.completions.create(model=MODEL, messages=MSG, stop=["zz"]).choices[0].message.content,  # type: ignore[arg-type]
            oa.chat.completions.create(model=MODEL, messages=MSG, tools=TOOLS, tool_choice="none")  # type: ignore[arg-type]
            .choices[0]
            .message.content,
            an.messages.create(model=MODEL, max_tokens=20, messages=MSG).content[0].text,  # type: ignore[arg-type, union-attr]
            an.messages.create(model=MODEL, max_tokens=20, messages=MSG, stop_sequences=["zz"]).content[0].text,  # type: ignore[arg-type, union-attr]
            oa.responses.create(model=MODEL, input="hi").output_text,
        ]
        with an.messages.stream(model=MODEL, max_tokens=20, messages=MSG) as s:  # type: ignore[arg-type]
            texts.append(s.get_final_text())
        events = oa.responses.create(model=MODEL, input="hi", stream=True)
        texts.append("".join(e.delta for e in events if e.type == "response.output_text.delta"))
        stopped = oa.chat.completions.create(model=MODEL, messages=MSG, stream=True, stop=["zz"])  # type: ignore[arg-type]
        texts.append("".join(c.choices[0].delta.content or "" for c in stopped if c.choices))
        assert texts == ["Hello there."] * 10
        assert gateway.whole == [True, False, False, False, True, False, True, False, False, False]
        assert gateway.wide == [True, True, False, False, True, False, True, True, True, False]
    finally:
        stack.run(server.stop(0))
        stack.stop()
