"""``python -m services.sandbox_remote [--host H] [--port P]``: serves the remote
front until SIGTERM. Settings come from the environment (``HARNESSRL_SANDBOX_REMOTE_*``)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from harnessrl import logs, tls
from harnessrl.config import validate
from harnessrl.errors import HarnessError
from harnessrl.rpc import stop_on_signals
from services.sandbox_remote.server import create_remote_server
from services.sandbox_remote.settings import Settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.sandbox_remote", description=__doc__.split("\n")[0])
    parser.add_argument("--host", help="Bind address (default 127.0.0.1).")
    parser.add_argument("--port", type=int, help="Port (0 picks a free one).")
    parser.add_argument("--executor-url", help="The executor's base URL, http://host:port.")
    args = parser.parse_args(argv)
    overrides = {"host": args.host, "port": args.port, "executor_url": args.executor_url}
    try:
        settings = validate(Settings, {k: v for k, v in overrides.items() if v is not None}, "sandbox_remote")
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    logs.configure(settings.log_level)
    tls.use(settings.tls)

    async def run() -> None:
        stop = stop_on_signals()
        server = await create_remote_server(settings)
        print(f"sandbox_remote listening on {settings.host}:{server.port}", file=sys.stderr, flush=True)
        await server.wait_for_signal(stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
