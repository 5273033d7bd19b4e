"""The engine interface: what every backend behind the gateway implements.

An engine is one replica: a local transformers model, one vLLM server, or the
scripted policy. The gateway validates requests, routes them to a replica and
maps errors; engines only generate. Arrays are numpy so a long reply crosses
into the wire format without a Python object per token.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import numpy.typing as npt

I32 = np.dtype("<i4")
F32 = np.dtype("<f4")


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters, validated by the gateway before an engine sees them.

    ``temperature`` 0 means greedy; ``top_p`` 0 or 1 and ``top_k`` 0 disable
    those filters; ``max_tokens`` 0 means "until the context window is full";
    ``seed`` 0 means unseeded. A stop id is included in the output.
    ``top_logprobs`` asks for that many most likely tokens at each position
    (reported, never used to sample). ``stop``: strings that end generation once
    the reply's text contains one; the ids through the token completing it are
    returned (vLLM's behaviour). Engines that cannot watch text ignore them (the
    local engine: it has no detokenizer); the caller cuts and aborts.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0
    return_routed_experts: bool = False
    top_logprobs: int = 0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerateInput:
    request_id: str
    trial_id: str
    thread: str
    prompt_ids: npt.NDArray[np.int32]
    sampling: Sampling
    # Tokens the engine may add: min(max_tokens, context_window - prompt), set by the gateway.
    budget: int
    # The caller takes the reply only at its end (GenerateRequest.whole_reply): an engine
    # may send fewer, larger chunks (the gateway joins them into one message anyway).
    whole: bool = False
    # The caller watches no text to end the reply on (GenerateRequest.wide_events): an
    # engine may stream it in wider events (the vLLM engine: vllm_stream_interval_wide).
    wide: bool = False


@dataclass
class Chunk:
    """Tokens sampled since the previous chunk. The last chunk of a generation
    has ``finish_reason`` set ("stop", "length" or "abort") and may hold no tokens.

    ``logprobs[i]`` is the engine's logprob of ``ids[i]`` under the distribution
    it sampled from; ``versions[i]`` the policy version of the weights that
    sampled it (a reply that spans a weight update carries both versions).
    """

    ids: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float32]
    versions: npt.NDArray[np.int32]
    # uint8 [n, layers, top_k] when the engine reports MoE routes, else None.
    routed_experts: npt.NDArray[np.uint8] | None = None
    finish_reason: str = ""
    # Prompt tokens served from the engine's prefix cache (final chunk only).
    cached_prompt_tokens: int = 0
    # int32 / float32 [n, k]: the k most likely tokens at each position and their
    # logprobs (same distribution as ``logprobs``), when asked for and the engine has them.
    top_ids: npt.NDArray[np.int32] | None = None
    top_logprobs: npt.NDArray[np.float32] | None = None

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @classmethod
    def empty(cls, finish_reason: str = "", cached_prompt_tokens: int = 0) -> Chunk:
        return cls(np.zeros(0, I32), np.zeros(0, F32), np.zeros(0, I32), None, finish_reason, cached_prompt_tokens)


def join_chunks(chunks: list[Chunk]) -> list[Chunk]:
    """Consecutive chunks of one reply as one (the last one's finish reason and cached
    count): ids, logprobs, versions, routes and top logprobs concatenated in order,
    unchanged. Chunks that carry routes or top logprobs on only some of them stay
    apart, so each row keeps its token."""
    if len(chunks) <= 1:
        return chunks
    routes = [c.routed_experts is not None for c in chunks]
    tops = [c.top_ids is not None and c.top_logprobs is not None for c in chunks]
    if (any(routes) and not all(routes)) or (any(tops) and not all(tops)):
        return chunks
    last = chunks[-1]
    joined = Chunk(
        np.concatenate([c.ids for c in chunks]),
        np.concatenate([c.logprobs for c in chunks]),
        np.concatenate([c.versions for c in chunks]),
        finish_reason=last.finish_reason,
        cached_prompt_tokens=last.cached_prompt_tokens,
    )
    if all(routes):
        joined.routed_experts = np.concatenate([c.routed_experts for c in chunks if c.routed_experts is not None])
    if all(tops):
        joined.top_ids = np.concatenate([c.top_ids for c in chunks if c.top_ids is not None])
        joined.top_logprobs = np.concatenate([c.top_logprobs for c in chunks if c.top_logprobs is not None])
    return [joined]


@dataclass
class EngineInfo:
    """What an engine serves and how busy it is."""

    model: str
    context_window: int
    vocab_size: int
    policy_version: int
    in_flight: int
    # Requests it runs at once before queueing (batch size, server concurrency).
    capacity: int
    eos_token_id: int | None = None
    extra: dict[str, str] = field(default_factory=dict)


class Engine(abc.ABC):
    """One replica. Implementations are asyncio-friendly: nothing blocks the loop.

    Life cycle: ``await start()`` (load the model, connect), then any number of
    concurrent ``generate`` calls, then ``await close()``.
    """

    kind: ClassVar[str] = "engine"

    def __init__(self, name: str) -> None:
        self.name = name

    async def start(self) -> None:
        """Loads what the engine needs; the gateway serves only after it returns."""
        return None

    async def close(self) -> None:
        """Stops generation and frees resources; in-flight generations end with "abort"."""
        return None

    @abc.abstractmethod
    def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        """Streams the reply. Raises ``EngineUnavailable`` before the first
        chunk if this replica cannot serve (the gateway then retries elsewhere)."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> bool:
        """Ends a running generation with finish reason "abort"; False if unknown."""

    async def forget_trial(self, trial_id: str) -> int:
        """Drops what the engine keeps for ``trial_id`` between its calls (the local
        engine's per-thread KV caches): the trial ended. Returns how many entries went."""
        return 0

    @abc.abstractmethod
    async def pause(self, timeout_s: float) -> int:
        """Holds every in-flight generation at its next token boundary (waiting at
        most ``timeout_s`` for the current step) and returns how many are held."""

    @abc.abstractmethod
    async def resume(self) -> int:
        """Lets held generations continue; returns how many there were."""

    @abc.abstractmethod
    async def load_weights(self, version: int, checkpoint_path: str, options: Mapping[str, str]) -> None:
        """Loads a checkpoint in place; tokens sampled afterwards carry ``version``.
        Must leave the old weights untouched if the checkpoint is invalid."""

    @abc.abstractmethod
    def info(self) -> EngineInfo: ...

    async def check_health(self) -> None:
        """Raises ``EngineUnavailable`` if the replica cannot serve now."""
        return None
