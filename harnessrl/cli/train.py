"""``harnessrl train``: Trainer: serve status/metrics and run training."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer

from harnessrl.cli.common import ConfigOption, HostOption, PortOption, serve_grpc

app = typer.Typer(help="Trainer: serve status/metrics and run training.", no_args_is_help=True)


@app.command()
def serve(config: ConfigOption = None, host: HostOption = None, port: PortOption = None) -> None:
    """Serve the trainer gRPC service until SIGTERM."""
    from services.trainer.server import create_server
    from services.trainer.settings import Settings

    serve_grpc(Settings, "trainer", config, {"host": host, "port": port}, create_server)


@app.command()
def agreement(
    run: Annotated[str, typer.Option("--run", help="Run id in the capture store.")],
    model: Annotated[Path, typer.Option("--model", help="HF model folder (e.g. a trainer checkpoint).")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the JSON report.")],
    capture: Annotated[
        str, typer.Option("--capture", envvar="HARNESSRL_CAPTURE_TARGET", help="Capture store host:port.")
    ] = "127.0.0.1:50051",
    limit: Annotated[int, typer.Option(min=0, help="At most this many trajectories (0 = all).")] = 0,
) -> None:
    """Recompute train/inference logprob agreement for a captured run and write a report."""
    from services.trainer import offline

    token = os.environ.get("HARNESSRL_SERVICE_TOKEN")
    data = asyncio.run(offline.run(capture, run, model, out, token, limit))
    overall = data["overall"]
    typer.echo(
        f"{int(overall['agreement/tokens'])} tokens: pearson {overall['agreement/pearson']:.5f}, "
        f"mean |Δ| {overall['agreement/mean_abs_diff']:.2e}, max |Δ| {overall['agreement/max_abs_diff']:.2e}, "
        f"ESS {overall['agreement/ess']:.3f} -> {out}"
    )
    for line in data["alerts"]:
        typer.secho(f"alert: {line}", fg=typer.colors.YELLOW, err=True)
