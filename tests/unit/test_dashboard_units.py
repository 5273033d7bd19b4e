"""Pure parts of the dashboard: tool-call parsing, ChatML transcripts, run
directory reading with malformed files, anomaly detectors, settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl.config import validate
from harnessrl.errors import ConfigError, InvalidArgument, NotFound
from services.dashboard import panels, rundir
from services.dashboard.assist import AnalysisError, parse_candidates
from services.dashboard.rundir import StepRecord
from services.dashboard.settings import AlertSettings, Settings
from services.dashboard.text import tool_parser, transcript


def test_hermes_parser_reads_calls_and_counts_malformed_ones() -> None:
    p = tool_parser("hermes")
    ok = p.parse('Looking.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    assert ok.content == "Looking." and [(c.name, c.arguments) for c in ok.calls] == [("bash", {"command": "ls"})]
    bad = p.parse('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>')
    assert bad.calls == [] and bad.malformed == 1
    assert p.parse("<tool_call>{}</tool_call>").malformed == 1  # no name
    assert p.parse("plain answer").malformed == 0
    q = tool_parser("qwen3_coder").parse(
        "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
    )
    assert [(c.name, c.arguments) for c in q.calls] == [("bash", {"command": "ls"})]
    assert tool_parser("json").parse('{"name": "x", "arguments": {}}').calls[0].name == "x"
    with pytest.raises(ConfigError, match="valid:"):
        tool_parser("nope")


def test_transcript_attributes_each_message_to_prompt_context_or_sampled() -> None:
    chunks = [
        ("prompt", "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n"),
        ("sampled", 'ok\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'),
        ("context", "\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        ("sampled", "Done.<|im_end|>"),
    ]
    msgs = transcript(chunks, tool_parser("hermes"))
    assert [(m.role, m.source) for m in msgs] == [
        ("system", "prompt"),
        ("user", "prompt"),
        ("assistant", "sampled"),
        ("tool", "context"),
        ("assistant", "sampled"),
    ]
    assert msgs[2].calls[0].arguments == {"command": "ls"} and msgs[3].tool_results == ["a.txt"]
    assert msgs[4].text == "Done."
    plain = transcript([("prompt", "Q: hi\nA:"), ("sampled", " hello")], tool_parser("hermes"))
    assert [(m.role, m.text) for m in plain] == [("context", "Q: hi\nA:"), ("assistant", "hello")]


def test_run_directory_problems_name_the_file_and_line(tmp_path: Path) -> None:
    run = tmp_path / "r1"
    run.mkdir()
    (run / "run.json").write_text('{"run_id": "r1", "status": "exploded"}')
    (run / "config.toml").write_text("[run\n")
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "wall_time": 2, "values": {"a": 1, "b": NaN, "c": "x"}}\n[1]\n{"step": true, "values": {}}\n'
        '{"step": 2, "values": {"a": 2}}\n{"step": 3, "val'
    )
    r = rundir.open_run(tmp_path, "r1")
    assert r.info is None and any("run.json" in p and "status" in p for p in r.problems)
    assert any("config.toml is not valid TOML" in p for p in r.problems)
    records, problems = rundir.read_metrics(r)
    assert [(m.step, m.values) for m in records] == [(1, {"a": 1.0}), (2, {"a": 2.0})]
    assert problems == [
        "metrics.jsonl line 2: not a JSON object",
        "metrics.jsonl line 3: TypeError: step must be an integer and values an object",
    ]
    with pytest.raises(NotFound):
        rundir.open_run(tmp_path, "missing")
    with pytest.raises(InvalidArgument):
        rundir.open_run(tmp_path, "../etc")
    (tmp_path / "not-a-run").mkdir()
    assert rundir.list_run_ids(tmp_path) == ["r1"]


def test_alerts_fire_on_spikes_and_collapse_only() -> None:
    summary = {
        "termination": {"infra_share": {0: 0.1, 1: 0.1, 2: 0.15, 3: 0.6}},
        "behaviour": {"mean_turns": {0: 8.0, 1: 7.0, 2: 5.0, 3: 3.0}},
        "groups": {"zero_variance_share": {0: 0.1, 3: 0.2}},
    }
    metrics = [StepRecord(1, 0, {"agreement/pearson": 0.9999}), StepRecord(2, 0, {"agreement/pearson": 0.9})]
    found = {(a["kind"], a["step"]) for a in panels.alerts(summary, metrics, AlertSettings())}
    assert found == {("infra_spike", 3), ("turn_collapse", 3), ("agreement_drop", 2)}
    assert panels.validation([{"step": 1, "task_id": "a", "pass@1": 1.0}, {"step": 1, "pass@4": 1, "pass@2": 0.5}]) == {
        1: 0.75
    }


def test_settings_refuse_open_non_loopback_binding() -> None:
    with pytest.raises(ConfigError, match="auth_token"):
        validate(Settings, {"host": "0.0.0.0"}, "[dashboard]")
    with pytest.raises(ConfigError, match="at least 8"):
        validate(Settings, {"auth_token": "short"}, "[dashboard]")
    assert validate(Settings, {"host": "::1"}, "[dashboard]").auth_token is None
    assert validate(Settings, {"host": "10.0.0.5", "auth_token": "long-enough"}, "[dashboard]").host == "10.0.0.5"


def test_candidates_are_parsed_defensively() -> None:
    body = '{"candidates": [{"title": "A", "category": "INFRASTRUCTURE", "evidence": [1, {}]}, {"x": 1}]}'
    text = f"Sure!\n```json\n{body}\n```"
    assert parse_candidates(text, 5) == [
        {"title": "A", "explanation": "", "category": "infrastructure", "evidence": ["1"], "checks": []}
    ]
    assert parse_candidates(json.dumps([{"title": "B", "category": "weird"}]), 5)[0]["category"] == "unclear"
    for bad in ["no json here", '{"candidates": "x"}', '{"candidates": [{"title": ""}]}']:
        with pytest.raises(AnalysisError):
            parse_candidates(bad, 5)


def test_rollout_throughput_ends_with_the_last_rollout() -> None:
    metrics = [StepRecord(1, 10.0, {}), StepRecord(2, 20.0, {}), StepRecord(3, 30.0, {})]
    # One step ahead: the rollouts of step 3 finished during step 2; nothing ran after t=18.
    rows = [{"finalized_at": t, "completion_tokens": 100} for t in (5.0, 12.0, 14.0, 18.0)]
    assert panels.rollout_throughput(rows, metrics) == {2: 300 / 8}, "step 3 had no rollouts: not a measured 0"
    rows.append({"finalized_at": 25.0, "completion_tokens": 50})
    assert panels.rollout_throughput(rows, metrics) == {2: 300 / 10, 3: 50 / 5}
    assert panels.rollout_throughput([], metrics) == {}
