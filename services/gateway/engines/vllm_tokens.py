"""vLLM's token-in/token-out endpoint, ``POST /inference/v1/generate`` (servers started
with ``--enable-scale-out``): what the vLLM engine streams from when
``vllm_stream_interval`` > 1.

Why another endpoint: with a stream interval vLLM sends a reply's first token at once
and then one event per N tokens, so the gateway and the proxy wake once per N tokens
instead of once per token (each wake is most of the hot path's CPU per token). But
vLLM does not flush those N tokens at a keep-mode pause, so an event can hold tokens
sampled before the pause and after the resume: a version stamped when a token arrives
would be wrong for some of them. This endpoint's last event of a reply says which
weights sampled each output token (``weight_versions``: spans over the output, labelled
with what ``/update_weight_version`` set; ``default`` before any), so versions stay
exact (invariant 1): ``Holdback`` passes a reply's tokens on as they come until the
policy version changes under it, then holds the rest until those spans stamp them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from services.gateway.engines.base import F32, I32, Chunk, GenerateInput
from services.gateway.engines.vllm_completions import FINISH, VLLM_NEG_INF, sampling_fields
from services.gateway.errors import EngineFailed

PATH = "/inference/v1/generate"


def generate_body(model: str, request: GenerateInput, stream_interval: int) -> dict[str, Any]:
    return {
        "model": model,
        "token_ids": request.prompt_ids.tolist(),
        "sampling_params": sampling_fields(request) | {"stream_interval": stream_interval},
        "stream": True,
        "stream_options": {"include_usage": True},
        "request_id": request.request_id,
    }


def parse_event(event: dict[str, Any], version: int, top: int) -> tuple[Chunk | None, str, int, list[Any] | None]:
    """One event -> (its tokens stamped ``version``, finish reason, cached prompt tokens,
    the reply's weight-version spans: only on its last event)."""
    usage = event.get("usage")
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) if usage else 0
    choices = event.get("choices")
    if not choices:
        return None, "", cached, None
    choice = choices[0]
    token_ids = choice.get("token_ids") or []
    content = (choice.get("logprobs") or {}).get("content") or []
    n = len(token_ids)
    if len(content) != n or any(c.get("token_id") != t for c, t in zip(content, token_ids, strict=False)):
        raise EngineFailed(f"vLLM sent {n} token ids but logprobs for {[c.get('token_id') for c in content]}")
    chunk = Chunk(np.array(token_ids, I32), np.array([c["logprob"] for c in content], F32), np.full(n, version, I32))
    if top:
        chunk.top_ids, chunk.top_logprobs = _top(content, top)
    reason = choice.get("finish_reason")
    return chunk, FINISH.get(reason, "stop") if reason else "", cached, choice.get("weight_versions")


def _top(content: list[dict[str, Any]], k: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """The k most likely tokens per position (the sampled one is listed first even when
    it is not among them), -inf for excluded and padding."""
    ids, values = np.zeros((len(content), k), I32), np.full((len(content), k), -np.inf, F32)
    for i, position in enumerate(content):
        seen = {int(c["token_id"]): float(c["logprob"]) for c in position.get("top_logprobs") or []}
        ranked = sorted(seen.items(), key=lambda kv: -kv[1])[:k]
        for j, (token, value) in enumerate(ranked):
            ids[i, j], values[i, j] = token, value if value > VLLM_NEG_INF else -np.inf
    return ids, values


def span_versions(spans: list[Any] | None, n: int, initial: int) -> npt.NDArray[np.int32]:
    """vLLM's weight-version spans of a reply of ``n`` tokens -> one version per token
    (label ``default``: the weights the server started with, ``initial``)."""
    if n and not spans:
        raise EngineFailed("vLLM's last event has no weight_versions for the reply's tokens")
    versions = np.full(n, -1, I32)
    for span in spans or []:
        label, start, end = str(span["version"]), int(span["start"]), int(span["end"])
        if label != "default" and not label.isdigit():
            raise EngineFailed(f"vLLM labels weights {label!r}; the gateway sets integer policy versions")
        versions[start:end] = initial if label == "default" else int(label)
    if n and (versions < 0).any():
        raise EngineFailed(f"vLLM's weight_versions {spans} do not cover the reply's {n} tokens")
    return versions


class Holdback:
    """One reply's tokens on their way out: passed on as they come while the policy
    version is the one the reply started under (so every token sent carries that one
    version); once it changes (a resume, an update without a pause), held until the
    last event's spans stamp them. The tokens already sent must agree with the spans,
    or the reply fails (they cannot be taken back)."""

    def __init__(self, epoch: int, version: int) -> None:
        self.epoch, self.version = epoch, version
        self.sent = 0
        self.held: list[Chunk] = []

    def take(self, chunks: list[Chunk], epoch: int) -> list[Chunk]:
        """What of ``chunks`` goes out now (``epoch``: the engine's version epoch)."""
        if epoch != self.epoch or self.held:
            self.held += chunks
            return []
        self.sent += sum(len(c) for c in chunks)
        return chunks

    def finish(self, spans: list[Any] | None, initial: int) -> list[Chunk]:
        """The held chunks, stamped from the spans."""
        versions = span_versions(spans, self.sent + sum(len(c) for c in self.held), initial)
        if (versions[: self.sent] != self.version).any():
            raise EngineFailed(
                f"tokens were sent stamped {self.version}, vLLM says {spans} (weights updated behind the gateway, "
                "or an initial_version other than the server's weights?)"
            )
        at = self.sent
        for chunk in self.held:
            chunk.versions = versions[at : at + len(chunk)]
            at += len(chunk)
        held, self.held = self.held, []
        return held
