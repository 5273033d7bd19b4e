"""The local Redis and S3 servers: room for a test session's buckets; their own
scratch directories removed when they stop, a caller's directory kept."""

from __future__ import annotations

import uuid
from pathlib import Path

from harnessrl.localservers import RedisServer, S3Server


def test_s3_server_takes_a_session_worth_of_buckets() -> None:
    # Each bucket is a SeaweedFS collection with volumes of its own. With the
    # auto-configured volume limit (free disk / volume size) a session's ~70th
    # bucket failed every PutObject with InternalError ("no free volumes left").
    with S3Server() as s3:
        client = s3.client()
        for i in range(100):
            bucket = f"t-{uuid.uuid4().hex[:12]}"
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="k", Body=b"%d" % i)
        assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"99"


def test_scratch_directories_go_with_the_server_and_a_given_one_stays(tmp_path: Path) -> None:
    with RedisServer() as own, RedisServer(dir=tmp_path) as given:
        assert own.dir.is_dir() and (own.dir / "redis.log").exists()
    assert not own.dir.exists()
    assert (given.dir / "redis.log").exists()
