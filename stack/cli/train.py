"""``harnessrl train``: Trainer: serve status/metrics and run training."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer

from stack.cli.common import ConfigOption, HostOption, PortOption, serve_grpc

app = typer.Typer(help="Trainer: serve status/metrics and run training.", no_args_is_help=True)


@app.command()
def serve(config: ConfigOption = None, host: HostOption = None, port: PortOption = None) -> None:
    """Serve the trainer gRPC service until SIGTERM; with a capture store configured
    (capture_target), also train on its ready groups, resuming from the newest checkpoint."""
    from services.trainer.app import TrainerApp
    from services.trainer.settings import Settings

    serve_grpc(Settings, "trainer", config, {"host": host, "port": port}, _start_app(TrainerApp))


def _start_app(app_cls):  # type: ignore[no-untyped-def]
    """Adapts TrainerApp to serve_grpc's ``create(settings) -> RunningServer`` (stop also stops the loop)."""

    async def create(settings):  # type: ignore[no-untyped-def]
        trainer_app = app_cls(settings)
        server = await trainer_app.start()
        original_stop = server.stop

        async def stop(grace: float | None = None) -> None:
            await trainer_app.stop_training()
            await original_stop(grace)

        server.stop = stop
        return server

    return create


@app.command()
def agreement(
    run: Annotated[str, typer.Option("--run", help="Run id in the capture store.")],
    model: Annotated[Path, typer.Option("--model", help="HF model folder (e.g. a trainer checkpoint).")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the JSON report.")],
    capture: Annotated[
        str, typer.Option("--capture", envvar="HARNESSRL_CAPTURE_TARGET", help="Capture store host:port.")
    ] = "127.0.0.1:50051",
    limit: Annotated[int, typer.Option(min=0, help="At most this many trajectories (0 = all).")] = 0,
    temperature: Annotated[
        float, typer.Option(min=0.01, max=5.0, help="The run's sampling temperature (its [run] temperature).")
    ] = 1.0,
) -> None:
    """Recompute train/inference logprob agreement for a captured run and write a report."""
    from services.trainer import offline

    token = os.environ.get("HARNESSRL_SERVICE_TOKEN")
    data = asyncio.run(offline.run(capture, run, model, out, token, limit, temperature))
    overall = data["overall"]
    typer.echo(
        f"{int(overall['agreement/tokens'])} tokens: pearson {overall['agreement/pearson']:.5f}, "
        f"mean |Δ| {overall['agreement/mean_abs_diff']:.2e}, max |Δ| {overall['agreement/max_abs_diff']:.2e}, "
        f"ESS {overall['agreement/ess']:.3f} -> {out}"
    )
    for line in data["alerts"]:
        typer.secho(f"alert: {line}", fg=typer.colors.YELLOW, err=True)
