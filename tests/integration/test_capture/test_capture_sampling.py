"""A segment's sampling (records_pb2.SegmentSampling) through AppendSegment and
GetTrajectory, on both backends, and the exports that carry it."""

from __future__ import annotations

import grpc
import pyarrow as pa
import pytest

from harnessrl.v1 import records_pb2
from services.capture_store.export import PARQUET_SCHEMA, metadata_row, segment_objects
from tests.integration.test_capture.conftest import Store, append_request, finalize_request


def _sampling(temperature: float, **kw: object) -> records_pb2.SegmentSampling:
    fields = {"top_p": 0.95, "top_k": 64, "mode": "honour", "from_harness": ["temperature", "top_p", "top_k"], **kw}
    return records_pb2.SegmentSampling(temperature=temperature, **fields)  # type: ignore[arg-type]


async def test_each_segment_reads_back_with_its_sampling(store: Store) -> None:
    first = append_request("r1", "t1", part=0)
    first.sampling.CopyFrom(_sampling(0.7))
    second = append_request("r1", "t1", segment=1, part=0, close=True)
    second.sampling.CopyFrom(_sampling(0.2, mode="pin", from_harness=[], overridden=["temperature"]))
    legacy = append_request("r1", "t1", thread="title", kind="side", part=0, close=True)  # a writer without it
    for req in (first, append_request("r1", "t1", part=1), second, legacy):
        await store.append(req)
    await store.finalize(finalize_request("r1", "t1"))
    traj = await store.get("r1", "t1")
    by_key = {(s.key.thread, s.key.segment_index): s for s in traj.segments}
    assert by_key[("main", 0)].sampling == first.sampling
    assert by_key[("main", 1)].sampling == second.sampling
    assert not by_key[("title", 0)].HasField("sampling")
    rows = {(o["thread"], o["segment_index"]): o["sampling"] for o in segment_objects(traj)}
    assert rows[("main", 0)] == {
        "temperature": 0.7,  # rounded from float32, as a user wrote it
        "top_p": 0.95,
        "top_k": 64,
        "min_p": 0.0,
        "mode": "honour",
        "from_harness": ["temperature", "top_p", "top_k"],
        "overridden": [],
    }
    assert rows[("main", 1)]["overridden"] == ["temperature"] and rows[("title", 0)] is None
    row = metadata_row(traj)
    table = pa.Table.from_pylist([row], schema=PARQUET_SCHEMA)
    column = table.column("segment_sampling").to_pylist()[0]
    assert [(c["thread"], c["temperature"], c["mode"]) for c in column] == [
        ("main", 0.7, "honour"),
        ("main", 0.2, "pin"),
        ("title", None, None),
    ]


async def test_sampling_is_checked_and_belongs_on_part_0(store: Store) -> None:
    bad = append_request("r1", "t2", part=0)
    bad.sampling.CopyFrom(_sampling(0.7, mode="obey"))
    with pytest.raises(grpc.aio.AioRpcError, match=r"sampling\.mode 'obey'"):
        await store.append(bad)
    await store.append(append_request("r1", "t2", part=0))
    later = append_request("r1", "t2", part=1)
    later.sampling.CopyFrom(_sampling(0.7))
    with pytest.raises(grpc.aio.AioRpcError, match="part 0 only"):
        await store.append(later)
