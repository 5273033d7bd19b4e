"""The worker-side Unix-socket relay that lets a network-less sandbox reach the proxy
(the runner binds it into the agent phase; the docker backend accepts on it inside a
container's network namespace and relays a compose service's ports with ``pipe``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from pathlib import Path

log = logging.getLogger(__name__)


class UnixRelay:
    """A per-trial Unix socket on the worker that relays every connection to
    the proxy (its Unix socket or TCP address). Bound into the agent phase, it
    is the sandbox's only way out. With ``listener`` (a listening socket made
    elsewhere, e.g. inside a container's network namespace) it accepts there
    instead of on ``path``."""

    def __init__(
        self,
        path: Path | None,
        *,
        tcp: tuple[str, int] | None = None,
        uds: Path | None = None,
        listener: socket.socket | None = None,
        tcp_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.path = path
        self.tcp, self.uds = tcp, uds
        # The harness speaks plain HTTP to the relay inside its sandbox; the relay
        # speaks TLS to a proxy that serves it (TLS origination, on the worker).
        self.tcp_tls = tcp_tls
        self.listener = listener
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> UnixRelay:
        if self.listener is not None:
            self._server = await asyncio.start_server(self._handle, sock=self.listener)
            return self
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        os.chmod(self.path, 0o666)
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.uds is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(str(self.uds))
            else:
                assert self.tcp is not None
                up_reader, up_writer = await asyncio.open_connection(*self.tcp, ssl=self.tcp_tls)
        except (OSError, ssl.SSLError) as e:
            log.warning("relay to the proxy failed", extra={"kv": {"proxy": self.tcp or self.uds, "error": str(e)}})
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        for w in (writer, up_writer):
            with contextlib.suppress(Exception):
                w.close()

    async def stop(self) -> None:
        """Stops accepting at once (the sandbox's way out closes)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)
            self._server = None
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies ``reader`` to ``writer`` until EOF, then half-closes ``writer``."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
