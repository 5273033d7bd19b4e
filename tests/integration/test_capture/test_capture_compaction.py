"""Distributed backend: finalized trajectories are compacted into one S3 object
per segment, reads stay exact, and batch objects are freed once unreferenced."""

from __future__ import annotations

import asyncio

import boto3
import pytest
from botocore.config import Config

from harnessrl import arrays
from tests.integration.test_capture.conftest import Store, append_request, finalize_request


@pytest.fixture
def backend_kind() -> str:
    return "distributed"  # the embedded store reads local pack files and does not compact


def _objects(store: Store, kind: str) -> list[str]:
    st = store.settings
    client = boto3.client(
        "s3",
        endpoint_url=st.s3_endpoint,
        aws_access_key_id=st.s3_access_key.get_secret_value(),  # type: ignore[union-attr]
        aws_secret_access_key=st.s3_secret_key.get_secret_value(),  # type: ignore[union-attr]
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    resp = client.list_objects_v2(Bucket=st.s3_bucket, Prefix=f"{st.s3_prefix}/runs/r1/{kind}/")
    return [o["Key"] for o in resp.get("Contents", [])]


async def _wait_for(store: Store, kind: str, count: int) -> None:
    for _ in range(100):
        if len(await asyncio.to_thread(_objects, store, kind)) == count and not store.server.service._compactions:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"expected {count} {kind} objects, have {await asyncio.to_thread(_objects, store, kind)}")


async def _ids(store: Store, trial: str) -> list[list[int]]:
    traj = await store.get("r1", trial)
    return [arrays.unpack_i32(s.response.ids).tolist() for s in traj.segments]


async def test_finalize_compacts_segments_and_frees_batch_objects(store: Store) -> None:
    for p in range(5):  # t1 and t2 grow together, so their parts share batch objects
        await asyncio.gather(*(store.append(append_request("r1", t, part=p, group="g")) for t in ("t1", "t2")))
    await store.append(append_request("r1", "t1", thread="title", kind="side", group="g"))
    before = {t: await _ids(store, t) for t in ("t1", "t2")}
    batches = await asyncio.to_thread(_objects, store, "parts")
    assert len(batches) >= 5

    await store.finalize(finalize_request("r1", "t1", group="g", size=2))
    await _wait_for(store, "segments", 1)  # t1's main segment; its single-part title needs no rewrite
    assert await _ids(store, "t1") == before["t1"]
    kept = await asyncio.to_thread(_objects, store, "parts")
    assert set(kept) <= set(batches)  # batches only t1 used may go ...
    assert await _ids(store, "t2") == before["t2"]  # ... but every one t2 references stays

    await store.finalize(finalize_request("r1", "t2", group="g", size=2))
    await _wait_for(store, "segments", 2)
    assert await _ids(store, "t2") == before["t2"] and await _ids(store, "t1") == before["t1"]
    left = await asyncio.to_thread(_objects, store, "parts")
    assert len(left) == 1  # only the batch holding t1's title part is still referenced
    assert await store.delete("r1") == 2
    await _wait_for(store, "segments", 0)
