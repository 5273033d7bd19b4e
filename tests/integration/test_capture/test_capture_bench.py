"""``harnessrl bench capture`` runs end to end on a small load (numbers are the
benchmark's business, not asserted here) and refuses bad options."""

from __future__ import annotations

from typer.testing import CliRunner

from services.capture_store.bench import BenchConfig, table_rows
from stack.bench.capture import run
from stack.cli.main import app


def test_bench_runs_small_and_reports_every_metric() -> None:
    cfg = BenchConfig(
        backends=("embedded",), writers=2, tokens=10_000, turns=3, readback_tokens=8_000,
        baseline_tokens=5_000, storage_trials=2, storage_turns=3,
    )  # fmt: skip
    res = run(cfg)
    rows = {row[0]: row[1:] for row in table_rows(res)}
    assert float(rows["bytes/token: ids+mask+logprobs+versions"][0]) > 0
    assert rows["bytes/token: ids+mask+logprobs+versions"][2] != "-"  # the baseline measured in the same run
    for metric in ("append: tokens/s (64 writers, gRPC)", "read-back 200k-token trajectory (ms)"):
        embedded, _, baseline, _ = rows[metric]
        assert embedded != "-" and baseline != "-"
    assert any("storage set" in note for note in res.notes)


def test_bench_refuses_unknown_backend() -> None:
    result = CliRunner().invoke(app, ["bench", "capture", "--backends", "mongo"])
    assert result.exit_code == 2 and "choose from embedded, distributed" in result.output
