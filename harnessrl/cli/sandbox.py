"""``harnessrl sandbox``: Sandbox service: serve the trial API and run workers."""

from __future__ import annotations

import typer

from harnessrl.cli.common import ConfigOption, HostOption, PortOption, serve_grpc

app = typer.Typer(help="Sandbox service: serve the trial API and run workers.", no_args_is_help=True)


@app.command()
def serve(config: ConfigOption = None, host: HostOption = None, port: PortOption = None) -> None:
    """Serve the sandbox gRPC service until SIGTERM."""
    from services.sandbox.server import create_server
    from services.sandbox.settings import Settings

    serve_grpc(Settings, "sandbox", config, {"host": host, "port": port}, create_server)
