"""The test S3 server holds as many buckets as a whole test session creates."""

from __future__ import annotations

import uuid

from harnessrl.localservers import S3Server


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
