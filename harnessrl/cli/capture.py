"""``harnessrl capture``: Capture store: serve, export and inspect captured trajectories."""

from __future__ import annotations

import typer

from harnessrl.cli.common import ConfigOption, HostOption, PortOption, serve_grpc

app = typer.Typer(help="Capture store: serve, export and inspect captured trajectories.", no_args_is_help=True)


@app.command()
def serve(config: ConfigOption = None, host: HostOption = None, port: PortOption = None) -> None:
    """Serve the capture_store gRPC service until SIGTERM."""
    from services.capture_store.server import create_server
    from services.capture_store.settings import Settings

    serve_grpc(Settings, "capture_store", config, {"host": host, "port": port}, create_server)
