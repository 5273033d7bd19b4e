"""The scripted engine: a deterministic policy for tests, behind the same
interface as the real engines.

It plays a JSON script of assistant outputs (text, reasoning, tool calls) as
real token ids of the model's real tokenizer, with the eos id appended, and
deterministic logprobs. A cursor per (trial, thread) advances one entry per
Generate call. Every generation is logged (in memory, and as JSONL when a log
path is set) so a test in another process can check captured tokens against
what the engine really sampled. It is a test fixture, never the default.

Script format::

    {"context_window": 32768, "tool_call_format": "hermes",
     "threads": {"main": [{"content": "...", "tool_calls": [{"name": "bash", "arguments": {...}}]}],
                 "*": [{"content": "A short title"}]},
     "on_exhausted": "repeat_last"}

Optional keys: ``chunk_tokens`` (stream the reply in chunks of that many
tokens; 0 = one chunk), ``chunk_delay_s`` (sleep between chunks, to test
streaming, pause and abort), ``first_delay_s`` (sleep before the first chunk: a
long prefill, to test what a client sees meanwhile), ``log_path`` (JSONL generation log; relative to
the script's folder), ``model`` (served model name), ``honour_stop_strings``
(default true: a reply ends at the token completing a ``sampling.stop`` string,
as vLLM ends it; false plays an engine that cannot watch text, the local one,
whose reply runs on past the string until the caller aborts). Entry keys: ``content``,
``reasoning`` (rendered ``<think>...</think>`` first), ``tool_calls``, or ``raw``
(exact text, nothing added but the eos; for malformed-output tests).
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tokenizers.decoders import DecodeStream

from harnessrl.config import format_validation_error
from harnessrl.errors import ConfigError
from services.gateway import modelfiles
from services.gateway.engines.base import F32, I32, Chunk, Engine, EngineInfo, GenerateInput
from services.gateway.errors import ScriptExhausted


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    # Accepted for readability of scripts; the model's text carries no id.
    id: str | None = None


class ScriptEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    raw: str | None = Field(None, description="Exact text of the reply (before the eos); overrides the rest.")


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")
    context_window: int = Field(32768, ge=2, le=100_000_000)
    tool_call_format: Literal["hermes", "qwen3_coder", "json"] = "hermes"
    threads: dict[str, list[ScriptEntry]]
    on_exhausted: Literal["repeat_last", "cycle", "error"] = "repeat_last"
    chunk_tokens: int = Field(0, ge=0)
    chunk_delay_s: float = Field(0.0, ge=0, le=60)
    first_delay_s: float = Field(0.0, ge=0, le=600)
    log_path: str | None = None
    model: str | None = None
    honour_stop_strings: bool = True

    @field_validator("threads")
    @classmethod
    def _non_empty(cls, threads: dict[str, list[ScriptEntry]]) -> dict[str, list[ScriptEntry]]:
        if not threads:
            raise ValueError("at least one thread is required")
        empty = [name for name, entries in threads.items() if not entries]
        if empty:
            raise ValueError(f"thread(s) {empty} have no entries")
        return threads


def load_script(path: Path) -> Script:
    """Parses a script file; errors name the file and the field."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: script file not found") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from e
    try:
        return Script.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {format_validation_error(e)}") from e


# --- rendering: text exactly as each tool-call format expects ----------------


def _hermes_call(call: ToolCall) -> str:
    return (
        f"<tool_call>\n{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}\n</tool_call>"
    )


def _param_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _qwen3_coder_call(call: ToolCall) -> str:
    params = "".join(
        f"<parameter={key}>\n{_param_text(value)}\n</parameter>\n" for key, value in call.arguments.items()
    )
    return f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>"


def _json_call(call: ToolCall) -> str:
    return json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)


TOOL_CALL_RENDERERS: dict[str, Callable[[ToolCall], str]] = {
    "hermes": _hermes_call,
    "qwen3_coder": _qwen3_coder_call,
    "json": _json_call,
}


def render_entry(entry: ScriptEntry, tool_call_format: str) -> str:
    """The reply text: reasoning, content, then one block per tool call, each on its own line."""
    if entry.raw is not None:
        return entry.raw
    render = TOOL_CALL_RENDERERS[tool_call_format]
    parts = [entry.content] if entry.content else []
    parts += [render(call) for call in entry.tool_calls]
    text = "\n".join(parts)
    if entry.reasoning:
        text = f"<think>\n{entry.reasoning}\n</think>\n\n{text}"
    return text


def scripted_logprobs(ids: npt.NDArray[np.int32], start: int) -> npt.NDArray[np.float32]:
    """Deterministic logprobs in (token id, absolute position), in [-4.01, -0.01]:
    strictly negative and finite, so they look like a real engine's."""
    positions = np.arange(start, start + ids.shape[0], dtype=np.uint64)
    mixed = (ids.astype(np.uint64) * np.uint64(2654435761) + positions * np.uint64(40503)) % np.uint64(1 << 32)
    return (-(0.01 + 4.0 * (mixed.astype(np.float64) / float(1 << 32)))).astype(F32)


def scripted_top(
    ids: npt.NDArray[np.int32], logprobs: npt.NDArray[np.float32], k: int, vocab: int
) -> tuple[npt.NDArray[np.int32] | None, npt.NDArray[np.float32] | None]:
    """Deterministic top-``k`` alternatives [N, k] when asked for: the sampled token
    first with its logprob, then the ids after it, each 0.5 nats less likely."""
    if k <= 0:
        return None, None
    steps = np.arange(k, dtype=np.int64)
    top_ids = ((ids.astype(np.int64)[:, None] + steps) % max(vocab, k)).astype(I32)
    return top_ids, (logprobs[:, None] - 0.5 * steps).astype(F32)


def _rows(
    top_ids: npt.NDArray[np.int32] | None, top_lps: npt.NDArray[np.float32] | None, start: int, end: int
) -> tuple[npt.NDArray[np.int32] | None, npt.NDArray[np.float32] | None]:
    if top_ids is None or top_lps is None:
        return None, None
    return top_ids[start:end], top_lps[start:end]


def stop_string_end(tokenizer: Any, ids: npt.NDArray[np.int32], stops: tuple[str, ...]) -> int:
    """How many of ``ids`` a reply keeps under stop strings, as vLLM cuts it: through
    the token whose text completes the first string found (its text is decoded as
    the proxy decodes it, special tokens skipped); all of them when none occurs."""
    stream = DecodeStream(skip_special_tokens=True)
    longest = max(len(s) for s in stops)
    text = ""
    for i, token in enumerate(ids.tolist()):
        piece = stream.step(tokenizer, token)
        if piece:
            start = max(0, len(text) - longest + 1)  # a string completed now ends in the new piece
            text += piece
            if any(s in text[start:] for s in stops):
                return i + 1
    return int(ids.shape[0])


class GenerationLog:
    """Every generation the engine made: the last ``keep`` in memory (numpy arrays,
    cheap to hold) and, with a path, all of them as JSONL (lists, for other processes)."""

    def __init__(self, path: Path | None, keep: int = 1000) -> None:
        self.path = path
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        # Prompts can be 200k tokens: memory keeps their length, the JSONL the ids.
        self.records.append(
            {k: v for k, v in record.items() if k != "prompt_ids"} | {"prompt_len": int(record["prompt_ids"].shape[0])}
        )
        if self._file is not None:
            plain = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in record.items()}
            line = json.dumps(plain, separators=(",", ":")) + "\n"
            with self._lock:
                self._file.write(line)
                self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_generation_log(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL generation log (for tests in another process)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class _Running:
    __slots__ = ("aborted", "request")

    def __init__(self, request: GenerateInput) -> None:
        self.request = request
        self.aborted = False


class ScriptedEngine(Engine):
    """Plays a :class:`Script`; see the module docstring."""

    kind = "scripted"

    def __init__(
        self,
        script: Script,
        model_dir: Path,
        *,
        name: str = "scripted-0",
        log_path: Path | None = None,
        model_name: str | None = None,
        initial_version: int = 0,
    ) -> None:
        super().__init__(name)
        self.script = script
        self.model_dir = model_dir
        self.model_name = model_name or script.model or model_dir.name
        self.version = initial_version
        self.log = GenerationLog(log_path)
        self._tokenizer: Any = None
        self._eos = 0
        self._vocab = 0
        self._rendered: dict[tuple[str, int], npt.NDArray[np.int32]] = {}
        self._cursors: dict[tuple[str, str], int] = {}
        self._running: dict[str, _Running] = {}
        self._unpaused = asyncio.Event()
        self._unpaused.set()

    @classmethod
    def from_file(cls, path: Path, model_dir: Path, log_path: Path | None = None, **kwargs: Any) -> ScriptedEngine:
        script = load_script(path)
        if log_path is None and script.log_path:
            log_path = (path.parent / script.log_path).resolve()
        return cls(script, model_dir, log_path=log_path, **kwargs)

    async def start(self) -> None:
        self._tokenizer = await asyncio.to_thread(modelfiles.load_tokenizer, self.model_dir)
        self._eos = modelfiles.eos_token_id(self.model_dir, self._tokenizer)
        self._vocab = max(self._tokenizer.get_vocab_size(with_added_tokens=True), modelfiles.vocab_size(self.model_dir))

    async def close(self) -> None:
        for running in self._running.values():
            running.aborted = True
        self._unpaused.set()
        self.log.close()

    def info(self) -> EngineInfo:
        return EngineInfo(
            model=self.model_name,
            context_window=self.script.context_window,
            vocab_size=self._vocab,
            policy_version=self.version,
            in_flight=len(self._running),
            capacity=1_000_000,
            eos_token_id=self._eos,
        )

    def reply_ids(self, thread_key: str, index: int) -> npt.NDArray[np.int32]:
        """Tokens of one script entry (rendered and tokenized once, then cached)."""
        key = (thread_key, index)
        ids = self._rendered.get(key)
        if ids is None:
            if self._tokenizer is None:
                raise RuntimeError("ScriptedEngine.start() was not awaited")
            text = render_entry(self.script.threads[thread_key][index], self.script.tool_call_format)
            encoded = self._tokenizer.encode(text, add_special_tokens=False).ids
            ids = np.asarray([*encoded, self._eos], dtype=I32)
            self._rendered[key] = ids
        return ids

    def _next_entry(self, trial_id: str, thread: str) -> tuple[str, int]:
        thread_key = thread if thread in self.script.threads else "*"
        if thread_key not in self.script.threads:
            raise ScriptExhausted(f"the script has no thread {thread!r} and no '*' thread")
        entries = self.script.threads[thread_key]
        cursor = self._cursors.get((trial_id, thread), 0)
        self._cursors[(trial_id, thread)] = cursor + 1
        if cursor < len(entries):
            return thread_key, cursor
        if self.script.on_exhausted == "repeat_last":
            return thread_key, len(entries) - 1
        if self.script.on_exhausted == "cycle":
            return thread_key, cursor % len(entries)
        raise ScriptExhausted(
            f"scripted thread {thread!r} of trial {trial_id!r} has no entry {cursor} (it has {len(entries)})"
        )

    def _plan(self, request: GenerateInput) -> tuple[npt.NDArray[np.int32], str, int]:
        """The ids this request will produce and its finish reason, as a real engine would cut them."""
        thread_key, index = self._next_entry(request.trial_id, request.thread)
        ids = self.reply_ids(thread_key, index)
        stops = {self._eos, *request.sampling.stop_token_ids}
        hits = np.flatnonzero(np.isin(ids, list(stops)))
        if hits.size:
            ids = ids[: hits[0] + 1]
        if request.sampling.stop and self.script.honour_stop_strings:
            ids = ids[: stop_string_end(self._tokenizer, ids, request.sampling.stop)]
        if ids.shape[0] > request.budget:
            return ids[: request.budget], "length", index
        return ids, "stop", index

    async def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        if self.script.first_delay_s:  # a long prefill: before anything, an exhausted script's error too
            await asyncio.sleep(self.script.first_delay_s)
        ids, finish, index = self._plan(request)
        running = _Running(request)
        self._running[request.request_id] = running
        logprobs = scripted_logprobs(ids, int(request.prompt_ids.shape[0]))
        top_ids, top_lps = scripted_top(ids, logprobs, request.sampling.top_logprobs, self._vocab)
        versions = np.empty(ids.shape[0], I32)
        step = self.script.chunk_tokens or max(1, ids.shape[0])
        sent = 0
        logged = False
        try:
            while sent < ids.shape[0]:
                if not self._unpaused.is_set():
                    await self._unpaused.wait()
                if running.aborted:
                    break
                end = min(sent + step, ids.shape[0])
                versions[sent:end] = self.version
                if end == ids.shape[0]:
                    # Logged before the last chunk leaves, so a caller that saw it finds the record.
                    self._log(request, index, ids[:end], logprobs[:end], versions[:end], finish)
                    logged = True
                    yield Chunk(
                        ids[sent:end],
                        logprobs[sent:end],
                        versions[sent:end],
                        None,
                        finish,
                        0,
                        *_rows(top_ids, top_lps, sent, end),
                    )
                    return
                chunk = Chunk(
                    ids[sent:end],
                    logprobs[sent:end],
                    versions[sent:end],
                    None,
                    "",
                    0,
                    *_rows(top_ids, top_lps, sent, end),
                )
                # Counted as sent before it leaves: a consumer that stops after receiving it
                # (a stop string, an abort) ends this generator at the yield, and the abort
                # record must hold every id it received.
                sent = end
                yield chunk
                if self.script.chunk_delay_s:
                    await asyncio.sleep(self.script.chunk_delay_s)
            self._log(request, index, ids[:sent], logprobs[:sent], versions[:sent], "abort")
            logged = True
            yield Chunk.empty("abort")
        finally:
            del self._running[request.request_id]
            if not logged:  # the consumer went away mid-reply
                self._log(request, index, ids[:sent], logprobs[:sent], versions[:sent], "abort")

    def _log(
        self,
        request: GenerateInput,
        index: int,
        ids: npt.NDArray[np.int32],
        logprobs: npt.NDArray[np.float32],
        versions: npt.NDArray[np.int32],
        finish: str,
    ) -> None:
        self.log.append(
            {
                "trial_id": request.trial_id,
                "thread": request.thread,
                "request_id": request.request_id,
                "entry_index": index,
                "prompt_ids": request.prompt_ids,
                "sampled_ids": ids.copy(),
                "logprobs": logprobs.copy(),
                "policy_versions": versions.copy(),
                "finish_reason": finish,
                # What the caller asked the engine to sample with (a scripted reply ignores it).
                "sampling": {
                    "temperature": round(request.sampling.temperature, 6),
                    "top_p": round(request.sampling.top_p, 6),
                    "top_k": request.sampling.top_k,
                    "max_tokens": request.sampling.max_tokens,
                },
                "time": time.time(),
            }
        )

    async def abort(self, request_id: str) -> bool:
        running = self._running.get(request_id)
        if running is None:
            return False
        running.aborted = True
        return True

    async def pause(self, timeout_s: float) -> int:
        self._unpaused.clear()
        return len(self._running)

    async def resume(self) -> int:
        held = len(self._running) if not self._unpaused.is_set() else 0
        self._unpaused.set()
        return held

    async def load_weights(self, version: int, checkpoint_path: str, options: Mapping[str, str]) -> None:
        """A scripted policy has no weights: only the version changes (so tests of
        partial rollout see mixed versions)."""
        self.version = version
