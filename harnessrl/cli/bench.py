"""``harnessrl bench``: benchmarks, each printing a table with a baseline measured in the same run."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

app = typer.Typer(help="bench", no_args_is_help=True)


@app.command()
def sandbox(trials: Annotated[int, typer.Option(min=2, help="Trials per measurement.")] = 20) -> None:
    """Local sandbox: overhead per trial (warm layer cache) and trials/minute at concurrency 1, 4, 16."""
    from services.sandbox.bench import print_report, run_bench

    print_report(*asyncio.run(run_bench(trials)))


@app.command()
def proxy(quick: bool = typer.Option(False, help="Fewer turns: a smoke run, not a measurement.")) -> None:
    """Per-turn proxy overhead vs naive re-tokenization; throughput through the proxy vs straight to the engine."""
    from services.proxy.bench import print_tables, run

    print_tables(*run(quick))


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
