"""``harnessrl dashboard``."""

from __future__ import annotations

import typer

from harnessrl.cli.common import ConfigOption, HostOption, PortOption, serve_http

app = typer.Typer(help="The dashboard (HTTP).", no_args_is_help=True)


@app.command()
def serve(config: ConfigOption = None, host: HostOption = None, port: PortOption = None) -> None:
    """Serve the dashboard over HTTP until SIGTERM."""
    from services.dashboard.app import create_app
    from services.dashboard.settings import Settings

    serve_http(create_app, Settings, "dashboard", config, {"host": host, "port": port})
