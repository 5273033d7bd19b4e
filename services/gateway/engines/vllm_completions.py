"""The wire format of vLLM's ``/v1/completions`` over token ids, as the vLLM engine
speaks it: the request body, top logprobs keyed ``token_id:N``, routed experts."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import numpy.typing as npt

from services.gateway.engines.base import F32, I32, GenerateInput
from services.gateway.errors import EngineFailed

FINISH = {"stop": "stop", "length": "length", "abort": "abort"}
VLLM_NEG_INF = -9999.0


def sampling_fields(request: GenerateInput) -> dict[str, Any]:
    """vLLM's sampling parameters for a request (both endpoints name them alike)."""
    s = request.sampling
    fields: dict[str, Any] = {
        "max_tokens": request.budget,
        "temperature": s.temperature,
        "top_p": s.top_p if 0 < s.top_p <= 1 else 1.0,
        "top_k": s.top_k if s.top_k > 0 else -1,
        "logprobs": max(1, s.top_logprobs),
    }
    if s.stop_token_ids:
        fields["stop_token_ids"] = list(s.stop_token_ids)
    if s.stop:
        # vLLM ends the reply at the token completing a stop string (its ids stop
        # there, its text is cut), so no event carries tokens sampled past one.
        fields["stop"] = list(s.stop)
    if s.seed:
        fields["seed"] = s.seed % (2**63)
    return fields


def completion_body(model: str, request: GenerateInput, stream: bool) -> dict[str, Any]:
    s = request.sampling
    body: dict[str, Any] = {"model": model, "prompt": request.prompt_ids.tolist(), **sampling_fields(request)}
    body |= {"return_token_ids": True, "stream": stream, "request_id": request.request_id}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if s.top_logprobs:
        body["return_tokens_as_token_ids"] = True
    if s.return_routed_experts:
        body["routed_experts_prompt_start"] = int(request.prompt_ids.shape[0])
    return body


def parse_top_logprobs(
    logprobs: dict[str, Any], n: int, k: int
) -> tuple[npt.NDArray[np.int32] | None, npt.NDArray[np.float32] | None]:
    """vLLM's ``top_logprobs`` (one ``{"token_id:N": logprob}`` per token, the sampled
    token among them) -> the k most likely ids and logprobs [n, k], -inf for excluded and padding;
    None when vLLM sent none for every token."""
    rows = logprobs.get("top_logprobs")
    if not isinstance(rows, list) or len(rows) != n:
        return None, None
    ids, values = np.zeros((n, k), I32), np.full((n, k), -np.inf, F32)
    for i, row in enumerate(rows):
        pairs = sorted(((float(v), key) for key, v in (row or {}).items() if key.startswith("token_id:")), reverse=True)
        for j, (value, key) in enumerate(pairs[:k]):
            # vLLM clamps -inf (a token the sampling filters exclude) to OpenAI's -9999.
            ids[i, j], values[i, j] = int(key[len("token_id:") :]), value if value > VLLM_NEG_INF else -np.inf
    return ids, values


def decode_routes(encoded: str | None, num_tokens: int) -> np.ndarray | None:
    """vLLM's base64 ``.npy`` routes [rows, layers, top_k] -> uint8 [num_tokens, layers, top_k].

    Rows start at the first reply token; the last sampled token was never fed
    forward, so it has no row and gets zeros."""
    if not encoded:
        return None
    routes = np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)
    if routes.ndim != 3:
        raise EngineFailed(f"vLLM returned routed experts of shape {routes.shape}, expected 3 dims")
    if routes.size and int(routes.max()) > 255:
        raise EngineFailed("vLLM returned expert indices above 255; they do not fit uint8")
    out = np.zeros((num_tokens, routes.shape[1], routes.shape[2]), np.uint8)
    rows = min(num_tokens, routes.shape[0])
    out[:rows] = routes[:rows]
    return out
