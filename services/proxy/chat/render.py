"""Token-faithful rendering.

Two ways to turn a conversation into the token ids the engine sees, which must
agree token for token (invariant 2; tests and ``render_check`` compare them):

- ``full``: the whole conversation through the chat template. Assistant turns
  the proxy itself produced are rendered as a placeholder, and the placeholder
  is replaced by the ids the engine sampled, verbatim; the template's text
  after the turn (its end-of-turn tail, e.g. ``\\n`` after ``<|im_end|>``) is
  tokenized as context. Used when a segment opens.
- ``extension``: only the messages after the last sampled turn, rendered in a
  small window behind a placeholder turn. Its cost depends on the new messages
  only, not on the length of the context.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harnessrl.arrays import I32
from harnessrl.errors import InvalidArgument
from services.proxy.chat.conversation import Conversation, Message, message_for_template, tool_for_template
from services.proxy.chat.template import ChatTemplate
from services.proxy.chat.tokenizer import Tokenizer

# A placeholder no harness can forge: text that happens to contain it must not
# move where sampled ids are spliced in.
_PH = "\x00hrl-" + secrets.token_hex(8) + "-{}\x00"
_ANCHOR = {"role": "user", "content": "."}


class RenderError(InvalidArgument):
    """The chat template could not render this conversation."""


@dataclass(frozen=True)
class SampledIds:
    """An earlier assistant turn as the engine sampled it, for reuse verbatim."""

    ids: bytes  # int32 LE
    ended_with_eos: bool


class Renderer:
    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer) -> None:
        self.template = template
        self.tokenizer = tokenizer
        # The template text that follows an assistant turn's content in a window
        # [anchor, turn]: the tail the engine did not sample.
        window = self._render([_ANCHOR, _placeholder(0)], None, add_generation_prompt=False)
        self._window_prefix = window
        self._tail = window[window.index(_PH.format(0)) + len(_PH.format(0)) :]

    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        try:
            return self.template.render(messages, tools, add_generation_prompt)
        except Exception as e:
            raise RenderError(f"chat template {self.template.name!r} cannot render this conversation: {e}") from e

    def tail(self, ended_with_eos: bool) -> str:
        """Context text after a sampled turn: the template's tail, minus the eos the engine sampled."""
        eos = self.tokenizer.eos_text
        if ended_with_eos and self._tail.startswith(eos):
            return self._tail[len(eos) :]
        return self._tail

    def full(self, conv: Conversation, sampled: Sequence[SampledIds | None]) -> bytes:
        """Prompt ids (int32 LE) of ``conv`` plus a generation prompt; ``sampled[i]`` is
        set where ``conv.messages[i]`` is one of the proxy's own turns."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": conv.system}] if conv.system else []
        turns: list[SampledIds] = []
        for m, s in zip(conv.messages, sampled, strict=True):
            if s is None:
                messages.append(message_for_template(m))
            else:
                messages.append(_placeholder(len(turns)))
                turns.append(s)
        tools = [tool_for_template(t) for t in conv.tools] or None
        text = self._render(messages, tools, add_generation_prompt=True)
        pieces = self._split(text, len(turns))
        parts = [self.tokenizer.encode_array(pieces[0]).tobytes()]
        eos = self.tokenizer.eos_text
        for turn, piece in zip(turns, pieces[1:], strict=True):
            parts.append(turn.ids)
            if turn.ended_with_eos and piece.startswith(eos):
                piece = piece[len(eos) :]
            parts.append(self.tokenizer.encode_array(piece).tobytes())
        return b"".join(parts)

    def extension(self, last: SampledIds, new: Sequence[Message]) -> np.ndarray:
        """Context ids that follow the sampled turn ``last``: its tail, the new
        messages and the generation prompt. Costs O(new messages)."""
        window = [_ANCHOR, _placeholder(0), *(message_for_template(m) for m in new)]
        text = self._render(window, None, add_generation_prompt=True)
        if not text.startswith(self._window_prefix):
            raise RenderError(f"chat template {self.template.name!r} does not render conversations incrementally")
        return self.tokenizer.encode_array(self.tail(last.ended_with_eos) + text[len(self._window_prefix) :])

    @staticmethod
    def _split(text: str, n: int) -> list[str]:
        pieces = []
        rest = text
        for i in range(n):
            marker = _PH.format(i)
            head, sep, rest = rest.partition(marker)
            if not sep:
                raise RenderError(f"chat template dropped an earlier assistant turn (#{i}); cannot reuse its tokens")
            pieces.append(head)
        pieces.append(rest)
        return pieces


def _placeholder(i: int) -> dict[str, Any]:
    return {"role": "assistant", "content": _PH.format(i)}


def empty_ids() -> np.ndarray:
    return np.zeros(0, dtype=I32)
