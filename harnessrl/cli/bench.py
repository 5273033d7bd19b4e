"""``harnessrl bench``."""

from __future__ import annotations

import typer

app = typer.Typer(help="bench", no_args_is_help=True)


@app.command("gateway")
def gateway(
    turns: int = typer.Option(3072, help="Turns per scripted row (split across the sessions)."),
    local: bool = typer.Option(False, help="Also measure the local CPU engine (slow: loads the model)."),
) -> None:
    """Gateway overhead: scripted engine straight vs through gRPC; optionally local engine decode rates."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from services.gateway import bench as gateway_bench

    rows = asyncio.run(gateway_bench.bench_scripted([1, 64, 384], [1_000, 32_000], turns))
    if local:
        rows += asyncio.run(gateway_bench.bench_local([1, 4], 32, 256))
    table = Table(title="harnessrl bench gateway")
    for column in ("path", "sessions", "context", "turns", "seconds", "per second"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for r in rows:
        table.add_row(r.what, str(r.concurrency), str(r.context), str(r.turns), f"{r.seconds:.2f}", f"{r.rate:.0f}")
    Console().print(table)
