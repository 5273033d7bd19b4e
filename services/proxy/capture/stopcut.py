"""Cutting a reply's capture where a stop string begins.

The proxy watches stop strings (a client's ``stop`` / ``stop_sequences``; under
``tool_choice: none`` the tool parser's opening markers, since the engines sample
freely) and gives the harness the text before the first one. The engine may have
sampled past it: the proxy reads whole engine events (vLLM's token endpoint sends
16 tokens an event), an engine that cannot watch text (the local one) samples on
until it is aborted, and vLLM, which is given the strings, still returns the
tokens that spell the string. All of those are **dropped**, not kept with mask 0:
a captured turn is spliced verbatim into every later prompt of its segment
(``render.SampledIds``), so an id kept even as context would sit in the next
prompt though the harness never saw its text and echoes the turn without it
(invariants 1 and 2). What was dropped is counted (``stop_cut_tokens``).

The rule: a token is kept when all of its text lies in what the harness was given:
the text before the stop string less its trailing whitespace, which the proxy never
sends (content and reasoning go out stripped), so the harness echoes the turn
without it (``"Listing now.\\n"`` before ``<tool_call>`` keeps ``Listing now.``). A
token whose text straddles that end (``" look"`` under ``stop=["look"]``) is dropped;
its given part is then almost always whitespace. Known limit: a straddling token
whose given part is not whitespace (``"x<"`` under ``stop=["<a>"]``): the harness was
given that ``x``, the capture does not hold it, so the next prompt lacks it. No
token spells exactly the given part, and none may be made up (invariant 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import numpy as np

from harnessrl.arrays import I32
from services.proxy.capture.state import Sampled
from services.proxy.chat.tokenizer import Tokenizer


def tokens_before(tok: Tokenizer, ids: np.ndarray, chars: int) -> int:
    """How many leading ``ids`` decode to text that ends at or before character
    ``chars`` of the reply's text (decoded as the stream decodes it: special tokens
    give no text, a character split across tokens belongs to the one completing it)."""
    decoder = tok.decoder()
    kept = length = 0
    for i in range(len(ids)):
        length += len(decoder.steps(ids[i : i + 1]))
        if decoder.holding:  # inside a character: decided with the token that completes it
            continue
        if length > chars:
            break
        kept = i + 1
    return kept


def cut(sampled: Sampled, keep: int, stop_ids: Collection[int]) -> Sampled:
    """``sampled`` with only its first ``keep`` tokens (every array cut alike)."""
    n = 4 * keep
    ids = sampled.ids[:n]
    ended = keep > 0 and int(np.frombuffer(ids, I32)[-1]) in stop_ids
    routes = sampled.routes[:keep] if sampled.routes is not None else None
    return dataclasses.replace(
        sampled,
        ids=ids,
        logprobs=sampled.logprobs[:n],
        versions=sampled.versions[:n],
        ended_with_eos=ended,
        routes=routes,
    )
