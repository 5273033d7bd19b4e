"""``harnessrl report`` on what ``harnessrl eval`` makes (a run directory with no training
step): labelled as an evaluation, not "learning (lr ...)"; a single evaluation step is
drawn as bars, not one dot; index.html shows the tables as HTML, not raw markdown."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

from PIL import Image
from typer.testing import CliRunner

from stack.cli.main import app
from stack.report import page
from stack.report_plot import COLORS, plot
from tests.integration.test_dashboard.recorder import RUN_ID, Recorded


def colored(png: bytes, color: tuple[int, int, int]) -> int:
    counts = Image.open(io.BytesIO(png)).convert("RGB").getcolors(maxcolors=1 << 20) or []
    return sum(n for n, c in counts if c == color)


def test_an_evaluation_only_run_is_labelled_as_such(recorded: Recorded, tmp_path: Path) -> None:
    path = tmp_path / "eval" / RUN_ID
    shutil.copytree(recorded.run_dir, path)
    info = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps(info | {"steps_planned": 0}))
    (path / "config.toml").write_text((path / "config.toml").read_text() + "\n[trainer.optim]\nlr = 1e-5\n")
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    assert list(data["groups"]) == ["evaluation only (no training)"] and data["runs"][0]["evaluation_only"]
    assert "learning" not in (out / "report.md").read_text()
    html = (out / "index.html").read_text()
    assert "<table>" in html and "<h2>evaluation only (no training): 1 runs" in html
    assert "| step |" not in html and "## " not in html


def test_a_single_evaluation_step_is_drawn_as_bars() -> None:
    png = plot({"control (lr 0)": [("a", {0: 0.5}), ("b", {0: 0.25})], "learning": [("c", {0: 0.75})]})
    assert Image.open(io.BytesIO(png)).size == (960, 520)
    # a bar of half the plot's height, not a dot of ~50 pixels
    assert colored(png, COLORS[0]) > 5000 and colored(png, COLORS[1]) > 5000
    two_steps = plot({"control (lr 0)": [("a", {0: 0.5, 5: 0.6})]})
    assert 0 < colored(two_steps, COLORS[0]) < 5000  # curves keep their line chart


def test_the_page_escapes_html_in_the_markdown() -> None:
    shown = page("# t\n\n<script>alert(1)</script>\n\n| a |\n| --- |\n| 1 |\n", b"png")
    assert "<script>" not in shown and "&lt;script&gt;" in shown and "<td>1</td>" in shown
