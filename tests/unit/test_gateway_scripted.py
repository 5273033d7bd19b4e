"""The scripted engine: real tokenizer, rendering per tool-call format,
deterministic logprobs, cursors, context window, log, pause and abort."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harnessrl import paths
from harnessrl.errors import ConfigError
from services.gateway.engines.base import Chunk, GenerateInput, Sampling
from services.gateway.engines.scripted import (
    ScriptedEngine,
    ScriptEntry,
    ToolCall,
    load_script,
    read_generation_log,
    render_entry,
    scripted_logprobs,
)
from services.gateway.errors import ScriptExhausted

MODEL = paths.default_model_dir()

SCRIPT: dict[str, Any] = {
    "context_window": 64,
    "tool_call_format": "hermes",
    "threads": {
        "main": [
            {"content": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
            {"content": "Done."},
        ],
        "*": [{"content": "A short title"}],
    },
    "on_exhausted": "repeat_last",
}


def write(tmp_path: Path, script: dict[str, Any], name: str = "script.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(script))
    return path


def request(
    prompt: list[int], trial: str = "t1", thread: str = "main", rid: str = "r", budget: int = 1000, **sampling: Any
) -> GenerateInput:
    return GenerateInput(rid, trial, thread, np.asarray(prompt, np.int32), Sampling(**sampling), budget)


async def collect(engine: ScriptedEngine, req: GenerateInput) -> list[Chunk]:
    return [c async for c in engine.generate(req)]


def cat(chunks: list[Chunk]) -> tuple[list[int], list[float], list[int]]:
    return (
        np.concatenate([c.ids for c in chunks]).tolist(),
        np.concatenate([c.logprobs for c in chunks]).tolist(),
        np.concatenate([c.versions for c in chunks]).tolist(),
    )


@pytest.fixture
async def engine(tmp_path: Path) -> ScriptedEngine:
    eng = ScriptedEngine.from_file(write(tmp_path, SCRIPT), MODEL, log_path=tmp_path / "log.jsonl")
    await eng.start()
    return eng


def test_hermes_rendering_matches_the_interface() -> None:
    entry = ScriptEntry(content="Let me look.", tool_calls=[ToolCall(name="bash", arguments={"command": "ls"})])
    assert render_entry(entry, "hermes") == (
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    )


def test_qwen3_coder_and_json_rendering() -> None:
    entry = ScriptEntry(tool_calls=[ToolCall(name="edit", arguments={"path": "a.py", "line": 3})])
    assert render_entry(entry, "qwen3_coder") == (
        "<tool_call>\n<function=edit>\n<parameter=path>\na.py\n</parameter>\n"
        "<parameter=line>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    assert render_entry(entry, "json") == '{"name": "edit", "arguments": {"path": "a.py", "line": 3}}'
    assert render_entry(ScriptEntry(content="x", reasoning="hmm"), "hermes") == "<think>\nhmm\n</think>\n\nx"
    assert render_entry(ScriptEntry(raw="<tool_call>{broken", content="ignored"), "hermes") == "<tool_call>{broken"


async def test_reply_is_real_tokenizer_ids_plus_eos(engine: ScriptedEngine) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    chunks = await collect(engine, request([1, 2, 3]))
    ids, logprobs, versions = cat(chunks)
    text = render_entry(engine.script.threads["main"][0], "hermes")
    assert ids == [*tok.encode(text, add_special_tokens=False), 2]
    assert tok.decode(ids[:-1]) == text
    assert chunks[-1].finish_reason == "stop"
    assert all(-5 < lp < 0 for lp in logprobs)
    assert logprobs == scripted_logprobs(np.asarray(ids, np.int32), 3).tolist()
    assert versions == [0] * len(ids)


def test_logprobs_are_deterministic_in_id_and_position() -> None:
    ids = np.asarray([5, 5, 9], np.int32)
    a, b = scripted_logprobs(ids, 10), scripted_logprobs(ids, 10)
    assert a.tolist() == b.tolist()
    assert a[0] != a[1]  # same id, other position
    assert scripted_logprobs(ids, 11)[0] == a[1]
    assert np.all(np.isfinite(a)) and np.all(a < 0)


async def test_cursor_per_trial_and_thread_and_star_thread(engine: ScriptedEngine) -> None:
    first = cat(await collect(engine, request([1], trial="a")))[0]
    second = cat(await collect(engine, request([1], trial="a")))[0]
    other_trial = cat(await collect(engine, request([1], trial="b")))[0]
    title = cat(await collect(engine, request([1], trial="a", thread="title-gen")))[0]
    again = cat(await collect(engine, request([1], trial="a")))[0]
    assert first == other_trial != second
    assert again == second  # repeat_last
    assert title == [*engine.reply_ids("*", 0).tolist()]


async def test_on_exhausted_error_and_cycle(tmp_path: Path) -> None:
    for mode in ("error", "cycle"):
        eng = ScriptedEngine.from_file(write(tmp_path, {**SCRIPT, "on_exhausted": mode}), MODEL)
        await eng.start()
        outs = [cat(await collect(eng, request([1])))[0] for _ in range(2)]
        if mode == "error":
            with pytest.raises(ScriptExhausted, match="has no entry 2"):
                await collect(eng, request([1]))
        else:
            assert cat(await collect(eng, request([1])))[0] == outs[0]


async def test_unknown_thread_without_star(tmp_path: Path) -> None:
    eng = ScriptedEngine.from_file(write(tmp_path, {"threads": {"main": [{"content": "x"}]}}), MODEL)
    await eng.start()
    with pytest.raises(ScriptExhausted, match="no thread 'sub'"):
        await collect(eng, request([1], thread="sub"))


async def test_budget_and_stop_ids_cut_like_a_real_engine(engine: ScriptedEngine) -> None:
    full = engine.reply_ids("main", 0)
    chunks = await collect(engine, request([1], trial="x", budget=5))
    assert cat(chunks)[0] == full[:5].tolist() and chunks[-1].finish_reason == "length"
    stop_at = int(full[3])
    chunks = await collect(engine, request([1], trial="y", stop_token_ids=(stop_at,)))
    assert cat(chunks)[0] == full[: list(full).index(stop_at) + 1].tolist()
    assert chunks[-1].finish_reason == "stop"


async def test_chunking_log_and_versions(tmp_path: Path) -> None:
    eng = ScriptedEngine.from_file(write(tmp_path, {**SCRIPT, "chunk_tokens": 4, "log_path": "gen.jsonl"}), MODEL)
    await eng.start()
    chunks = await collect(eng, request([7, 8], rid="req-1"))
    assert all(len(c) == 4 for c in chunks[:-1]) and len(chunks) > 2
    await eng.load_weights(3, "", {})
    chunks2 = await collect(eng, request([7, 8], rid="req-2"))
    eng.log.close()
    records = read_generation_log(tmp_path / "gen.jsonl")
    assert [r["request_id"] for r in records] == ["req-1", "req-2"]
    ids, logprobs, versions = cat(chunks)
    assert records[0]["sampled_ids"] == ids and records[0]["logprobs"] == logprobs
    assert records[0]["prompt_ids"] == [7, 8] and records[0]["policy_versions"] == versions == [0] * len(ids)
    assert records[1]["policy_versions"] == cat(chunks2)[2] == [3] * len(cat(chunks2)[0])


async def test_pause_holds_between_chunks_and_versions_change(tmp_path: Path) -> None:
    eng = ScriptedEngine.from_file(write(tmp_path, {**SCRIPT, "chunk_tokens": 4, "chunk_delay_s": 0.05}), MODEL)
    await eng.start()
    received: list[Chunk] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for chunk in eng.generate(request([1])):
            received.append(chunk)
            first.set()

    task = asyncio.create_task(consume())
    await first.wait()
    assert await eng.pause(1.0) == 1
    await asyncio.sleep(0.2)
    held_at = len(received)
    await asyncio.sleep(0.2)
    assert len(received) == held_at and not task.done()  # held, not lost
    await eng.load_weights(1, "", {})
    assert await eng.resume() == 1
    await task
    versions = cat(received)[2]
    assert versions[0] == 0 and versions[-1] == 1 and sorted(versions) == versions


async def test_abort_ends_with_abort_and_logs_partial(tmp_path: Path) -> None:
    eng = ScriptedEngine.from_file(write(tmp_path, {**SCRIPT, "chunk_tokens": 2, "chunk_delay_s": 0.05}), MODEL)
    await eng.start()
    received: list[Chunk] = []
    async for chunk in eng.generate(request([1], rid="ab")):
        received.append(chunk)
        if len(received) == 2:
            assert await eng.abort("ab")
    assert received[-1].finish_reason == "abort"
    assert not await eng.abort("ab")
    assert eng.log.records[-1]["finish_reason"] == "abort"
    assert eng.log.records[-1]["sampled_ids"].tolist() == cat(received)[0]


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("{", "not valid JSON"),
        ('{"threads": {}}', "at least one thread"),
        ('{"threads": {"main": []}}', "no entries"),
        ('{"threads": {"main": [{"content": 3}]}}', "threads.main.0.content"),
        ('{"threads": {"main": [{"text": "x"}]}}', "unknown setting 'threads.main.0.text'"),
        ('{"threads": {"main": [{}]}, "tool_call_format": "xml"}', "tool_call_format"),
        ('{"threads": {"main": [{}]}, "context_window": -1}', "context_window"),
    ],
)
def test_malformed_scripts_name_file_and_field(tmp_path: Path, content: str, error: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=error) as info:
        load_script(path)
    assert str(path) in str(info.value)


def test_missing_script_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_script(tmp_path / "nope.json")


async def test_scripted_engine_takes_no_in_process_weights(engine: ScriptedEngine) -> None:
    from harnessrl.errors import InvalidArgument
    from services.gateway.service import GatewayService
    from services.gateway.settings import Settings

    service = GatewayService([engine], Settings(engine="local", health_interval_s=3600))
    await service.start()
    try:
        with pytest.raises(InvalidArgument, match="checkpoint_path only"):
            await service.load_state_dict(1, {})
        assert service.version == 0
    finally:
        await service.close()
