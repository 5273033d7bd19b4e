"""Distributed backend: Redis holds the index, per-run counters and ready
streams (consumer groups with acks); S3 holds the part blobs, one object per
run per batch.

Keys are ``<prefix>:{<run>}:<name>``: the braces make every key of a run a
Redis Cluster hash tag, so one transaction may span them. Transactions are
optimistic (WATCH the keys read, MULTI/EXEC the writes); a lost race raises
:class:`Conflict` and the caller reruns the rules. A blob object is written
before the index transaction that references it, so the index never points
at a missing blob.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import boto3
import botocore.exceptions
import redis
from botocore.config import Config
from redis.backoff import NoBackoff
from redis.retry import Retry

from harnessrl.errors import ConfigError, FailedPrecondition, Unavailable
from services.capture_store.backend import Backend, BlobMissing, BlobRef, Conflict, Delivery, View
from services.capture_store.records import Key
from services.capture_store.settings import Settings

log = logging.getLogger(__name__)

_TRANSIENT_S3 = {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "503", "500"}
_MERGE_GAP = 1 << 20  # ranges of one object closer than this are fetched together


class _RedisView(View):
    def __init__(self, backend: DistributedBackend, pipe: Any) -> None:
        self._b = backend
        self._pipe = pipe
        self._cache: dict[Key, bytes | None] = {}
        self._writes: list[tuple[str, tuple[Any, ...]]] = []
        self.runs: set[str] = set()

    def prefetch(self, keys: Iterable[Key]) -> None:
        new = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if not new:
            return
        names = [self._b.rkey(k.run, k.name) for k in new]
        self._pipe.watch(*names)
        for key, value in zip(new, self._pipe.mget(names), strict=True):
            self._cache[key] = value

    def get(self, key: Key) -> bytes | None:
        if key not in self._cache:
            self.prefetch([key])
        return self._cache[key]

    def put(self, key: Key, value: bytes) -> None:
        self._cache[key] = value
        self._writes.append(("set", (self._b.rkey(key.run, key.name), value)))
        self.runs.add(key.run)

    def add_trial(self, run: str, trial: str) -> int:
        seq = int(self._pipe.incr(self._b.rkey(run, "seq")))  # outside MULTI: a lost race only skips a number
        self._writes.append(("zadd", (self._b.rkey(run, "trials"), {trial: seq})))
        return seq

    def add_ready(self, run: str, group_id: str, payload: bytes) -> None:
        self._writes.append(("xadd", (self._b.rkey(run, "ready"), {"g": group_id, "m": payload})))

    def add_refs(self, run: str, obj: str, delta: int) -> None:
        self._writes.append(("hincrby", (self._b.rkey(run, "objrefs"), obj, delta)))

    def commit(self) -> None:
        if not self._writes:
            return
        self._pipe.multi()
        for op, args in self._writes:
            getattr(self._pipe, op)(*args)
        now = time.time()
        for run in self.runs:
            self._pipe.zadd(self._b.runs_key, {run: now})
        try:
            self._pipe.execute()
        except redis.WatchError as e:
            raise Conflict(str(e)) from e


class DistributedBackend(Backend):
    name = "distributed"
    compacts = True

    def __init__(self, settings: Settings) -> None:
        assert settings.redis_url and settings.s3_endpoint and settings.s3_bucket  # checked by Settings
        self._prefix = settings.redis_prefix
        self._url, self._endpoint = settings.redis_url, settings.s3_endpoint
        self.runs_key = f"{self._prefix}:runs"
        password = settings.redis_password.get_secret_value() if settings.redis_password else None
        # No client-side retries: the service's bounded Retrier decides, and a
        # blind resend of EXEC or INCR is not safe.
        self._redis: Any = redis.Redis.from_url(
            settings.redis_url,
            password=password,
            socket_timeout=10,
            socket_connect_timeout=2,
            retry=Retry(NoBackoff(), 0),
        )
        self._bucket = settings.s3_bucket
        self._s3_prefix = settings.s3_prefix.strip("/")
        self._s3 = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint,
            aws_access_key_id=settings.s3_access_key.get_secret_value() if settings.s3_access_key else None,
            aws_secret_access_key=settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None,
            region_name=settings.s3_region,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                connect_timeout=2,
                read_timeout=30,
                max_pool_connections=32,
            ),
        )
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="capture-s3")
        self._create_bucket = settings.s3_create_bucket

    def check(self) -> None:
        """Fails fast on a wrong bucket or credentials; warns when Redis does not persist."""
        try:
            self._redis.ping()
        except redis.RedisError as e:
            raise Unavailable(f"redis at {_redact(self._url)} is not reachable: {e}") from e
        try:
            config = self._redis.config_get("append*")
        except redis.ResponseError:
            config = {}  # CONFIG disabled (managed Redis): the operator vouches for durability
        if config and config.get("appendonly") != "yes":
            log.warning("redis runs without appendonly: a Redis restart loses the capture index")
        elif config and config.get("appendfsync") != "always":
            # Redis 7.0 may answer before writing its AOF buffer while a background
            # fsync is slow: a crash then can lose an acknowledged append.
            log.warning(
                "redis appendfsync is %r, not 'always': a Redis crash can lose acknowledged appends",
                config.get("appendfsync"),
            )
        try:
            self._s3.head_bucket(Bucket=self._bucket)
        except botocore.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket") and self._create_bucket:
                self._s3.create_bucket(Bucket=self._bucket)
                return
            raise ConfigError(f"s3 bucket {self._bucket!r} is not usable: {e}") from e
        except botocore.exceptions.NoCredentialsError as e:
            raise ConfigError("s3 credentials missing: set s3_access_key and s3_secret_key") from e
        except botocore.exceptions.BotoCoreError as e:
            raise Unavailable(f"s3 endpoint {self._endpoint} is not reachable: {e}") from e

    def rkey(self, run: str, name: str) -> str:
        return f"{self._prefix}:{{{run}}}:{name}"

    @contextlib.contextmanager
    def transaction(self) -> Iterator[View]:
        with self._redis.pipeline(transaction=True) as pipe:
            view = _RedisView(self, pipe)
            yield view
            view.commit()

    def get_many(self, keys: list[Key]) -> list[bytes | None]:
        if not keys:
            return []
        return list(self._redis.mget([self.rkey(k.run, k.name) for k in keys]))

    def _object_key(self, run: str, kind: str) -> str:
        return f"{self._s3_prefix}/runs/{run}/{kind}/{time.time_ns()}-{uuid.uuid4().hex[:12]}.bin"

    def write_blobs(self, run: str, blobs: list[bytes], kind: str = "parts") -> list[BlobRef]:
        obj = self._object_key(run, kind)
        self._s3.put_object(Bucket=self._bucket, Key=obj, Body=b"".join(blobs))
        refs, off = [], 0
        for blob in blobs:
            refs.append(BlobRef(obj, off, len(blob)))
            off += len(blob)
        return refs

    def release_objects(self, run: str, objs: list[str]) -> list[str]:
        counts = self._redis.hmget(self.rkey(run, "objrefs"), objs) if objs else []
        # An object without a counter is kept: only a counted object is known unreferenced.
        dead = [o for o, c in zip(objs, counts, strict=True) if c is not None and int(c) <= 0]
        self.delete_objects(run, dead)
        if dead:
            self._redis.hdel(self.rkey(run, "objrefs"), *dead)
        return dead

    def delete_objects(self, run: str, objs: list[str]) -> None:
        for i in range(0, len(objs), 1000):
            chunk = [{"Key": o} for o in objs[i : i + 1000]]
            self._s3.delete_objects(Bucket=self._bucket, Delete={"Objects": chunk, "Quiet": True})

    def read_blobs(self, run: str, refs: list[BlobRef]) -> list[bytes]:
        by_obj: dict[str, list[int]] = defaultdict(list)
        for i, ref in enumerate(refs):
            by_obj[ref.obj].append(i)
        spans: list[tuple[str, int, int, list[int]]] = []  # object, start, end, ref indexes
        for obj, indexes in by_obj.items():
            indexes.sort(key=lambda i: refs[i].off)
            for i in indexes:
                ref = refs[i]
                if spans and spans[-1][0] == obj and ref.off - spans[-1][2] <= _MERGE_GAP:
                    o, start, end, members = spans[-1]
                    spans[-1] = (o, start, max(end, ref.off + ref.len), [*members, i])
                else:
                    spans.append((obj, ref.off, ref.off + ref.len, [i]))
        out: list[bytes] = [b""] * len(refs)
        for (obj, start, _, members), data in zip(spans, self._pool.map(self._get_range, spans), strict=True):
            for i in members:
                out[i] = data[refs[i].off - start : refs[i].off - start + refs[i].len]
                if len(out[i]) != refs[i].len:
                    raise OSError(f"s3 object {obj}: short read at {refs[i].off}")
        return out

    def _get_range(self, span: tuple[str, int, int, list[int]]) -> bytes:
        obj, start, end, _ = span
        try:
            resp = self._s3.get_object(Bucket=self._bucket, Key=obj, Range=f"bytes={start}-{end - 1}")
        except botocore.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise BlobMissing(f"s3 object {obj} is gone (compacted or deleted)") from e
            raise
        return bytes(resp["Body"].read())

    def list_trials(self, run: str, after_seq: int, limit: int) -> list[tuple[int, str]]:
        rows = self._redis.zrangebyscore(
            self.rkey(run, "trials"), f"({after_seq}", "+inf", start=0, num=limit, withscores=True
        )
        return [(int(score), member.decode()) for member, score in rows]

    def count_trials(self, run: str) -> int:
        return int(self._redis.zcard(self.rkey(run, "trials")))

    def runs_with_trial(self, trial: str) -> list[str]:
        pattern = f"{self._prefix}:{{*}}:trial/{quote(trial, safe='')}"
        runs = {name.decode().split("{", 1)[1].split("}", 1)[0] for name in self._redis.scan_iter(match=pattern)}
        return sorted(runs)

    def delete_run(self, run: str) -> None:
        batch: list[bytes] = []
        for name in self._redis.scan_iter(match=self.rkey(run, "*"), count=1000):
            batch.append(name)
            if len(batch) >= 1000:
                self._redis.unlink(*batch)
                batch = []
        if batch:
            self._redis.unlink(*batch)
        prefix = f"{self._s3_prefix}/runs/{run}/"
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=prefix):
            objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if objects:
                self._s3.delete_objects(Bucket=self._bucket, Delete={"Objects": objects, "Quiet": True})
        self._redis.zrem(self.runs_key, run)

    def runs_updated_before(self, cutoff: float) -> list[tuple[str, float]]:
        rows = self._redis.zrangebyscore(self.runs_key, "-inf", f"({cutoff}", withscores=True)
        return sorted((member.decode(), float(score)) for member, score in rows)

    # Ready streams: one stream per run, Redis consumer groups.
    def _alive_key(self, run: str, group: str, consumer: str) -> str:
        return self.rkey(run, f"alive/{quote(group, safe='')}/{quote(consumer, safe='')}")

    def ready_subscribe(self, run: str, group: str, consumer: str, lease_s: float) -> None:
        try:
            self._redis.xgroup_create(self.rkey(run, "ready"), group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        self.ready_heartbeat(run, group, consumer, lease_s)

    def ready_claim(self, run: str, group: str, consumer: str, own: bool) -> list[Delivery]:
        stream = self.rkey(run, "ready")
        summary = self._redis.xpending(stream, group)
        claimed: list[tuple[bytes, dict[bytes, bytes]]] = []
        for entry in summary.get("consumers") or []:
            name = entry["name"].decode() if isinstance(entry["name"], bytes) else entry["name"]
            if name == consumer and not own:
                continue
            if name != consumer and self._redis.exists(self._alive_key(run, group, name)):
                continue
            pending = self._redis.xpending_range(stream, group, "-", "+", 10_000, consumername=name)
            ids = [p["message_id"] for p in pending]
            if ids:
                claimed += [e for e in self._redis.xclaim(stream, group, consumer, 0, ids) if e and e[1]]
        if not claimed:
            return []
        counts = {
            p["message_id"]: int(p["times_delivered"])
            for p in self._redis.xpending_range(stream, group, "-", "+", 10_000, consumername=consumer)
        }
        claimed.sort(key=lambda e: _stream_order(e[0]))
        return [Delivery(eid.decode(), fields[b"m"], max(counts.get(eid, 1) - 1, 0)) for eid, fields in claimed]

    def ready_read(self, run: str, group: str, consumer: str, count: int) -> list[Delivery]:
        try:
            resp = self._redis.xreadgroup(group, consumer, {self.rkey(run, "ready"): ">"}, count=count)
        except redis.ResponseError as e:
            if "NOGROUP" in str(e):
                raise FailedPrecondition(
                    f"consumer group {group!r} of run {run!r} does not exist (run deleted?)"
                ) from e
            raise
        return [Delivery(eid.decode(), fields[b"m"], 0) for _, entries in resp for eid, fields in entries]

    def ready_find(self, run: str, group_id: str) -> str | None:
        want = group_id.encode()
        for eid, fields in self._redis.xrange(self.rkey(run, "ready")):
            if fields.get(b"g") == want:
                return str(eid.decode())
        return None

    def ready_ack(self, run: str, group: str, entry: str) -> None:
        self._redis.xack(self.rkey(run, "ready"), group, entry)

    def ready_heartbeat(self, run: str, group: str, consumer: str, lease_s: float) -> None:
        self._redis.set(self._alive_key(run, group, consumer), b"1", px=max(int(lease_s * 1000), 1))

    def ready_leave(self, run: str, group: str, consumer: str) -> None:
        self._redis.delete(self._alive_key(run, group, consumer))

    def is_transient(self, exc: BaseException) -> bool:
        if isinstance(
            exc,
            redis.ConnectionError
            | redis.TimeoutError
            | redis.exceptions.ReadOnlyError
            | redis.exceptions.TryAgainError,
        ):
            return True
        if isinstance(exc, redis.ResponseError):
            return str(exc).startswith(("LOADING", "MASTERDOWN"))
        if isinstance(exc, redis.WatchError):
            # redis-py reports a connection lost while keys were WATCHed as a WatchError
            # ("A ConnectionError occurred while watching ..."): the server went away, not a conflict.
            return "ConnectionError" in str(exc)
        if isinstance(exc, botocore.exceptions.ClientError):
            err = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            return err.get("Code") in _TRANSIENT_S3 or status >= 500
        return isinstance(
            exc,
            botocore.exceptions.EndpointConnectionError
            | botocore.exceptions.ConnectionClosedError
            | botocore.exceptions.ReadTimeoutError
            | botocore.exceptions.ConnectTimeoutError
            | botocore.exceptions.ResponseStreamingError
            | ConnectionError,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._redis.close()
        self._s3.close()


def _stream_order(eid: bytes) -> tuple[int, int]:
    ms, _, seq = eid.partition(b"-")
    return int(ms), int(seq or 0)


def _redact(url: str) -> str:
    """A Redis URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if "@" in rest else url
