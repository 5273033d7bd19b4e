"""The vLLM engine's wire format: the completion body sent for a request, and
decoding of vLLM's routed-experts payload (base64 ``.npy``), without a server."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from services.gateway.engines.base import GenerateInput, Sampling
from services.gateway.engines.vllm_completions import completion_body, decode_routes, parse_top_logprobs
from services.gateway.errors import EngineFailed


def npy_b64(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def test_completion_body_sends_token_ids_and_asks_for_ids_and_logprobs() -> None:
    sampling = Sampling(temperature=0.7, top_p=0.0, top_k=0, stop_token_ids=(2,), seed=9, max_tokens=0)
    body = completion_body("m", GenerateInput("r1", "t", "main", np.asarray([1, 5], np.int32), sampling, 77), True)
    assert body["prompt"] == [1, 5] and body["max_tokens"] == 77 and body["model"] == "m"
    assert body["logprobs"] == 1 and body["return_token_ids"] is True and body["stream"] is True
    assert body["top_p"] == 1.0 and body["top_k"] == -1  # 0 disables, as in the gateway's contract
    assert body["stop_token_ids"] == [2] and body["seed"] == 9 and body["request_id"] == "r1"
    assert body["stream_options"] == {"include_usage": True} and "routed_experts_prompt_start" not in body
    routed = Sampling(return_routed_experts=True)
    body = completion_body("m", GenerateInput("r", "", "", np.asarray([1, 5, 6], np.int32), routed, 4), False)
    assert body["routed_experts_prompt_start"] == 3 and "seed" not in body and "stream_options" not in body


def test_routes_are_aligned_to_reply_tokens_with_a_zero_last_row() -> None:
    routes = np.arange(3 * 2 * 2, dtype=np.int32).reshape(3, 2, 2)  # 4 reply tokens -> 3 forwarded
    out = decode_routes(npy_b64(routes), 4)
    assert out is not None and out.dtype == np.uint8 and out.shape == (4, 2, 2)
    assert out[:3].tolist() == routes.tolist() and not out[3].any()
    assert decode_routes(None, 4) is None


def test_bad_routes_payloads_are_engine_errors() -> None:
    with pytest.raises(EngineFailed, match="3 dims"):
        decode_routes(npy_b64(np.zeros((2, 2), np.int32)), 2)
    with pytest.raises(EngineFailed, match="above 255"):
        decode_routes(npy_b64(np.full((1, 1, 1), 300, np.int32)), 2)


def test_top_logprobs_ask_for_token_ids_and_parse_most_likely_first() -> None:
    sampling = Sampling(top_logprobs=3)
    body = completion_body("m", GenerateInput("r", "", "", np.asarray([1], np.int32), sampling, 4), True)
    assert body["logprobs"] == 3 and body["return_tokens_as_token_ids"] is True
    plain = completion_body("m", GenerateInput("r", "", "", np.asarray([1], np.int32), Sampling(), 4), True)
    assert plain["logprobs"] == 1 and "return_tokens_as_token_ids" not in plain
    # vLLM lists the sampled token too (here 7, outside the top 3 at position 0), keyed token_id:N.
    rows = [
        {"token_id:5": -0.5, "token_id:9": -1.5, "token_id:3": -1.0, "token_id:7": -4.0},
        {"token_id:8": -0.1, "token_id:4": -9999.0},  # -9999: vLLM's clamped -inf
    ]
    ids, values = parse_top_logprobs({"top_logprobs": rows}, 2, 3)
    assert ids is not None and values is not None
    assert ids.tolist()[0] == [5, 3, 9] and values.tolist()[0] == [-0.5, -1.0, -1.5]
    assert ids.tolist()[1][0] == 8 and values[1, 0] == np.float32(-0.1) and np.isneginf(values[1, 1:]).all()
    assert parse_top_logprobs({}, 2, 3) == (None, None)
