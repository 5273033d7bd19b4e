"""The local Redis and S3 servers: room for a test session's buckets; their own
scratch directories removed when they stop, a caller's directory kept."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harnessrl.localservers import S3_PORT_FLAGS, RedisServer, S3Server, restartable_ports


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


def test_a_server_s_ports_are_drawn_distinct() -> None:
    # Drawn one by one, weed's ports (twelve then) held a duplicate about once in 200
    # starts, and weed died on "bind: address already in use" (a CI run failed so).
    for _ in range(50):
        ports = restartable_ports(len(S3_PORT_FLAGS))
        assert len(set(ports)) == len(ports)


def test_s3_server_draws_again_when_a_port_is_taken_between_weeds_check_and_its_bind(monkeypatch) -> None:
    # weed replaces a port that is busy when it starts, but not one that is free then and
    # taken before its own bind (CI: another worker's server took S3's gRPC port). A thread
    # here takes S3's gRPC port once weed's master is up, before S3 starts.
    import harnessrl.localservers as localservers

    real = localservers.restartable_ports
    draws: list[list[int]] = []
    took: list[socket.socket] = []

    def take_s3_grpc_once_the_master_is_up(port: int, log: Path) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if log.exists() and "Start Seaweed Master" in log.read_text():
                sock = socket.socket()
                try:
                    sock.bind(("127.0.0.1", port))
                    sock.listen()
                except OSError:
                    sock.close()  # weed was first: nothing was taken
                    return
                took.append(sock)
                return
            time.sleep(0.002)

    def first_draw_gets_taken(count: int) -> list[int]:
        ports = real(count)
        if not draws:
            grpc = ports[S3_PORT_FLAGS.index("s3.port.grpc")]
            log = server.dir / "weed.log"
            log.unlink(missing_ok=True)
            threading.Thread(target=take_s3_grpc_once_the_master_is_up, args=(grpc, log), daemon=True).start()
        draws.append(ports)
        return ports

    monkeypatch.setattr(localservers, "restartable_ports", first_draw_gets_taken)
    server = S3Server()
    try:
        with server:
            server.client().create_bucket(Bucket="after-a-redraw")
    finally:
        for sock in took:
            sock.close()
    if not took:
        pytest.skip("weed bound S3's gRPC port before this test could take it")
    assert len(draws) == 2


@pytest.fixture
def nearly_full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 GiB tmpfs with 6 MiB left: 0.6% free, under the 1% that ``weed mini`` keeps."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", str(disk)], check=True)
    try:
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        with open(disk / "fill", "wb") as f:
            os.posix_fallocate(f.fileno(), 0, free - 6 * 2**20)
        yield disk
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(disk)], check=True)


def test_s3_server_writes_on_a_disk_with_less_than_one_percent_free(nearly_full_disk: Path) -> None:
    # CI's disk (252 GB) had 2.0 GiB free, 0.8%: weed mini's volumes turned read-only
    # (its floor is 1% and not settable) and every write answered "internal error".
    # The floor is ours to set; the server checks it as it starts.
    st = os.statvfs(nearly_full_disk)
    assert st.f_bavail / st.f_blocks < 0.01
    with S3Server(dir=nearly_full_disk / "s3", min_free_space="1MiB") as s3:
        client = s3.client()
        client.create_bucket(Bucket="nearly-full")
        client.put_object(Bucket="nearly-full", Key="k", Body=b"written")
        assert client.get_object(Bucket="nearly-full", Key="k")["Body"].read() == b"written"
