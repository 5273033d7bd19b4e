"""A public verifier of a compose task, on docker: its own network (``verify_network``)
and the services still reachable by name, as Harbor's verifier has both.

The services live in the holder's network namespace, which has no network and never
gets one (no bridge; invariant 6), and a container cannot be in two namespaces. So the
verifier's container gets the public network, every service name mapped to its own
127.0.0.1, and the worker relays each TCP port the services listen on: a listener on
127.0.0.1:<port> made inside the verifier's namespace (``netns.listen_in``), and for
each connection a socket made inside the holder's namespace that dials the same port
there. Only the ports listening when the verify phase starts are relayed, TCP only
(a service reached over UDP is not); the relays close with the trial. With
``verify_network = "host"`` (a setting for tests) they listen on the host's loopback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from services.sandbox.backends.netns import listen_in, socket_in
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.relay import pipe

log = logging.getLogger(__name__)
_LISTEN = "0A"
_LOOPBACK_OR_ANY = {"0100007F", "00000000", "00000000000000000000000001000000", "0" * 32}


def listening_ports(pid: int) -> list[int]:
    """The TCP ports listening on loopback or any address in the network namespace of ``pid``."""
    ports: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _LISTEN:
                continue
            address, _, port = fields[1].partition(":")
            if address in _LOOPBACK_OR_ANY:
                ports.add(int(port, 16))
    return sorted(ports)


async def relay_services(holder_pid: int, verifier_pid: int) -> list[asyncio.Server]:
    """One relay per service port, from the verifier's loopback to the holder's."""
    servers: list[asyncio.Server] = []
    loop = asyncio.get_running_loop()

    def handler(port: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                upstream = await asyncio.to_thread(socket_in, holder_pid)
                await loop.sock_connect(upstream, ("127.0.0.1", port))
                up_reader, up_writer = await asyncio.open_connection(sock=upstream)
            except OSError as e:
                log.warning("service relay could not dial", extra={"kv": {"port": port, "error": str(e)}})
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            up_writer.close()
            writer.close()

        return serve

    try:
        for port in await asyncio.to_thread(listening_ports, holder_pid):
            listener = await asyncio.to_thread(listen_in, verifier_pid, "127.0.0.1", port)
            servers.append(await asyncio.start_server(handler(port), sock=listener))
    except (OSError, EnvSetupError) as e:
        await close(servers)
        raise EnvSetupError(f"relaying the compose services into the verifier's network failed: {e}") from e
    return servers


async def close(servers: list[asyncio.Server]) -> None:
    for server in servers:
        server.close()
    for server in servers:
        try:
            await asyncio.wait_for(server.wait_closed(), 2)
        except TimeoutError:
            pass
