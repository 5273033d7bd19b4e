"""Stop strings at the gateway (``SamplingParams.stop``): carried from the proto to
every engine, bounded with a clear error, sent to vLLM on both of its endpoints,
and honoured by the scripted engine as vLLM honours them (the reply ends at the
token completing the string; the ids up to there are returned)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harnessrl import paths
from harnessrl.errors import InvalidArgument
from harnessrl.v1 import gateway_pb2
from services.gateway.engines import vllm_tokens
from services.gateway.engines.base import GenerateInput, Sampling
from services.gateway.engines.scripted import ScriptedEngine, load_script
from services.gateway.engines.vllm_completions import completion_body
from services.gateway.server import sampling_from_proto
from services.gateway.service import MAX_STOP_CHARS, MAX_STOP_STRINGS, validate_sampling

MODEL = paths.default_model_dir()
TEXT = "Let me look at the files in this directory first."


def request(rid: str, trial: str, **sampling: Any) -> GenerateInput:
    return GenerateInput(rid, trial, "main", np.asarray([1, 2], np.int32), Sampling(**sampling), 1000)


async def played(tmp_path: Path, honour: bool, stop: tuple[str, ...]) -> tuple[ScriptedEngine, list[int], str]:
    path = tmp_path / f"script-{honour}.json"
    script = {"threads": {"main": [{"content": TEXT}]}, "chunk_tokens": 4, "honour_stop_strings": honour}
    path.write_text(json.dumps(script))
    engine = ScriptedEngine(load_script(path), MODEL)
    await engine.start()
    chunks = [c async for c in engine.generate(request("r", f"t-{honour}", stop=stop))]
    return engine, np.concatenate([c.ids for c in chunks]).tolist(), chunks[-1].finish_reason


async def test_the_scripted_engine_ends_a_reply_at_the_token_completing_a_stop_string(tmp_path: Path) -> None:
    engine, ids, finish = await played(tmp_path, True, ("files", "look"))
    full = engine.reply_ids("main", 0).tolist()
    assert finish == "stop" and ids == full[: len(ids)]
    text = engine._tokenizer.decode(ids)
    assert text.endswith("Let me look") and "look" not in engine._tokenizer.decode(ids[:-1])
    _, ids, finish = await played(tmp_path, False, ("look",))  # an engine that cannot watch text
    assert ids == full and finish == "stop"


async def test_a_stop_string_never_in_the_reply_changes_nothing(tmp_path: Path) -> None:
    engine, ids, finish = await played(tmp_path, True, ("zebra",))
    assert ids == engine.reply_ids("main", 0).tolist() and finish == "stop"


def test_stop_strings_travel_from_the_proto_to_vllm_on_both_endpoints() -> None:
    msg = gateway_pb2.SamplingParams(max_tokens=5, stop=["look", "<tool_call>"])
    sampling = sampling_from_proto(msg)
    assert sampling.stop == ("look", "<tool_call>")
    req = GenerateInput("r", "t", "main", np.asarray([1], np.int32), sampling, 5)
    assert completion_body("m", req, True)["stop"] == ["look", "<tool_call>"]
    assert vllm_tokens.generate_body("m", req, 16)["sampling_params"]["stop"] == ["look", "<tool_call>"]
    plain = GenerateInput("r", "t", "main", np.asarray([1], np.int32), Sampling(), 5)
    assert "stop" not in completion_body("m", plain, True)


@pytest.mark.parametrize(
    "stop",
    [("",), ("x" * (MAX_STOP_CHARS + 1),), tuple(f"s{i}" for i in range(MAX_STOP_STRINGS + 1))],
    ids=["empty", "too-long", "too-many"],
)
def test_bad_stop_strings_are_refused_naming_the_field(stop: tuple[str, ...]) -> None:
    with pytest.raises(InvalidArgument, match=r"sampling\.stop must hold at most"):
        validate_sampling(Sampling(stop=stop), 1000)
    validate_sampling(Sampling(stop=("ok", "x" * MAX_STOP_CHARS)), 1000)
