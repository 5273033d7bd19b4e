"""The stack a bench or the load test starts: each service its own
``harnessrl <noun> serve`` process, as deployed, all reading ONE config file.

The config is typed: each service's own Settings class (None: not started).
``BenchStack`` assigns free ports, wires the targets (the proxy to the gateway
and the capture store; the sandbox service and its workers to the proxy, the
store and a Redis queue), optionally puts the capture store on Redis + S3
started here, writes ``<root>/stack.toml`` with the dump of a run's resolved
config (``runconfig.settings_table``, secrets revealed) and starts the processes
with ``ProcessStack`` (readiness, a log per process, stop by PID). Also here:
the HTTP/1.1 client the load generators share, ``cpu_seconds`` and ``CpuReading``.

It lives in the composition root, as do the benches that use it: composing
services is not a service's business (a service never starts another).
"""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import SecretStr

from harnessrl.localservers import RedisServer, S3Server, free_port
from services.capture_store.settings import Settings as CaptureSettings
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.settings import Settings as ProxySettings
from services.sandbox.common.settings import Settings as SandboxSettings
from stack.procs import ProcessStack
from stack.runconfig import settings_table

# Process name (the CLI noun) -> config table, in start order.
SECTIONS = {"gateway": "gateway", "capture": "capture_store", "proxy": "proxy", "sandbox": "sandbox"}
BUCKET = "bench"


@dataclass
class BenchStack:
    """What to start and, once started, where it listens (``ports``, ``pids``, ``target()``).

    ``await start()`` / ``stop()``, or ``with``: the processes stop (newest first), then Redis and S3."""

    root: Path
    gateway: GatewaySettings | None = None
    capture: CaptureSettings | None = None
    proxy: ProxySettings | None = None
    sandbox: SandboxSettings | None = None
    workers: int = 0  # ``sandbox worker`` processes, on a Redis queue started here
    distributed: bool = False  # the capture store on Redis + S3 started here
    redis_fsync: bool = False  # that Redis durable before each reply (appendonly, appendfsync always)
    pin: dict[str, set[int]] = field(default_factory=dict)  # process name -> the CPUs it runs on
    ports: dict[str, int] = field(default_factory=dict)
    procs: ProcessStack | None = None
    s3: S3Server | None = None
    _exits: ExitStack = field(default_factory=ExitStack)

    @property
    def pids(self) -> dict[str, int]:
        services = self.procs.services.values() if self.procs else ()
        return {s.name: s.proc.pid for s in services if s.proc is not None}

    def target(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def write_config(self) -> Path:
        """Ports and targets filled in (Redis and S3 started when asked for): ``<root>/stack.toml``."""
        self.ports = {name: free_port() for name in SECTIONS if getattr(self, name) is not None}
        up: dict[str, dict[str, Any]] = {name: {"port": port} for name, port in self.ports.items()}
        if self.capture is not None and self.distributed:
            up["capture"] |= self._distributed_store()
        elif self.capture is not None and self.capture.store_dir is None:
            up["capture"]["store_dir"] = self.root / "capture"
        if self.proxy is not None:
            up["proxy"] |= self._capture_target(self.proxy.capture_token)
            if self.gateway is not None:
                up["proxy"]["gateway_target"] = self.target("gateway")
        if self.sandbox is not None:
            up["sandbox"] |= self._capture_target(self.sandbox.capture_token)
            if self.proxy is not None:
                admin = self.proxy.admin_token
                up["sandbox"] |= {"proxy_url": f"http://{self.target('proxy')}", "proxy_admin_token": admin}
            if self.workers:
                up["sandbox"]["queue_url"] = self._redis("redis-queue").url
        tables = {}
        for name, update in up.items():
            settings = getattr(self, name).model_copy(update=update)
            setattr(self, name, settings)
            tables[SECTIONS[name]] = settings_table(settings, reveal=True)
        config = self.root / "stack.toml"
        config.write_text(tomli_w.dumps(tables))
        return config

    async def start(self, timeout_s: float = 180) -> BenchStack:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            config = self.write_config()
            procs = self.procs = ProcessStack(self.root, config)
            self._exits.callback(procs.stop_all)  # before Redis and S3 stop: registered after them
            for name, port in self.ports.items():
                procs.add_server(name, name, port).cpus = self.pin.get(name)
            for i in range(self.workers):
                procs.add(f"worker-{i}", ["sandbox", "worker", "-c", str(config), "--name", f"worker-{i}"])
            await procs.start(timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._exits.close()

    def __enter__(self) -> BenchStack:
        return asyncio.run(self.start())

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _capture_target(self, token: SecretStr | None) -> dict[str, Any]:
        if self.capture is None:
            return {}
        return {"capture_target": self.target("capture"), "capture_token": token or self.capture.auth_token}

    def _redis(self, name: str, appendonly: bool = False) -> RedisServer:
        (self.root / name).mkdir(parents=True, exist_ok=True)
        server = RedisServer(appendonly=appendonly, dir=self.root / name).start()
        self._exits.callback(server.stop)
        return server

    def _distributed_store(self) -> dict[str, Any]:
        index = self._redis("redis", appendonly=self.redis_fsync)
        if self.redis_fsync:  # durable before the reply, like production
            import redis as redis_client

            with redis_client.Redis.from_url(index.url) as client:
                client.config_set("appendfsync", "always")
        (self.root / "s3").mkdir(parents=True, exist_ok=True)
        s3 = self.s3 = S3Server(dir=self.root / "s3").start()
        self._exits.callback(s3.stop)
        s3.client().create_bucket(Bucket=BUCKET)
        keys = {"s3_access_key": SecretStr(s3.access_key), "s3_secret_key": SecretStr(s3.secret_key)}
        where = {"redis_url": index.url, "s3_endpoint": s3.endpoint, "s3_bucket": BUCKET}
        return {"backend": "distributed", **where, **keys}


class Http:
    """A minimal HTTP/1.1 keep-alive client: the load generator shares the cores
    with what it measures, so it must cost less than what it measures. One
    connection, one request at a time: concurrent callers wait their turn (a
    load generator wanting N in flight opens N clients)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self._turn = asyncio.Lock()

    async def post_json(self, path: str, body: dict[str, Any] | None, token: str) -> tuple[int, Any]:
        status, data = await self.post(path, json.dumps(body or {}).encode(), token)
        return status, json.loads(data) if data else None

    async def admin(self, path: str, body: dict[str, Any] | None, token: str) -> Any:
        """A call of the proxy's admin API; an answer other than 200/201 is an error naming it."""
        status, data = await self.post_json(path, body, token)
        if status not in (200, 201):
            raise RuntimeError(f"admin {path}: {status} {str(data)[:300]}")
        return data

    async def post(self, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        async with self._turn:
            return await self._post(path, body, token)

    async def _post(self, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        for _ in range(2):  # a connection idle past the server's keep-alive is closed: reopen once
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            assert self.reader is not None
            self.writer.write(head.encode() + body)
            status_line = await self.reader.readline()
            if status_line:
                break
            self.close()
        else:
            raise ConnectionError(f"{path}: the server closed the connection")
        length, chunked = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "transfer-encoding":
                chunked = "chunked" in value.lower()
        if length or not chunked:
            return int(status_line.split()[1]), await self.reader.readexactly(length)
        parts = []  # Transfer-Encoding: chunked (a streamed response)
        while size := int((await self.reader.readline()).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size))
            await self.reader.readline()
        await self.reader.readline()
        return int(status_line.split()[1]), b"".join(parts)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def cpu_seconds(pid: int, tree: bool = False) -> float:
    """User + system CPU of a process so far (Linux /proc); ``tree``: plus that of
    its descendants alive now (vLLM's engine core is a child)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir() if tree else ():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            if not tree:
                raise
    return total


@dataclass(frozen=True)
class CpuReading:
    """A process's CPU at one moment, exact: each live thread's on-CPU time in ns
    (``/proc/PID/task/TID/schedstat``), and the process's total in ticks
    (``/proc/PID/stat``, 10 ms) for when a thread exits between two readings.
    Ticks alone cost a bench ±10 ms per reading per process: on a 1-in-flight call
    of a few ms that is the whole figure. ``ticks``: the total only (a process tree)."""

    ticks_s: float
    threads_ns: dict[int, int] | None  # None: not read per thread

    @classmethod
    def of(cls, pid: int) -> CpuReading:
        threads: dict[int, int] = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                threads[int(task.name)] = int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):  # the thread exited while listed
                continue
        return cls(cpu_seconds(pid), threads)

    @classmethod
    def ticks(cls, pid: int, tree: bool = False) -> CpuReading:
        return cls(cpu_seconds(pid, tree), None)

    def since(self, before: CpuReading) -> float:
        """Seconds of CPU from ``before`` to this reading: exact while no thread of
        ``before`` has exited (its last slice is then unknown), else the ticks'."""
        now, then = self.threads_ns, before.threads_ns
        if now is None or then is None or not then.keys() <= now.keys():
            return self.ticks_s - before.ticks_s
        return sum(ns - then.get(tid, 0) for tid, ns in now.items()) / 1e9
