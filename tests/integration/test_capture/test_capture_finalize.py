"""FinalizeTrajectory, group readiness, ListTrajectories and DeleteRun on both backends."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from harnessrl.v1 import records_pb2
from tests.integration.test_capture.conftest import Store, append_request, blob_objects, finalize_request

COMPLETED = records_pb2.TERMINATION_REASON_COMPLETED
ENV_FAILED = records_pb2.TERMINATION_REASON_ENV_SETUP_FAILED
MAX_TURNS = records_pb2.TERMINATION_REASON_MAX_TURNS


async def _code(coro) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro
    return info.value.code()


async def test_finalize_is_idempotent_and_recorded(store: Store) -> None:
    await store.append(append_request("r1", "t1", close=True))
    req = finalize_request("r1", "t1", verifier_summary="3 passed", harness_exit_code=0, metadata={"k": "v"})
    req.timings.agent_s = 12.5
    first, again = await store.finalize(req), await store.finalize(req)
    assert (first.group_ready, first.duplicate) == (True, False)
    assert (again.group_ready, again.duplicate) == (True, True)
    changed = finalize_request("r1", "t1", reward=0.0)
    assert await _code(store.finalize(changed)) == grpc.StatusCode.FAILED_PRECONDITION
    traj = await store.get("r1", "t1", include_tokens=False)
    assert (traj.finalized, traj.reward, traj.has_reward, traj.step) == (True, 1.0, True, 3)
    assert (traj.termination_reason, traj.harness, traj.verifier_summary) == (COMPLETED, "mini-swe-agent", "3 passed")
    assert traj.timings.agent_s == 12.5 and dict(traj.metadata) == {"k": "v"} and traj.group_size == 1
    assert await _code(store.append(append_request("r1", "t1", part=1))) == grpc.StatusCode.FAILED_PRECONDITION
    assert (await store.append(append_request("r1", "t1", close=True))).duplicate  # a late retry still answers


async def test_finalize_trial_without_segments(store: Store) -> None:
    assert await _code(store.get("r1", "ghost")) == grpc.StatusCode.NOT_FOUND
    # A harness that never called the model still ends its trial, so its group can complete.
    assert (await store.finalize(finalize_request("r1", "ghost", reward=0.0))).group_ready
    traj = await store.get("r1", "ghost")
    assert (traj.termination_reason, traj.has_reward, len(traj.segments)) == (COMPLETED, True, 0)
    # An infrastructure failure before any model call likewise.
    env = finalize_request(
        "r1", "ghost2", group="g-ghost2", termination_reason=ENV_FAILED, has_reward=False, reward=0.0
    )
    assert (await store.finalize(env)).group_ready
    traj = await store.get("r1", "ghost2")
    assert (traj.termination_reason, traj.has_reward, len(traj.segments)) == (ENV_FAILED, False, 0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("group_size", 0),
        ("termination_reason", 0),
        ("termination_reason", 99),
        ("reward", float("nan")),
        ("group_id", ""),
        ("task_id", "has space"),
        ("run_id", "bad/run"),
        ("verifier_summary", "x" * 20_000),
    ],
)
async def test_malformed_finalize_is_invalid_argument(store: Store, field: str, value: object) -> None:
    await store.append(append_request("r1", "t1"))
    req = finalize_request("r1", "t1")
    setattr(req, field, value)
    assert await _code(store.finalize(req)) == grpc.StatusCode.INVALID_ARGUMENT
    assert not (await store.get("r1", "t1", include_tokens=False)).finalized


async def test_group_is_ready_when_all_trials_are_final(store: Store) -> None:
    for t in ("t1", "t2", "t3"):
        await store.append(append_request("r1", t, group="g"))
    assert not (await store.finalize(finalize_request("r1", "t1", group="g", size=3))).group_ready
    wrong_size = finalize_request("r1", "t2", group="g", size=4)
    assert await _code(store.finalize(wrong_size)) == grpc.StatusCode.FAILED_PRECONDITION
    wrong_group = finalize_request("r1", "t2", group="other", size=3)
    assert await _code(store.finalize(wrong_group)) == grpc.StatusCode.FAILED_PRECONDITION  # t2 belongs to g
    assert not (await store.finalize(finalize_request("r1", "t2", group="g", size=3))).group_ready
    assert (await store.finalize(finalize_request("r1", "t3", group="g", size=3))).group_ready
    extra = finalize_request("r1", "t4", group="g", size=3, termination_reason=ENV_FAILED)
    assert await _code(store.finalize(extra)) == grpc.StatusCode.FAILED_PRECONDITION
    assert await _code(store.get("r1", "t4")) == grpc.StatusCode.NOT_FOUND  # nothing half-written


async def _populate(store: Store) -> None:
    specs = [  # trial, task, group, step, reason, reward (None: no reward), finalized
        ("a", "task-a", "g1", 1, COMPLETED, 1.0, True),
        ("b", "task-a", "g1", 1, COMPLETED, 0.0, True),
        ("c", "task-b", "g2", 2, MAX_TURNS, 0.5, True),
        ("d", "task-b", "g2", 2, ENV_FAILED, None, True),
        ("e", "task-c", "g3", 2, COMPLETED, 0.25, False),
    ]
    for trial, task, group, step, reason, reward, final in specs:
        await store.append(append_request("r1", trial, task=task, group=group))
        if final:
            req = finalize_request(
                "r1", trial, task_id=task, group=group, size=2, step=step, termination_reason=reason,
                has_reward=reward is not None, reward=reward or 0.0,
            )  # fmt: skip
            await store.finalize(req)
    await store.append(append_request("r2", "a"))


async def test_list_filters(store: Store) -> None:
    await _populate(store)

    async def ids(**kw) -> list[str]:
        return [t.trial_id for t in (await store.list("r1", **kw)).trajectories]

    assert await ids() == ["a", "b", "c", "d", "e"]
    assert await ids(step=2) == ["c", "d"]
    assert await ids(step=0) == []
    assert await ids(task_id="task-b") == ["c", "d"]
    assert await ids(group_id="g1") == ["a", "b"]
    assert await ids(termination_reason=COMPLETED) == ["a", "b"]
    assert await ids(min_reward=0.5) == ["a", "c"]
    assert await ids(max_reward=0.5) == ["b", "c"]
    assert await ids(min_reward=0.0, max_reward=0.0) == ["b"]
    assert await ids(finalized_only=True) == ["a", "b", "c", "d"]
    listed = (await store.list("r1", task_id="task-a")).trajectories[0]
    assert len(listed.segments) == 1 and not listed.segments[0].response.ids  # metadata only
    assert [t.trial_id for t in (await store.list("r2")).trajectories] == ["a"]  # runs are separate


async def test_list_paging(store: Store) -> None:
    await _populate(store)
    seen, token, pages = [], "", 0
    while True:
        resp = await store.list("r1", page_size=2, page_token=token)
        seen += [t.trial_id for t in resp.trajectories]
        pages += 1
        token = resp.next_page_token
        if not token:
            break
    assert seen == ["a", "b", "c", "d", "e"] and pages == 3
    filtered = await store.list("r1", page_size=1, task_id="task-b")
    assert [t.trial_id for t in filtered.trajectories] == ["c"]
    nxt = await store.list("r1", page_size=1, task_id="task-b", page_token=filtered.next_page_token)
    assert [t.trial_id for t in nxt.trajectories] == ["d"]
    for bad in ({"page_token": "garbage!"}, {"page_token": filtered.next_page_token}, {"page_size": 5000}):
        assert await _code(store.list("r1", **bad)) == grpc.StatusCode.INVALID_ARGUMENT
    assert await _code(store.list("")) == grpc.StatusCode.INVALID_ARGUMENT


async def test_delete_run_removes_only_that_run(store: Store) -> None:
    await _populate(store)
    assert await blob_objects(store, "r1") > 0
    assert await store.delete("r1") == 5
    assert await blob_objects(store, "r1") == 0
    assert await blob_objects(store, "r2") > 0
    assert await _code(store.get("r1", "a")) == grpc.StatusCode.NOT_FOUND
    assert (await store.list("r1")).trajectories == []
    assert (await store.get("r2", "a")).segments[0].num_turns == 1
    assert await store.delete("r1") == 0  # idempotent
    # The run starts afresh: the same ids are accepted again.
    assert not (await store.append(append_request("r1", "a", task="task-a", group="g1"))).duplicate
    assert await _code(store.delete("bad run")) == grpc.StatusCode.INVALID_ARGUMENT


async def test_sweep_deletes_runs_idle_longer_than_the_age(store: Store) -> None:
    await store.append(append_request("old-run", "t1"))
    await asyncio.sleep(1.5)
    await store.append(append_request("new-run", "t1"))
    dry = await store.server.service.sweep(older_than_s=1.0, dry_run=True)
    assert [(run, n) for run, _, n in dry] == [("old-run", 1)]
    assert (await store.get("old-run", "t1")).segments  # a dry run deletes nothing
    swept = await store.server.service.sweep(older_than_s=1.0)
    assert [run for run, _, _ in swept] == ["old-run"]
    assert await _code(store.get("old-run", "t1")) == grpc.StatusCode.NOT_FOUND
    assert (await store.get("new-run", "t1")).segments
    assert await store.server.service.sweep(older_than_s=1.0) == []
