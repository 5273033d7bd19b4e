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
