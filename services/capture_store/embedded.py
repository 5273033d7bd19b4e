"""Embedded backend: a SQLite index (WAL, synchronous=FULL) and per-run
append-only pack files holding the part blobs.

Why pack files rather than a file per part: an acknowledged append must be
durable, and one fsync per tiny file caps throughput at a few hundred parts a
second. A batch of parts is appended to the run's current pack file with one
write and one fsync, then indexed in one SQLite transaction (a second fsync).
Bytes written by a batch whose index transaction then failed are unreferenced
garbage, never a half-visible part; they go with the run.

One process writes a store directory at a time (an flock on ``.lock``);
readers (the CLI with ``--store``) may open it alongside.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from harnessrl.errors import FailedPrecondition
from services.capture_store.backend import Backend, BlobRef, Delivery, View
from services.capture_store.records import Key
from services.capture_store.settings import Settings

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (run TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (run, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trials (run TEXT NOT NULL, seq INTEGER NOT NULL, trial TEXT NOT NULL,
    PRIMARY KEY (run, seq));
CREATE TABLE IF NOT EXISTS runs (run TEXT PRIMARY KEY, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS ready (run TEXT NOT NULL, seq INTEGER NOT NULL, group_id TEXT NOT NULL,
    payload BLOB NOT NULL, PRIMARY KEY (run, seq));
CREATE INDEX IF NOT EXISTS ready_group ON ready (run, group_id);
CREATE TABLE IF NOT EXISTS cgroups (run TEXT NOT NULL, cg TEXT NOT NULL, last_seq INTEGER NOT NULL,
    PRIMARY KEY (run, cg));
CREATE TABLE IF NOT EXISTS deliveries (run TEXT NOT NULL, cg TEXT NOT NULL, seq INTEGER NOT NULL,
    consumer TEXT NOT NULL, count INTEGER NOT NULL, acked INTEGER NOT NULL, PRIMARY KEY (run, cg, seq));
CREATE TABLE IF NOT EXISTS consumers (run TEXT NOT NULL, cg TEXT NOT NULL, consumer TEXT NOT NULL,
    alive_until REAL NOT NULL, PRIMARY KEY (run, cg, consumer));
"""
MAX_OPEN_PACKS = 64  # runs written recently keep their pack file open
RUN_TABLES = ("kv", "trials", "runs", "ready", "cgroups", "deliveries", "consumers")


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


class PackStore:
    """Per-run append-only pack files: ``<root>/<run>/pack-NNNNNN.dat``."""

    def __init__(self, root: Path, max_bytes: int, fsync: bool) -> None:
        self.root = root
        self._max = max_bytes
        self._fsync = fsync
        self._open: OrderedDict[str, tuple[int, int, int]] = OrderedDict()  # run -> (pack id, fd, size), LRU

    def append(self, run: str, blobs: list[bytes]) -> list[BlobRef]:
        data = b"".join(blobs)
        pack, fd, size = self._current(run, len(data))
        written = 0
        while written < len(data):
            written += os.pwrite(fd, memoryview(data)[written:], size + written)
        if self._fsync:
            os.fsync(fd)
        self._open[run] = (pack, fd, size + len(data))
        refs, off = [], size
        for blob in blobs:
            refs.append(BlobRef(f"pack-{pack:06d}.dat", off, len(blob)))
            off += len(blob)
        return refs

    def _current(self, run: str, incoming: int) -> tuple[int, int, int]:
        if run in self._open:
            self._open.move_to_end(run)
        else:
            while len(self._open) >= MAX_OPEN_PACKS:
                os.close(self._open.popitem(last=False)[1][1])
            run_dir = self.root / run
            run_dir.mkdir(parents=True, exist_ok=True)
            packs = sorted(run_dir.glob("pack-*.dat"))
            pack = int(packs[-1].stem.split("-")[1]) if packs else 1
            self._open[run] = self._open_pack(run, pack)
        pack, fd, size = self._open[run]
        if size and size + incoming > self._max:
            os.close(fd)
            self._open[run] = self._open_pack(run, pack + 1)
        return self._open[run]

    def _open_pack(self, run: str, pack: int) -> tuple[int, int, int]:
        path = self.root / run / f"pack-{pack:06d}.dat"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if self._fsync:  # the new file's directory entry must survive a crash too
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return pack, fd, os.fstat(fd).st_size

    def read(self, run: str, refs: list[BlobRef]) -> list[bytes]:
        by_obj: dict[str, list[int]] = defaultdict(list)
        for i, ref in enumerate(refs):
            by_obj[ref.obj].append(i)
        out: list[bytes] = [b""] * len(refs)
        for obj, indexes in by_obj.items():
            fd = os.open(self.root / run / obj, os.O_RDONLY)
            try:
                for i in indexes:
                    out[i] = os.pread(fd, refs[i].len, refs[i].off)
                    if len(out[i]) != refs[i].len:
                        raise OSError(f"{run}/{obj}: short read at {refs[i].off}")
            finally:
                os.close(fd)
        return out

    def delete_run(self, run: str) -> None:
        entry = self._open.pop(run, None)
        if entry is not None:
            os.close(entry[1])
        shutil.rmtree(self.root / run, ignore_errors=True)

    def close(self) -> None:
        for _, fd, _ in self._open.values():
            os.close(fd)
        self._open.clear()


class _SqliteView(View):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._cache: dict[Key, bytes | None] = {}
        self.runs: set[str] = set()

    def prefetch(self, keys: Iterable[Key]) -> None:
        by_run: dict[str, list[str]] = defaultdict(list)
        for key in keys:
            if key not in self._cache:
                self._cache[key] = None
                by_run[key.run].append(key.name)
        for run, names in by_run.items():
            for i in range(0, len(names), 500):
                chunk = names[i : i + 500]
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT key, value FROM kv WHERE run = ? AND key IN ({marks})"
                for name, value in self._conn.execute(sql, (run, *chunk)):
                    self._cache[Key(run, name)] = value

    def get(self, key: Key) -> bytes | None:
        if key not in self._cache:
            row = self._conn.execute("SELECT value FROM kv WHERE run = ? AND key = ?", key).fetchone()
            self._cache[key] = None if row is None else row[0]
        return self._cache[key]

    def put(self, key: Key, value: bytes) -> None:
        self._conn.execute("INSERT OR REPLACE INTO kv (run, key, value) VALUES (?, ?, ?)", (*key, value))
        self._cache[key] = value
        self.runs.add(key.run)

    def add_trial(self, run: str, trial: str) -> int:
        (seq,) = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM trials WHERE run = ?", (run,)).fetchone()
        self._conn.execute("INSERT INTO trials (run, seq, trial) VALUES (?, ?, ?)", (run, seq, trial))
        return int(seq)

    def add_ready(self, run: str, group_id: str, payload: bytes) -> None:
        (seq,) = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM ready WHERE run = ?", (run,)).fetchone()
        self._conn.execute(
            "INSERT INTO ready (run, seq, group_id, payload) VALUES (?, ?, ?, ?)", (run, seq, group_id, payload)
        )


class EmbeddedBackend(Backend):
    name = "embedded"

    def __init__(self, settings: Settings, *, writer: bool = True) -> None:
        self._db_path = settings.resolved_sqlite_path()
        self._db_path.parent.mkdir(parents=True, exist_ok=True)
        blob_dir = settings.resolved_blob_dir()
        blob_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._take_lock(self._db_path.parent / ".lock") if writer else None
        self._packs = PackStore(blob_dir, settings.pack_max_bytes, settings.fsync)
        self._wlock = threading.RLock()  # write_blobs runs inside transaction()
        self._wconn = _connect(self._db_path)
        self._wconn.executescript(SCHEMA)
        self._local = threading.local()

    @staticmethod
    def _take_lock(path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise FailedPrecondition(
                f"capture store {path.parent} is in use by another process (pid {holder or '?'}); "
                "talk to it over gRPC (--target) instead"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _rconn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _connect(self._db_path)
        return conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._wlock:
            conn = self._wconn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[View]:
        with self._write() as conn:
            view = _SqliteView(conn)
            yield view
            now = time.time()
            for run in view.runs:
                conn.execute(
                    "INSERT INTO runs (run, updated_at) VALUES (?, ?) "
                    "ON CONFLICT (run) DO UPDATE SET updated_at = excluded.updated_at",
                    (run, now),
                )

    def get_many(self, keys: list[Key]) -> list[bytes | None]:
        view = _SqliteView(self._rconn())
        view.prefetch(keys)
        return [view.get(k) for k in keys]

    def write_blobs(self, run: str, blobs: list[bytes], kind: str = "parts") -> list[BlobRef]:
        with self._wlock:
            return self._packs.append(run, blobs)

    def read_blobs(self, run: str, refs: list[BlobRef]) -> list[bytes]:
        return self._packs.read(run, refs)

    def list_trials(self, run: str, after_seq: int, limit: int) -> list[tuple[int, str]]:
        rows = self._rconn().execute(
            "SELECT seq, trial FROM trials WHERE run = ? AND seq > ? ORDER BY seq LIMIT ?", (run, after_seq, limit)
        )
        return [(int(seq), str(trial)) for seq, trial in rows]

    def count_trials(self, run: str) -> int:
        return int(self._rconn().execute("SELECT COUNT(*) FROM trials WHERE run = ?", (run,)).fetchone()[0])

    def runs_with_trial(self, trial: str) -> list[str]:
        rows = self._rconn().execute("SELECT DISTINCT run FROM trials WHERE trial = ? ORDER BY run", (trial,))
        return [str(r) for (r,) in rows]

    def delete_run(self, run: str) -> None:
        with self._write() as conn:
            for table in RUN_TABLES:
                conn.execute(f"DELETE FROM {table} WHERE run = ?", (run,))
            self._packs.delete_run(run)

    def runs_updated_before(self, cutoff: float) -> list[tuple[str, float]]:
        rows = self._rconn().execute("SELECT run, updated_at FROM runs WHERE updated_at < ? ORDER BY run", (cutoff,))
        return [(str(r), float(t)) for r, t in rows]

    def ready_subscribe(self, run: str, group: str, consumer: str, lease_s: float) -> None:
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO cgroups (run, cg, last_seq) VALUES (?, ?, 0)", (run, group))
            self._alive(conn, run, group, consumer, time.time() + lease_s)

    @staticmethod
    def _alive(conn: sqlite3.Connection, run: str, group: str, consumer: str, until: float) -> None:
        conn.execute(
            "INSERT INTO consumers (run, cg, consumer, alive_until) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (run, cg, consumer) DO UPDATE SET alive_until = excluded.alive_until",
            (run, group, consumer, until),
        )

    def ready_claim(self, run: str, group: str, consumer: str, own: bool) -> list[Delivery]:
        now = time.time()
        with self._write() as conn:
            alive = {
                c
                for (c,) in conn.execute(
                    "SELECT consumer FROM consumers WHERE run = ? AND cg = ? AND alive_until >= ?", (run, group, now)
                )
            }
            pending = conn.execute(
                "SELECT d.seq, d.consumer, d.count, r.payload FROM deliveries d JOIN ready r "
                "ON r.run = d.run AND r.seq = d.seq WHERE d.run = ? AND d.cg = ? AND d.acked = 0 ORDER BY d.seq",
                (run, group),
            ).fetchall()
            out = []
            for seq, owner, count, payload in pending:
                if (owner == consumer and own) or (owner != consumer and owner not in alive):
                    conn.execute(
                        "UPDATE deliveries SET consumer = ?, count = ? WHERE run = ? AND cg = ? AND seq = ?",
                        (consumer, count + 1, run, group, seq),
                    )
                    out.append(Delivery(str(seq), payload, count))
            return out

    def ready_read(self, run: str, group: str, consumer: str, count: int) -> list[Delivery]:
        with self._write() as conn:
            row = conn.execute("SELECT last_seq FROM cgroups WHERE run = ? AND cg = ?", (run, group)).fetchone()
            if row is None:
                raise FailedPrecondition(f"consumer group {group!r} of run {run!r} does not exist (run deleted?)")
            rows = conn.execute(
                "SELECT seq, payload FROM ready WHERE run = ? AND seq > ? ORDER BY seq LIMIT ?", (run, row[0], count)
            ).fetchall()
            for seq, _ in rows:
                conn.execute(
                    "INSERT INTO deliveries (run, cg, seq, consumer, count, acked) VALUES (?, ?, ?, ?, 1, 0)",
                    (run, group, seq, consumer),
                )
            if rows:
                conn.execute("UPDATE cgroups SET last_seq = ? WHERE run = ? AND cg = ?", (rows[-1][0], run, group))
            return [Delivery(str(seq), payload, 0) for seq, payload in rows]

    def ready_find(self, run: str, group_id: str) -> str | None:
        row = self._rconn().execute("SELECT seq FROM ready WHERE run = ? AND group_id = ?", (run, group_id)).fetchone()
        return None if row is None else str(row[0])

    def ready_ack(self, run: str, group: str, entry: str) -> None:
        with self._write() as conn:
            conn.execute(
                "UPDATE deliveries SET acked = 1 WHERE run = ? AND cg = ? AND seq = ?", (run, group, int(entry))
            )

    def ready_heartbeat(self, run: str, group: str, consumer: str, lease_s: float) -> None:
        with self._write() as conn:
            self._alive(conn, run, group, consumer, time.time() + lease_s)

    def ready_leave(self, run: str, group: str, consumer: str) -> None:
        with self._write() as conn:
            self._alive(conn, run, group, consumer, 0.0)

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))

    def close(self) -> None:
        with self._wlock:
            self._packs.close()
            self._wconn.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
