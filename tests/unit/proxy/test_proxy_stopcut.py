"""Cutting the capture at a stop string (``capture/stopcut.py``) with the real
tokenizer: whatever the text and however it streams in, the tokens kept spell
exactly a prefix of what the harness was given (the text before the stop, less
its trailing whitespace), and every token dropped reaches past it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.arrays import I32
from services.proxy.capture import stopcut
from services.proxy.capture.state import Sampled
from services.proxy.chat.stream import StopStrings
from services.proxy.chat.tokenizer import Tokenizer

WORDS = ["Let", " me", " look", " at", " it", ".", "\n", "\n\n", " ", "<tool_call>", "é", "🎉", "日本", "x<", "END"]
STOPS = ["look", "<tool_call>", "\n\n", "END", "🎉"]


def streamed(text: str, cuts: list[int], stops: list[str]) -> tuple[str, StopStrings]:
    s, out, i = StopStrings(stops), "", 0
    for n in [*cuts, len(text)]:
        out += s.feed(text[i : i + n])
        i += n
    return out, s


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.sampled_from(WORDS), max_size=25), stop=st.sampled_from(STOPS), cuts=st.lists(st.integers(1, 6))
)
def test_kept_tokens_spell_what_the_harness_was_given(
    tokenizer: Tokenizer, words: list[str], stop: str, cuts: list[int]
) -> None:
    text = "".join(words)
    ids = np.asarray(tokenizer.encode(text), I32)
    decoded = tokenizer.decode(ids)  # the stream's text of these ids (what the stopper reads)
    out, s = streamed(decoded, cuts, [stop])
    if stop not in decoded:
        assert s.hit is None and s.seen_chars == -1
        return
    given_text = decoded[: decoded.index(stop)].rstrip()
    assert s.hit == stop and out == decoded[: decoded.index(stop)] and s.seen_chars == len(given_text)
    keep = stopcut.tokens_before(tokenizer, ids, s.seen_chars)
    assert given_text.startswith(tokenizer.decode(ids[:keep]))
    assert keep < len(ids) and len(tokenizer.decode(ids[: keep + 1])) > len(given_text)


def test_a_straddling_token_is_dropped_and_trailing_whitespace_with_it(tokenizer: Tokenizer) -> None:
    ids = np.asarray(tokenizer.encode("Let me look at it.\n<tool_call>\n{}"), I32)
    decoded = tokenizer.decode(ids)
    for stop, given_text in (("look", "Let me"), ("<tool_call>", "Let me look at it.")):
        _, s = streamed(decoded, [3], [stop])
        keep = stopcut.tokens_before(tokenizer, ids, s.seen_chars)
        assert tokenizer.decode(ids[:keep]) == given_text


def test_cut_cuts_every_array_alike() -> None:
    n = 6
    ids = np.arange(10, 10 + n, dtype=I32)
    routes = np.arange(n * 2 * 3, dtype=np.uint8).reshape(n, 2, 3)
    sampled = Sampled(
        ids.tobytes(), np.full(n, -0.5, "<f4").tobytes(), np.full(n, 3, I32).tobytes(), "stop", True, routes
    )
    cut = stopcut.cut(sampled, 4, [15])
    assert np.frombuffer(cut.ids, I32).tolist() == [10, 11, 12, 13] and cut.num_tokens == 4
    assert len(cut.logprobs) == len(cut.versions) == 16 and cut.routes is not None and cut.routes.shape == (4, 2, 3)
    assert not cut.ended_with_eos and cut.finish_reason == "stop"
    assert stopcut.cut(sampled, 6, [15]).ended_with_eos
