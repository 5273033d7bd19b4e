"""Runs inside the sandbox (stdlib only): listens on a loopback port, forwards
every connection to the proxy's Unix socket bound into the sandbox, then
execs the harness. The sandbox has an empty network namespace, so this port
is the only way out, and it leads to the proxy alone.

Usage: python3 forwarder.py HOST:PORT SOCKET -- COMMAND [ARGS...]

The listening socket is bound before the harness starts, so its first request
never races the forwarder; the forwarding process dies with the sandbox.
"""

import os
import socket
import sys
import threading


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _handle(client: socket.socket, target: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(target)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _serve(listener: socket.socket, target: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_handle, args=(client, target), daemon=True).start()


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: forwarder.py HOST:PORT SOCKET -- COMMAND [ARGS...]\n")
        sys.exit(2)
    host, _, port = argv[0].rpartition(":")
    target, command = argv[1], argv[3:]
    listener = socket.create_server((host, int(port)))
    if os.fork() == 0:
        try:
            _serve(listener, target)
        finally:
            os._exit(0)
    listener.close()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
