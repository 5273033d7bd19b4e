"""AppendSegment and GetTrajectory over real gRPC, on both backends."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from harnessrl import arrays
from harnessrl.v1 import records_pb2
from tests.integration.test_capture.conftest import Store, append_request, tokens


def _cat(*reqs):
    return {
        "ids": np.concatenate([arrays.unpack_i32(r.tokens.ids) for r in reqs]),
        "mask": np.concatenate([np.frombuffer(r.tokens.mask, np.uint8) for r in reqs]),
        "logprobs": np.concatenate([arrays.unpack_f32(r.tokens.logprobs) for r in reqs]),
        "versions": np.concatenate([arrays.unpack_i32(r.tokens.policy_versions) for r in reqs]),
    }


def _arrays(segment):
    r = segment.response
    return {
        "ids": arrays.unpack_i32(r.ids),
        "mask": np.frombuffer(r.mask, np.uint8),
        "logprobs": arrays.unpack_f32(r.logprobs),
        "versions": arrays.unpack_i32(r.policy_versions),
    }


async def _code(coro) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro
    return info.value.code()


async def test_segments_grow_part_by_part_and_read_back_exactly(store: Store) -> None:
    main0 = [append_request("r1", "t1", part=p, version=p, n=30 + p) for p in range(3)]
    main1 = [append_request("r1", "t1", segment=1, part=p, version=5, close=p == 1) for p in range(2)]
    side = [append_request("r1", "t1", thread="title", kind="side", part=0, close=True)]
    totals = []
    for req in main0 + main1 + side:
        resp = await store.append(req)
        assert not resp.duplicate
        totals.append(resp.segment_tokens)
    assert totals[:3] == [10 + 30, 10 + 30 + 31, 10 + 30 + 31 + 32]  # prompt + parts so far

    traj = await store.get("r1", "t1")
    assert [(s.key.thread, s.key.segment_index) for s in traj.segments] == [("main", 0), ("main", 1), ("title", 0)]
    seg0, seg1, title = traj.segments
    assert arrays.unpack_i32(seg0.prompt_ids).tolist() == list(range(10))
    assert arrays.unpack_i32(seg1.prompt_ids).tolist() == list(range(11))
    for seg, reqs in ((seg0, main0), (seg1, main1), (title, side)):
        got, want = _arrays(seg), _cat(*reqs)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert (seg0.num_turns, seg0.closed, seg1.closed, title.closed) == (3, True, True, True)  # s0 closed by s1
    assert seg0.usage.completion_tokens == 3 * 16 and seg0.model == "smollm2"
    assert title.thread_kind == "side" and not title.trainable
    assert list(traj.policy_versions_seen) == [0, 1, 2, 5]
    assert [(t.name, t.num_segments) for t in traj.threads] == [("main", 2), ("title", 1)]
    assert (traj.task_id, traj.group_id, traj.finalized) == ("task-a", "group-a", False)

    meta = await store.get("r1", "t1", include_tokens=False)
    assert len(meta.segments) == 3 and not meta.segments[0].response.ids and meta.segments[0].num_turns == 3


async def test_retry_is_duplicate_and_stored_once(store: Store) -> None:
    req = append_request("r1", "t1")
    first, again = await store.append(req), await store.append(req)
    assert (first.duplicate, again.duplicate) == (False, True)
    assert first.segment_tokens == again.segment_tokens
    other = append_request("r1", "t1", seed=999)
    assert await _code(store.append(other)) == grpc.StatusCode.FAILED_PRECONDITION
    traj = await store.get("r1", "t1")
    assert traj.segments[0].num_turns == 1
    np.testing.assert_array_equal(_arrays(traj.segments[0])["ids"], _cat(req)["ids"])


async def test_concurrent_retries_of_one_part_store_it_once(store: Store) -> None:
    req = append_request("r1", "t1")
    results = await asyncio.gather(*(store.append(req) for _ in range(8)))
    assert sorted(r.duplicate for r in results) == [False] + [True] * 7
    assert (await store.get("r1", "t1")).segments[0].num_turns == 1


async def test_gaps_and_closed_segments_are_refused_and_change_nothing(store: Store) -> None:
    await store.append(append_request("r1", "t1", part=0))
    refused = [
        append_request("r1", "t1", part=2),  # part gap
        append_request("r1", "t1", segment=1, part=1),  # segment never opened
        append_request("r1", "t1", segment=2, part=0),  # segment gap
        append_request("r1", "t1", thread="sub", segment=1, part=0, kind="subagent"),  # new thread starts at 0
        append_request("r1", "t1", part=1, kind="subagent"),  # thread kind changed
        append_request("r1", "t1", part=0, task="other-task", seed=5),  # conflicting part 0
        append_request("r1", "t2", part=1),  # unknown trial
    ]
    for req in refused:
        assert await _code(store.append(req)) == grpc.StatusCode.FAILED_PRECONDITION, req.key
    await store.append(append_request("r1", "t1", part=1, close=True))
    assert await _code(store.append(append_request("r1", "t1", part=2))) == grpc.StatusCode.FAILED_PRECONDITION
    traj = await store.get("r1", "t1")
    assert [(s.key.thread, s.num_turns) for s in traj.segments] == [("main", 2)]
    assert await _code(store.get("r1", "t2")) == grpc.StatusCode.NOT_FOUND


def _bad_requests():
    def mutate(fn, **kw):
        req = append_request("r1", "t1", **kw)
        fn(req)
        return req

    yield "short logprobs", mutate(lambda r: setattr(r.tokens, "logprobs", r.tokens.logprobs[:-4]))
    yield "ragged ids", mutate(lambda r: setattr(r.tokens, "ids", r.tokens.ids[:-1]))
    yield "mask of 2", mutate(lambda r: setattr(r.tokens, "mask", b"\x02" * 40))
    yield (
        "nan logprob",
        mutate(lambda r: setattr(r.tokens, "logprobs", arrays.pack_f32(np.full(40, np.nan, np.float32)))),
    )
    yield "no prompt", mutate(lambda r: setattr(r, "prompt_ids", b""))
    yield "no task", mutate(lambda r: setattr(r, "task_id", ""))
    yield "bad kind", mutate(lambda r: setattr(r, "thread_kind", "robot"))
    yield "bad run id", mutate(lambda r: setattr(r.key, "run_id", "../etc"))
    yield "empty trial", mutate(lambda r: setattr(r.key, "trial_id", ""))
    yield "prompt on part 1", mutate(lambda r: setattr(r, "prompt_ids", arrays.pack_i32([1])), part=1)
    yield "routes rows", mutate(lambda r: setattr(r.tokens.routed_experts, "num_tokens", 3), routes=(2, 2))
    yield "oversized", append_request("r1", "t1", n=5000, sampled=10)


@pytest.mark.parametrize("case", [name for name, _ in _bad_requests()])
async def test_malformed_appends_are_invalid_argument_and_write_nothing(make_store, case: str) -> None:
    req = dict(_bad_requests())[case]
    async with make_store(max_part_tokens=4096) as store:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await store.append(req)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details()  # a message that says what is wrong
        trial = req.key.trial_id or "t1"
        assert await _code(store.get("r1", trial)) in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)


async def test_routed_experts_round_trip(store: Store) -> None:
    reqs = [append_request("r1", "t1", part=p, routes=(4, 8)) for p in range(2)]
    plain = append_request("r1", "t1", part=2)
    for req in [*reqs, plain]:
        await store.append(req)
    seg = (await store.get("r1", "t1")).segments[0]
    routes = arrays.unpack_routes(seg.response.routed_experts)
    assert routes is not None and routes.shape == (120, 4, 8)
    for p, req in enumerate(reqs):
        np.testing.assert_array_equal(routes[p * 40 : (p + 1) * 40], arrays.unpack_routes(req.tokens.routed_experts))
    assert not routes[80:].any()  # a part without routes reads back as zero rows
    wrong = append_request("r1", "t1", part=3, routes=(2, 8))
    assert await _code(store.append(wrong)) == grpc.StatusCode.FAILED_PRECONDITION


async def test_many_concurrent_writers(store: Store) -> None:
    async def writer(w: int) -> list[int]:
        return [(await store.append(append_request("r1", f"t{w}", part=p, n=50 + w))).segment_tokens for p in range(4)]

    results = await asyncio.gather(*(writer(w) for w in range(64)))
    for w, totals in enumerate(results):
        assert totals == [10 + (50 + w) * (p + 1) for p in range(4)]
    listed = await store.list("r1", page_size=1000)
    assert len(listed.trajectories) == 64


async def test_float16_logprobs_when_configured(make_store) -> None:
    async with make_store(logprob_dtype="float16") as store:
        req = append_request("r1", "t1")
        await store.append(req)
        got = _arrays((await store.get("r1", "t1")).segments[0])["logprobs"]
        want = arrays.unpack_f32(req.tokens.logprobs)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        assert got.dtype == np.float32


async def test_nonstandard_mask0_values_are_kept_exactly(store: Store) -> None:
    req = append_request("r1", "t1")
    lp = arrays.unpack_f32(req.tokens.logprobs).copy()
    lp[0] = -3.5  # a mask-0 token with a logprob: kept, though the contract says 0.0
    req.tokens.logprobs = arrays.pack_f32(lp)
    req.tokens.policy_versions = arrays.pack_i32(np.full(40, 7))
    await store.append(req)
    got = _arrays((await store.get("r1", "t1")).segments[0])
    np.testing.assert_array_equal(got["logprobs"], lp)
    assert (got["versions"] == 7).all()


async def test_part_with_no_tokens_is_accepted(store: Store) -> None:
    req = append_request("r1", "t1")
    req.tokens.CopyFrom(tokens(0, n=0, sampled=0))
    req.usage.completion_tokens = 0
    assert (await store.append(req)).segment_tokens == 10


async def test_usage_is_derived_from_the_tokens_and_a_wrong_count_is_refused(store: Store) -> None:
    # part 0: prompt 10, 24 context + 16 sampled; part 1: 5 context + 7 sampled
    await store.append(append_request("r1", "tu", n=40, sampled=16))
    await store.append(append_request("r1", "tu", part=1, n=12, sampled=7))
    wrong = append_request("r1", "tu", part=2, n=8, sampled=3)
    wrong.usage.completion_tokens = 4
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await store.append(wrong)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "usage.completion_tokens is 4 but the part holds 3 sampled (mask 1) tokens" in (info.value.details() or "")
    seg = (await store.get("r1", "tu")).segments[0]
    assert seg.usage.completion_tokens == 16 + 7 == int(np.frombuffer(seg.response.mask, np.uint8).sum())
    assert seg.usage.prompt_tokens == (10 + 24) + (10 + 40 + 5), "what the engine saw at each call"


async def test_trajectory_too_large_for_one_message_is_refused_clearly(make_store) -> None:
    async with make_store(max_response_bytes=2**20) as store:
        await store.append(append_request("r1", "t1", n=100_000, sampled=10))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await store.get("r1", "t1")
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "without tokens" in (info.value.details() or "")
        assert (await store.get("r1", "t1", include_tokens=False)).segments[0].num_turns == 1


async def test_close_only_part_is_not_a_turn(store: Store) -> None:
    """The proxy closes a segment with an empty part: it is no model call and
    keeps the last call's finish reason."""
    await store.append(append_request("r1", "t1"))
    close = append_request("r1", "t1", part=1, close=True)
    close.tokens.CopyFrom(records_pb2.TokenArrays())
    close.ClearField("usage")  # as the proxy sends it
    close.finish_reason = ""
    await store.append(close)
    seg = (await store.get("r1", "t1")).segments[0]
    assert (seg.num_turns, seg.closed, seg.finish_reason) == (1, True, "tool_calls")
