"""The streaming detokenizer decodes a chunk of ids in one call: whatever the
chunking, the harness reads the text of the ids, multi-byte characters whole."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers.decoders import DecodeStream

from harnessrl.arrays import I32
from services.proxy.chat.tokenizer import Tokenizer

TEXTS = [
    "héllo wörld 日本語のテキスト 🎉🚀 naïve café",
    "def f(x):\n    return x  # ✓ done\n",
    "<|im_start|>assistant\nhi 👋 there<|im_end|>",
]


def _chunked(tok: Tokenizer, ids: list[int], sizes: list[int]) -> list[str]:
    decoder, out, i = tok.decoder(), [], 0
    for n in sizes:
        if i >= len(ids):
            break
        out.append(decoder.steps(np.asarray(ids[i : i + n], dtype=I32)))
        i += n
    if i < len(ids):
        out.append(decoder.steps(np.asarray(ids[i:], dtype=I32)))
    out.append(decoder.flush())
    return out


def _one_by_one(tok: Tokenizer, ids: list[int]) -> str:
    """The Rust library's own streaming, one id per call."""
    stream = DecodeStream(skip_special_tokens=True)
    return "".join([stream.step(tok._tok, i) or "" for i in ids])


@settings(max_examples=150, deadline=None)
@given(text=st.sampled_from(TEXTS), sizes=st.lists(st.integers(1, 12), min_size=1, max_size=40))
def test_any_chunking_streams_the_same_text_as_one_token_at_a_time(tokenizer: Tokenizer, text, sizes) -> None:  # type: ignore[no-untyped-def]
    ids = [*tokenizer.encode(text), tokenizer.eos_id]
    one_by_one = _one_by_one(tokenizer, ids)
    assert one_by_one == tokenizer.decode(ids)  # special tokens (eos, im_start) give no text
    assert "".join(_chunked(tokenizer, ids, sizes)) == one_by_one


def test_a_chunk_ending_inside_a_character_holds_its_bytes_for_the_next(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("go 🎉 now")
    # the byte-level tokens of the emoji: a cut after the first leaves a partial character
    cut = next(k for k in range(1, len(ids)) if "\ufffd" in tokenizer.decode(ids[:k]))
    first, rest, end = _chunked(tokenizer, ids, [cut, len(ids)])
    assert "\ufffd" not in first and "🎉" not in first
    assert first + rest == "go 🎉 now" and "🎉" in rest and end == ""


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 49151), min_size=1, max_size=40), size=st.integers(1, 16))
def test_arbitrary_ids_stream_as_one_token_at_a_time(tokenizer: Tokenizer, ids, size) -> None:  # type: ignore[no-untyped-def]
    # Sampled ids need not form valid UTF-8: a stray byte in the middle reads as
    # U+FFFD, one at the very end is held (no character is complete yet), either way.
    ours = "".join(_chunked(tokenizer, ids, [size] * len(ids)))
    assert ours == "".join(_chunked(tokenizer, ids, [1] * len(ids)))
    rust, full = _one_by_one(tokenizer, ids), tokenizer.decode(ids)
    if not full.endswith("\ufffd"):
        assert ours == rust
    else:
        # An incomplete character at the very end: the Rust stream holds the whole last
        # token (id 44220 is a space and two bytes of a three-byte character: it holds the
        # space too); we give the complete characters before the incomplete bytes.
        assert ours.startswith(rust) and full.startswith(ours), (ours, rust, full)


def test_a_last_token_with_a_complete_space_and_an_incomplete_character_gives_the_space(
    tokenizer: Tokenizer,
) -> None:
    assert tokenizer.decode([44220]) == " \ufffd"  # 'ĠâĶ': a space, two bytes of three
    assert "".join(_chunked(tokenizer, [44220], [1])) == " "


def test_the_end_of_a_reply_gives_the_text_a_held_chunk_had(tokenizer: Tokenizer) -> None:
    stray = next(i for i in range(256) if tokenizer.decode([i]) == "\ufffd")  # a lone UTF-8 byte
    ids = [*tokenizer.encode("ok!"), stray, tokenizer.eos_id]
    assert _chunked(tokenizer, ids, [len(ids)]) == ["", "ok!"]
    assert "".join(_chunked(tokenizer, ids, [1] * len(ids))) == "ok!" == _one_by_one(tokenizer, ids)
