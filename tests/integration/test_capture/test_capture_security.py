"""Service credential, per-run namespaces and tracing of the capture store."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harnessrl import arrays, telemetry
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc
from services.capture_store.auth import RUN_TOKEN_HEADER, run_metadata, run_token
from tests.integration.test_capture.conftest import Store, append_request, finalize_request
from tests.integration.test_capture.test_capture_watch import Watcher


def _calls(stub: capture_pb2_grpc.CaptureStoreStub, run: str, md=()):
    yield "AppendSegment", stub.AppendSegment(append_request(run, "t1"), metadata=md)
    yield "FinalizeTrajectory", stub.FinalizeTrajectory(finalize_request(run, "t1"), metadata=md)
    yield "GetTrajectory", stub.GetTrajectory(capture_pb2.GetTrajectoryRequest(run_id=run, trial_id="t1"), metadata=md)
    yield "ListTrajectories", stub.ListTrajectories(capture_pb2.ListTrajectoriesRequest(run_id=run), metadata=md)
    yield "DeleteRun", stub.DeleteRun(capture_pb2.DeleteRunRequest(run_id=run), metadata=md)


async def test_every_rpc_needs_the_service_token(store: Store) -> None:
    for token in (None, "wrong"):
        async with connect(store.target, token) as channel:
            stub = capture_pb2_grpc.CaptureStoreStub(channel)
            for name, call in _calls(stub, "r1"):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
            watcher = Watcher(Store(store.server, store.settings, stub), "r1")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await watcher.next()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            await watcher.close()
    assert (await store.list("r1")).trajectories == []  # nothing was written


async def test_run_tokens_fence_each_run(make_store) -> None:
    async with make_store(run_token_key="namespace-secret") as store:
        await store.append(append_request("victim", "t1"))  # the fixture presents the right token per run
        assert run_token("namespace-secret", "victim") != run_token("namespace-secret", "intruder")
        intruder_md = run_metadata("namespace-secret", "intruder")
        for md in ((), intruder_md, ((RUN_TOKEN_HEADER, "0" * 64),)):
            for name, call in _calls(store.stub, "victim", md):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
                assert "victim" in (info.value.details() or "")
        watch_store = Store(store.server, store.settings, store.stub)
        watch_store.md = lambda run: intruder_md  # type: ignore[method-assign]
        watcher = Watcher(watch_store, "victim")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await watcher.next()
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        await watcher.close()
        # The intruder's own run works, and the victim's data is untouched.
        await store.stub.AppendSegment(append_request("intruder", "t1"), metadata=intruder_md)
        victim = await store.get("victim", "t1")
        assert victim.segments[0].num_turns == 1 and not victim.finalized


async def test_same_trial_id_in_two_runs_is_separate(store: Store) -> None:
    a, b = append_request("run-a", "t1", seed=1), append_request("run-b", "t1", seed=2)
    await store.append(a)
    assert not (await store.append(b)).duplicate  # not a conflict with run-a's part
    await store.finalize(finalize_request("run-a", "t1", reward=0.0))
    got_a, got_b = await store.get("run-a", "t1"), await store.get("run-b", "t1")
    assert got_a.finalized and not got_b.finalized
    np.testing.assert_array_equal(arrays.unpack_i32(got_b.segments[0].response.ids), arrays.unpack_i32(b.tokens.ids))


async def test_rpc_spans_join_the_callers_trace(store: Store) -> None:
    exporter = InMemorySpanExporter()
    telemetry.add_exporter(exporter)
    with telemetry.tracer("test").start_as_current_span("trial") as parent:
        await store.append(append_request("r1", "t1"))
        await store.get("r1", "t1")
    spans = [s for s in exporter.get_finished_spans() if s.name.endswith("CaptureStore/AppendSegment")]
    server = [s for s in spans if s.kind.name == "SERVER"]
    assert len(server) == 1 and {s.context.trace_id for s in spans} == {parent.get_span_context().trace_id}
    attrs = server[0].attributes or {}
    assert (attrs["harnessrl.run_id"], attrs["harnessrl.trial_id"], attrs["harnessrl.part_index"]) == ("r1", "t1", 0)
