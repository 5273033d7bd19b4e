"""Whose sampling parameters the engine gets, through a real proxy, gateway
(scripted engine) and capture store: under ``sampling = "honour"`` the harness's
temperature is what the engine samples with and what the segment records (a change
opens the next segment); under ``"pin"`` the run's wins, each override counted on
the trial and in the metric. ``capture export`` and ``export-parquet`` carry it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pyarrow.parquet as pq
import pytest
from prometheus_client import REGISTRY

from harnessrl.paths import PROJECT_ROOT
from tests.integration.proxy.stack import CAPTURE_TOKEN, MODEL, Stack, check_faithful, script


def _stack(tmp: Path, mode: str) -> Stack:
    replies = {"*": [{"content": f"Reply {i}."} for i in range(3)]}
    return Stack(tmp, script(tmp, replies), sampling=mode, temperature=0.7, main_requires_tools=False)


@pytest.fixture
def honour(tmp_path: Path) -> Iterator[Stack]:
    s = _stack(tmp_path, "honour")
    yield s
    s.stop()


@pytest.fixture
def pin(tmp_path: Path) -> Iterator[Stack]:
    s = _stack(tmp_path, "pin")
    yield s
    s.stop()


def _converse(stack: Stack, trial: str, temperatures: list[float]) -> None:
    """One conversation, each call at the harness's own temperature (as a harness may set it per call)."""
    base, token = stack.new_trial(trial)
    client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    messages: list[dict[str, str]] = []
    for i, t in enumerate(temperatures):
        messages.append({"role": "user", "content": f"question {i}"})
        reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=t, top_p=0.9)  # type: ignore[arg-type]
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


def _export(stack: Stack, tmp: Path, trial: str) -> tuple[list[dict[str, object]], list[object]]:
    """The trial through the real CLI: ``capture export`` (JSONL) and ``export-parquet``."""
    env = {**os.environ, "HARNESSRL_CAPTURE_TOKEN": CAPTURE_TOKEN, "PYTHONPATH": str(PROJECT_ROOT)}
    target = f"127.0.0.1:{stack.store_port}"
    jsonl, parquet = tmp / f"{trial}.jsonl", tmp / f"{trial}.parquet"
    for args in (
        ["export", "--trial", trial, "--run", "run-1", "--out", str(jsonl)],
        ["export-parquet", "--run", "run-1", "--out", str(parquet)],
    ):
        cmd = [sys.executable, "-m", "stack.cli", "capture", *args, "--target", target]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    table = pq.read_table(parquet).to_pylist()
    return rows, next(r["segment_sampling"] for r in table if r["trial_id"] == trial)


def test_honour_samples_with_the_harnesss_temperature_and_a_change_opens_a_segment(
    honour: Stack, tmp_path: Path
) -> None:
    _converse(honour, "honoured", [0.2, 0.2, 0.9])
    summary = honour.close_trial("honoured")
    assert summary["sampling"] == "honour" and summary["sampling_overrides"] == 0
    log = [g for g in honour.engine_log() if g["trial_id"] == "honoured"]
    assert [g["sampling"]["temperature"] for g in log] == [0.2, 0.2, 0.9]  # what the engine was asked
    assert {g["sampling"]["top_p"] for g in log} == {0.9}
    segments = honour.export("honoured")
    check_faithful(segments, honour.engine_log(), "honoured")  # nothing lost or trained twice at the split
    rows, column = _export(honour, tmp_path, "honoured")
    got = [(r["segment_index"], r["num_turns"], r["sampling"]["temperature"]) for r in rows]  # type: ignore[index]
    assert got == [(0, 2, 0.2), (1, 1, 0.9)]
    first = rows[0]["sampling"]
    assert first == {  # type: ignore[comparison-overlap]
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 0,  # asked by neither: the run's
        "min_p": 0.0,
        "mode": "honour",
        "from_harness": ["temperature", "top_p"],
        "overridden": [],
    }
    assert [(c["segment_index"], c["temperature"], c["mode"]) for c in column] == [
        (0, 0.2, "honour"),
        (1, 0.9, "honour"),
    ]  # type: ignore[index]


def _overrides(field: str) -> float:
    return REGISTRY.get_sample_value("harnessrl_sampling_overrides_total", {"service": "proxy", "field": field}) or 0.0


def test_pin_samples_with_the_runs_temperature_and_counts_each_override(pin: Stack, tmp_path: Path) -> None:
    before = _overrides("temperature"), _overrides("top_p")
    _converse(pin, "pinned", [0.2, 0.2, 0.9])
    summary = pin.close_trial("pinned")
    assert summary["sampling"] == "pin"
    assert summary["sampling_overrides_by_field"] == {"temperature": 3, "top_p": 3}  # the run's top_p is 1.0
    assert summary["sampling_overrides"] == 6
    assert (_overrides("temperature") - before[0], _overrides("top_p") - before[1]) == (3, 3)
    log = [g for g in pin.engine_log() if g["trial_id"] == "pinned"]
    assert [(g["sampling"]["temperature"], g["sampling"]["top_p"]) for g in log] == [(0.7, 1.0)] * 3
    rows, column = _export(pin, tmp_path, "pinned")
    assert len(rows) == 1 and rows[0]["num_turns"] == 3  # one distribution: one segment
    assert rows[0]["sampling"] == {
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "mode": "pin",
        "from_harness": [],
        "overridden": ["temperature", "top_p"],
    }
    assert [(c["temperature"], c["overridden"]) for c in column] == [(0.7, ["temperature", "top_p"])]  # type: ignore[index]


def test_max_tokens_cap_lowers_what_a_harness_asks_and_counts_it(tmp_path: Path) -> None:
    """``[proxy] max_tokens_cap`` (a run's response length): a harness asking for its model's
    ceiling (Qwen Code's ~32k) is sampled at the cap, counted as a max_tokens override; one
    asking less keeps its own; one naming none gets the default, capped, and nothing counted."""
    replies = {"*": [{"content": f"Reply {i}."} for i in range(3)]}
    stack = Stack(tmp_path, script(tmp_path, replies), max_tokens_cap=16, default_max_tokens=64)
    try:
        base, token = stack.new_trial("capped")
        client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
        messages: list[dict[str, str]] = []
        for i, asked in enumerate([32_000, 8, None]):
            messages.append({"role": "user", "content": f"question {i}"})
            extra = {} if asked is None else {"max_tokens": asked}
            reply = client.chat.completions.create(model=MODEL, messages=messages, **extra)  # type: ignore[arg-type]
            messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        summary = stack.close_trial("capped")
        log = [g for g in stack.engine_log() if g["trial_id"] == "capped"]
        assert [g["sampling"]["max_tokens"] for g in log] == [16, 8, 16]
        assert summary["sampling_overrides_by_field"] == {"max_tokens": 1} and summary["sampling_overrides"] == 1
    finally:
        stack.stop()
