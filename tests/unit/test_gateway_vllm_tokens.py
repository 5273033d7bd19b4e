"""vLLM's token endpoint as the vLLM engine reads it: events, weight-version spans,
and the holdback that keeps versions exact when events carry many tokens."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.gateway.engines.base import F32, I32, Chunk, GenerateInput, Sampling
from services.gateway.engines.vllm_tokens import Holdback, generate_body, parse_event, span_versions
from services.gateway.errors import EngineFailed


def event(ids: list[int], finish: str | None = None, spans: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [
        {"token_id": t, "logprob": -0.5 - i, "top_logprobs": [{"token_id": t, "logprob": -0.5 - i}]}
        for i, t in enumerate(ids)
    ]
    choice = {"index": 0, "token_ids": ids, "logprobs": {"content": content}, "finish_reason": finish}
    return {"choices": [choice | {"weight_versions": spans}]}


def chunk(n: int, version: int) -> Chunk:
    return Chunk(np.arange(n, dtype=I32), np.zeros(n, F32), np.full(n, version, I32))


def test_body_asks_for_tokens_logprobs_and_the_interval() -> None:
    sampling = Sampling(temperature=0.7, top_p=0.9, top_k=0, stop_token_ids=(2,), seed=5, top_logprobs=3)
    body = generate_body("m", GenerateInput("r1", "t", "main", np.array([1, 2, 3], I32), sampling, 64), 16)
    assert body["token_ids"] == [1, 2, 3] and body["stream"] is True and body["request_id"] == "r1"
    params = body["sampling_params"]
    assert params == {
        "max_tokens": 64,
        "temperature": 0.7,
        "top_p": pytest.approx(0.9),
        "top_k": -1,
        "logprobs": 3,
        "stream_interval": 16,
        "stop_token_ids": [2],
        "seed": 5,
    }


def test_an_event_is_stamped_and_its_spans_come_with_the_last() -> None:
    one, finish, _, spans = parse_event(event([5, 6]), 3, 0)
    assert one is not None and one.ids.tolist() == [5, 6] and one.versions.tolist() == [3, 3]
    assert one.logprobs.tolist() == [-0.5, -1.5] and finish == "" and spans is None
    spans_in = [{"version": "default", "start": 0, "end": 2}]
    _, finish, _, spans = parse_event(event([7], "length", spans_in), 3, 0)
    assert finish == "length" and spans == spans_in
    usage = {"usage": {"prompt_tokens_details": {"cached_tokens": 12}}, "choices": []}
    assert parse_event(usage, 0, 0)[2] == 12


def test_logprobs_for_other_tokens_than_the_ids_fail() -> None:
    bad = event([5, 6])
    bad["choices"][0]["logprobs"]["content"][1]["token_id"] = 9
    with pytest.raises(EngineFailed, match="token ids"):
        parse_event(bad, 0, 0)


def test_top_logprobs_are_the_k_most_likely_sorted() -> None:
    ev = event([5])
    ev["choices"][0]["logprobs"]["content"][0]["top_logprobs"] = [
        {"token_id": 5, "logprob": -3.0},
        {"token_id": 8, "logprob": -0.1},
        {"token_id": 9, "logprob": -1.0},
        {"token_id": 4, "logprob": -9999.0},
    ]
    one, *_ = parse_event(ev, 0, 3)
    assert one is not None and one.top_ids is not None and one.top_logprobs is not None
    assert one.top_ids.tolist() == [[8, 9, 5]] and one.top_logprobs[0].tolist() == pytest.approx([-0.1, -1.0, -3.0])
    one, *_ = parse_event(ev, 0, 5)
    assert one is not None and one.top_logprobs is not None and one.top_logprobs[0, 3:].tolist() == [-np.inf] * 2


def test_spans_map_labels_to_versions() -> None:
    spans = [{"version": "default", "start": 0, "end": 3}, {"version": "4", "start": 3, "end": 5}]
    assert span_versions(spans, 5, initial=2).tolist() == [2, 2, 2, 4, 4]
    assert span_versions(None, 0, 0).tolist() == []


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        (None, "no weight_versions"),
        ([{"version": "default", "start": 0, "end": 2}], "do not cover"),
        ([{"version": "run-a", "start": 0, "end": 3}], "integer policy versions"),
    ],
)
def test_spans_that_do_not_say_fail(spans: list[dict[str, Any]] | None, message: str) -> None:
    with pytest.raises(EngineFailed, match=message):
        span_versions(spans, 3, 0)


def test_holdback_passes_tokens_until_the_version_changes_then_stamps_the_rest() -> None:
    hold = Holdback(epoch=1, version=0)
    first = [chunk(2, 0)]
    assert hold.take(first, 1) == first
    assert hold.take([chunk(3, 1)], 2) == []  # a resume: the next event may mix old and new tokens
    assert hold.take([chunk(1, 1)], 2) == []
    spans = [{"version": "default", "start": 0, "end": 3}, {"version": "1", "start": 3, "end": 6}]
    released = hold.finish(spans, initial=0)
    assert [c.versions.tolist() for c in released] == [[0, 1, 1], [1]]


def test_holdback_fails_a_reply_whose_sent_versions_the_engine_contradicts() -> None:
    hold = Holdback(epoch=1, version=0)
    hold.take([chunk(2, 0)], 1)
    with pytest.raises(EngineFailed, match="vLLM says"):
        hold.finish([{"version": "3", "start": 0, "end": 2}], initial=0)


def test_a_reply_with_no_version_change_is_never_held() -> None:
    hold = Holdback(epoch=4, version=2)
    for _ in range(3):
        assert len(hold.take([chunk(16, 2)], 4)) == 1
    assert hold.finish([{"version": "2", "start": 0, "end": 48}], initial=0) == []
