"""How every ``harnessrl bench`` prints: one rich table per measurement, its
notes under it, and the machine's load beside the figures (a ratio measured
on a loaded machine is read differently from one measured on an idle one)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any


def load_average(digits: int = 1) -> str:
    return f"load average {os.getloadavg()[0]:.{digits}f} on {os.cpu_count()} cores"


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *notes: str,
    left: Sequence[str] = (),
    console: Any = None,
) -> Any:
    """Prints the table (cells through ``str``; the ``left`` columns left-aligned,
    the rest right-aligned), then each note on its line; returns the console."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column in left else "right")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    console = console or Console()
    console.print(table)
    for note in notes:
        console.print(note)
    return console
