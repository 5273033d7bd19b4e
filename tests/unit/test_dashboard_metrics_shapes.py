"""metrics.jsonl in both shapes (harnessrl's trainer, verl's file logger): lines of
one step merge, and a malformed line is one problem naming its line and why."""

from __future__ import annotations

from pathlib import Path

from services.dashboard import rundir


def read(tmp_path: Path, text: str) -> tuple[list[rundir.StepRecord], list[str]]:
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(text)
    return rundir.read_metrics(rundir.open_run(tmp_path, "r"))


def test_both_shapes_and_one_step_in_two_lines_merge(tmp_path: Path) -> None:
    records, problems = read(
        tmp_path,
        '{"step": 1, "data": {"harnessrl/masked_rows": 2, "note": "text"}}\n'
        '{"step": 1, "data": {"val-core/x": 0.5}}\n'
        '{"step": 2, "wall_time": 9.5, "values": {"reward/mean": 1}}\n',
    )
    assert problems == []
    assert [(r.step, r.wall_time, r.values) for r in records] == [
        (1, 0.0, {"harnessrl/masked_rows": 2.0, "val-core/x": 0.5}),
        (2, 9.5, {"reward/mean": 1.0}),
    ]


def test_malformed_lines_are_named_and_the_rest_is_kept(tmp_path: Path) -> None:
    records, problems = read(
        tmp_path,
        '{"step": 1}\n{"step": 2, "data": [1]}\n{"step": 3, "data": {}, "wall_time": "soon"}\n'
        '{"step": 4, "data": {"harnessrl/dropped_segments": 1}}\n',
    )
    assert problems == [
        "metrics.jsonl line 1: ValueError: a line needs 'values' (harnessrl's trainer) or 'data' (verl's file logger)",
        "metrics.jsonl line 2: TypeError: step must be an integer and data an object",
        "metrics.jsonl line 3: TypeError: wall_time must be a number, got 'soon'",
    ]
    assert [(r.step, r.values) for r in records] == [(4, {"harnessrl/dropped_segments": 1.0})]
