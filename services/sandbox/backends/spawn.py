"""Starts one sandboxed command and reaps it itself, so that the CPU-seconds of its whole
process tree are known: ``wait4``'s rusage, recorded by ``harnessrl.cpu.reap`` under the
component the caller names. asyncio's subprocess support reaps with a plain ``waitpid``,
which drops them. Output is read on the event loop; the reap waits in its own thread,
as asyncio's thread-per-child watcher does."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
from dataclasses import dataclass
from typing import IO, Any

from harnessrl import cpu


@dataclass
class Child:
    pid: int
    stdout: asyncio.StreamReader
    exited: asyncio.Future[tuple[int, float]]  # (exit code as subprocess gives it, CPU-seconds of the tree)
    transport: asyncio.BaseTransport

    def close(self) -> None:
        """Closes our end of its output pipe (a leftover process may still hold the other)."""
        self.transport.close()


async def start(argv: list[str], *, stdin: bytes | None, pass_fds: list[int], component: str) -> Child:
    """The command in a new session, stdout and stderr on one pipe; ``stdin`` fed from a thread."""
    loop = asyncio.get_running_loop()
    popen = _popen(argv, stdin is not None, pass_fds)
    exited: asyncio.Future[tuple[int, float]] = loop.create_future()
    threading.Thread(target=_wait, args=(popen, component, loop, exited), name=f"reap-{popen.pid}", daemon=True).start()
    if stdin is not None:
        threading.Thread(target=_feed, args=(popen.stdin, stdin), name=f"feed-{popen.pid}", daemon=True).start()
    reader = asyncio.StreamReader()
    assert popen.stdout is not None
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), popen.stdout)
    return Child(popen.pid, reader, exited, transport)


def _popen(argv: list[str], stdin: bool, pass_fds: list[int]) -> subprocess.Popen[bytes]:
    """Forks on the event loop's thread, as asyncio's own subprocess support does."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=pass_fds,
        start_new_session=True,
    )


def _wait(popen: subprocess.Popen[bytes], component: str, loop: asyncio.AbstractEventLoop, exited: Any) -> None:
    """Holds ``popen`` until it is reaped here, then tells it so (it must not wait for it again)."""
    try:
        code, seconds = cpu.reap(popen.pid, component)
    except Exception as e:  # noqa: BLE001 - handed to the caller (ECHILD: someone else reaped it)
        outcome: Any = e
    else:
        popen.returncode = code
        outcome = (code, seconds)
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
        loop.call_soon_threadsafe(_settle, exited, outcome)


def _settle(exited: asyncio.Future[tuple[int, float]], outcome: Any) -> None:
    if exited.done():
        return
    if isinstance(outcome, Exception):
        exited.set_exception(outcome)
    else:
        exited.set_result(outcome)


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    with contextlib.suppress(OSError):  # the command exited without reading it all
        with pipe:
            pipe.write(data)
