"""The one table printer every bench uses: cells through str, chosen columns
left-aligned, notes after the table, the same console reused."""

from __future__ import annotations

import io
import os

from rich.console import Console

from harnessrl.benchtable import load_average, print_table


def test_table_cells_alignment_and_notes() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80)
    returned = print_table(
        "t", ("name", "n"), [("a", 12345), ("bbbbbb", 7)], "note one", left=("name",), console=console
    )
    assert returned is console
    lines = out.getvalue().splitlines()
    rows = [line for line in lines if "│" in line]
    assert rows[0].startswith("│ a      │") and rows[0].endswith("12345 │")  # left, then right-aligned
    assert rows[1].endswith("    7 │")
    assert lines[-1] == "note one"


def test_load_average_names_the_cores() -> None:
    text = load_average(2)
    assert text == f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
