"""Logprobs for OpenAI clients that ask (Chat Completions ``logprobs`` /
``top_logprobs``, Responses ``include: ["message.output_text.logprobs"]``).

Every entry is one token the engine sampled in this turn, in order, with the
engine's sampled logprob: exactly the ids and logprobs the capture commits.
As vLLM does, the list covers every sampled token of the turn (reasoning, text,
tool-call markup and the end-of-turn token alike), so it lines up token for token
with the captured segment. ``token`` is the token's own decoded text (OpenAI's
``bytes:\\xNN`` form when it is part of a UTF-8 character) and ``bytes`` its bytes.

``top_logprobs`` lists the alternatives the engine reported (``TopLogprobs`` of
the gateway contract: the local, scripted and vLLM engines give them), most likely
first, without tokens the sampling distribution excluded (-inf). Where an engine
reports none, each position lists just the sampled token; the OpenAI schema
allows fewer entries than asked for."""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from harnessrl.arrays import F32, I32
from harnessrl.v1 import gateway_pb2
from services.proxy.chat.tokenizer import Tokenizer
from services.proxy.errors import BadRequest
from services.proxy.turn import ModelCall

MAX_TOP_LOGPROBS = 20  # OpenAI's bound, for both APIs
INCLUDE_LOGPROBS = "message.output_text.logprobs"
_PIECES: weakref.WeakKeyDictionary[Tokenizer, dict[int, tuple[str, list[int]]]] = weakref.WeakKeyDictionary()


def _top_count(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(
            f"Invalid type for 'top_logprobs': expected an integer, but got {type(value).__name__} instead.",
            "top_logprobs",
            "invalid_type",
        )
    if value < 0:
        raise BadRequest(
            f"Invalid 'top_logprobs': integer below minimum value. Expected a value >= 0, but got {value} instead.",
            "top_logprobs",
            "integer_below_min_value",
        )
    if value > MAX_TOP_LOGPROBS:
        raise BadRequest(
            "Invalid 'top_logprobs': integer above maximum value. "
            f"Expected a value <= {MAX_TOP_LOGPROBS}, but got {value} instead.",
            "top_logprobs",
            "integer_above_max_value",
        )
    return value


def chat_request(logprobs: Any, top_logprobs: Any) -> int | None:
    """How many top logprobs a Chat Completions request asks for; None: no logprobs."""
    if logprobs is not None and not isinstance(logprobs, bool):
        raise BadRequest(
            f"Invalid type for 'logprobs': expected a boolean, but got {type(logprobs).__name__} instead.",
            "logprobs",
            "invalid_type",
        )
    top = _top_count(top_logprobs)
    if top_logprobs is not None and not logprobs:
        raise BadRequest("'top_logprobs' is only allowed when 'logprobs' is true.", "top_logprobs", "invalid_value")
    return top if logprobs else None


def responses_request(include: list[str] | None, top_logprobs: Any) -> int | None:
    """The same for Responses: logprobs are returned when ``include`` names them."""
    top = _top_count(top_logprobs)
    return top if INCLUDE_LOGPROBS in (include or ()) else None


class TokenLogprobs:
    """Turns what a call has received from the engine into OpenAI logprob entries;
    ``take`` returns the entries of the tokens received since its last call."""

    def __init__(self, call: ModelCall, top: int) -> None:
        self._call = call
        self._tok: Tokenizer = call.core.model.tokenizer
        self._pieces = _PIECES.setdefault(self._tok, {})
        self._top = top
        self._chunks = 0  # chunks of the call already turned into entries
        self.entries: list[dict[str, Any]] = []  # every entry so far

    def take(self) -> list[dict[str, Any]]:
        call = self._call
        ids, logprobs, tops = call.received_ids, call.received_logprobs, call.received_top
        new: list[dict[str, Any]] = []
        for i in range(self._chunks, min(len(ids), len(logprobs))):
            token_ids = np.frombuffer(ids[i], I32).tolist()
            values = np.frombuffer(logprobs[i], F32).tolist()
            alternatives = self._alternatives(tops[i] if i < len(tops) else None, len(token_ids))
            for j, (token_id, logprob) in enumerate(zip(token_ids, values, strict=False)):
                new.append(self._entry(token_id, logprob, alternatives[j] if alternatives else None))
            self._chunks = i + 1
        self.entries.extend(new)
        return new

    def _alternatives(self, msg: gateway_pb2.TopLogprobs | None, n: int) -> list[list[tuple[int, float]]] | None:
        """Per position, the engine's (id, logprob) alternatives; None when it sent none."""
        if not self._top or msg is None or not msg.k or len(msg.ids) != n * msg.k * 4:
            return None
        top_ids = np.frombuffer(msg.ids, I32).reshape(n, msg.k)[:, : self._top].tolist()
        top_lps = np.frombuffer(msg.logprobs, F32).reshape(n, msg.k)[:, : self._top].tolist()
        return [
            [(t, lp) for t, lp in zip(row_ids, row_lps, strict=True) if math.isfinite(lp)]
            for row_ids, row_lps in zip(top_ids, top_lps, strict=True)
        ]

    def _piece(self, token_id: int) -> tuple[str, list[int]]:
        """A token's OpenAI ``token`` and ``bytes``, cached per tokenizer (shared lists, never mutated)."""
        piece = self._pieces.get(token_id)
        if piece is None:
            raw = self._tok.token_bytes(token_id)
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            piece = self._pieces[token_id] = (text, list(raw))
        return piece

    def _entry(self, token_id: int, logprob: float, alternatives: list[tuple[int, float]] | None) -> dict[str, Any]:
        text, data = self._piece(token_id)
        if alternatives is None:
            alternatives = [(token_id, logprob)] if self._top else []
        top = []
        for alt_id, alt_lp in alternatives:
            alt_text, alt_data = (text, data) if alt_id == token_id else self._piece(alt_id)
            top.append({"token": alt_text, "logprob": alt_lp, "bytes": alt_data})
        return {"token": text, "logprob": logprob, "bytes": data, "top_logprobs": top}
