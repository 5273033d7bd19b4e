"""A worker-side relay into a container's network namespace: the proxy's only
way in, with nothing needed inside the image.

``listen_in(pid, host, port)`` makes a listening TCP socket inside the network
namespace of process ``pid`` (a container's init): a short-lived thread enters
that namespace with ``setns(2)`` (per thread, so the worker's other threads
keep theirs), binds, and exits. A socket keeps the namespace it was made in,
so the worker's event loop then accepts on it (``relay.UnixRelay`` with
``listener``) and forwards every connection to the proxy's Unix socket from
the worker's own namespaces. The container
itself runs with ``--network none``: the loopback port is all it has.
Needs CAP_SYS_ADMIN (a root worker), like the engine it talks to.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable

from services.sandbox.common.errors import EnvSetupError

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def made_in(pid: int, make: Callable[[], socket.socket]) -> socket.socket:
    """A socket ``make`` creates inside the network namespace of ``pid`` (non-blocking);
    OSError naming the namespace when it cannot be entered or ``make`` fails."""
    result: dict[str, object] = {}

    def enter_and_make() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into the network namespace of pid {pid}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result["socket"] = make()
        except OSError as e:
            result["error"] = e

    # The thread ends inside the container's namespace; only it ever entered.
    thread = threading.Thread(target=enter_and_make, name=f"netns-{pid}")
    thread.start()
    thread.join()
    if "error" in result:
        raise OSError(f"in the network namespace of pid {pid}: {result['error']}")
    sock = result["socket"]
    assert isinstance(sock, socket.socket)
    sock.setblocking(False)
    return sock


def listen_in(pid: int, host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` in the network namespace of ``pid``."""
    try:
        return made_in(pid, lambda: socket.create_server((host, port), backlog=128))
    except OSError as e:
        raise EnvSetupError(f"cannot open the proxy port in the sandbox: {e}") from e


def socket_in(pid: int) -> socket.socket:
    """An unconnected TCP socket of the network namespace of ``pid`` (it keeps it wherever used)."""
    return made_in(pid, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
