"""``harnessrl report``: runs of the recorded run directory (real trials, real capture
store) under different seeds and learning rates, side by side."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from stack.cli.main import app
from tests.integration.test_dashboard.recorder import EVAL_PLAN, RUN_ID, Recorded


def copy_run(recorded: Recorded, root: Path, seed: int, lr: float) -> Path:
    """The recorded run under another seed and learning rate (its config says which)."""
    path = root / f"seed{seed}-lr{lr:g}" / RUN_ID
    shutil.copytree(recorded.run_dir, path)
    config = path / "config.toml"
    text = config.read_text().replace("[run]\n", f"[run]\nseed = {seed}\n", 1)
    config.write_text(text + f"\n[trainer.optim]\nlr = {lr}\n")
    return path


def test_report_groups_runs_by_learning_rate_and_writes_plot_tables_and_page(
    recorded: Recorded, tmp_path: Path
) -> None:
    runs = [copy_run(recorded, tmp_path, s, lr) for s, lr in ((0, 1e-5), (1, 1e-5), (0, 0.0))]
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    assert list(data["groups"]) == ["control (lr 0)", "learning (lr 1e-05)"]
    learning = data["groups"]["learning (lr 1e-05)"]
    assert learning["seeds"] == [0, 1] and data["groups"]["control (lr 0)"]["seeds"] == [0]
    last = str(max(EVAL_PLAN))
    per_run = [r["heldout"][last]["pass"]["pass@1"] for r in data["runs"] if r["lr"] == 1e-5]
    cell = learning["steps"][last]["pass@1"]
    assert cell["n"] == 2 and cell["mean"] == pytest.approx(sum(per_run) / 2) and cell["sd"] == 0.0
    assert set(learning["steps"]) == {str(s) for s in EVAL_PLAN}
    assert learning["steps"][last]["submit_rate"]["mean"] == data["runs"][0]["heldout"][last]["submit_rate"]
    md = (out / "report.md").read_text()
    assert "## learning (lr 1e-05): 2 runs (seeds 0, 1)" in md and "| step | pass@1 |" in md
    assert re.search(rf"^\| {last} \| 0\.75 ± 0\.00 \[0\.75-0\.75\]", md, re.M), md
    image = Image.open(io.BytesIO((out / "report.png").read_bytes()))
    assert image.format == "PNG" and image.size == (960, 520)
    page = (out / "index.html").read_text()
    assert "data:image/png;base64," in page and "learning (lr 1e-05)" in page
    assert "held-out pass@1 at the last evaluation 0.750" in result.output


def report(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command line (its entry point turns a bad input into one line and exit 2)."""
    cmd = [sys.executable, "-m", "stack.cli", "report", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_report_refuses_what_is_not_an_evaluated_run(recorded: Recorded, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = report(str(tmp_path), "--out", str(out))
    assert result.returncode == 2 and "not a run directory" in result.stderr, result.stderr
    bare = copy_run(recorded, tmp_path, 0, 1e-5)
    (bare / "eval.jsonl").unlink()
    result = report(str(bare), "--out", str(out))
    assert result.returncode == 2 and "no held-out evaluation in rec-1" in result.stderr, result.stderr
    result = report("--out", str(out))
    assert result.returncode == 2 and "Missing argument" in result.stderr
    assert not out.exists()
