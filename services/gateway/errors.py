"""Typed errors of the gateway, mapped to gRPC status codes by ``harnessrl.rpc``.

Clients branch on the status code:

- ``OUT_OF_RANGE``: the prompt does not fit the model's context window
  (:class:`ContextLengthExceeded`). The proxy maps it to each SDK's
  context-overflow error; the message starts with ``context_length_exceeded:``.
- ``INVALID_ARGUMENT``: malformed request (bad ids, bad sampling params).
- ``UNAVAILABLE``: retryable: the gateway is paused past the wait bound, or no
  replica is healthy, or a replica failed before the first token and every
  retry failed too.
- ``FAILED_PRECONDITION``: a weight version that does not increase, a script
  that ran out of entries with ``on_exhausted = "error"``.
- ``INTERNAL`` (:class:`EngineFailed`): a replica failed mid-generation; the
  tokens already streamed stand, the call cannot be retried transparently.
"""

from __future__ import annotations

import grpc

from harnessrl.errors import FailedPrecondition, HarnessError, InvalidArgument, NotFound, Unavailable

__all__ = [
    "ContextLengthExceeded",
    "EngineFailed",
    "EngineUnavailable",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "Paused",
    "ScriptExhausted",
    "UnknownEngine",
]


class ContextLengthExceeded(HarnessError):
    """The prompt leaves no room in the context window."""

    grpc_code = grpc.StatusCode.OUT_OF_RANGE
    http_status = 400

    def __init__(self, prompt_tokens: int, context_window: int, detail: str = "") -> None:
        super().__init__(
            f"context_length_exceeded: the prompt has {prompt_tokens} tokens, the model's context window "
            f"is {context_window} tokens"
            if not detail
            else f"context_length_exceeded: {detail}"
        )
        self.prompt_tokens = prompt_tokens
        self.context_window = context_window

    @classmethod
    def from_message(cls, detail: str) -> ContextLengthExceeded:
        """From an engine's own message (vLLM's), when the counts are not known here."""
        return cls(0, 0, detail)


class EngineUnavailable(Unavailable):
    """A replica cannot serve (down, ejected, connection refused). Raised before
    the first token, it makes the router retry on another replica."""


class EngineFailed(HarnessError):
    """A replica failed after streaming tokens; not retryable transparently."""


class Paused(Unavailable):
    """The gateway stayed paused (weight update) past the wait bound."""


class ScriptExhausted(FailedPrecondition):
    """A scripted thread ran out of entries and its script says ``on_exhausted: error``."""


class UnknownEngine(InvalidArgument):
    """An engine selection string that names no engine."""
