"""Typed errors of the proxy and how each protocol shows them to its SDK.

Status codes are chosen for what the harness's SDK does with them: retryable
engine trouble is 503/529 with ``x-should-retry: true`` (openai, anthropic and
litellm retry it), a permanent failure is 500 with ``x-should-retry: false``,
and a context overflow is the 400 each SDK recognises as one.
"""

from __future__ import annotations

from typing import Any

from harnessrl.errors import (
    FailedPrecondition,
    HarnessError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)


class BadRequest(InvalidArgument):
    """Malformed JSON, wrong types, unsupported content. ``param`` and ``code`` fill
    the OpenAI error's fields of those names (the field at fault, a machine code)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class BodyTooLarge(InvalidArgument):
    http_status = 413


class ModelNotFound(NotFound):
    pass


class TrialNotFound(NotFound):
    pass


class WrongTrial(PermissionDenied):
    """A valid token of another trial."""


class BadToken(Unauthenticated):
    pass


class ContextOverflow(InvalidArgument):
    def __init__(self, prompt_tokens: int, window: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.window = window
        super().__init__(
            f"This model's maximum context length is {window} tokens. However, your messages resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the messages."
        )


class MaxTurnsReached(FailedPrecondition):
    http_status = 400


class EngineUnavailable(Unavailable):
    """The engine is paused, overloaded or unreachable: try again."""


class EngineFailure(HarnessError):
    """The engine failed in a way a retry will not fix."""

    http_status = 500


class CaptureFailed(HarnessError):
    http_status = 503
    retryable = True


def failure_kind(exc: BaseException) -> str | None:
    """How a failed request of an authenticated trial counts against the trial:
    ``"refused"`` for a 4xx of the proxy's own (a model name it does not serve, a
    request it cannot parse or represent), ``"proxy_error"`` for a failure inside the
    proxy; None for what is counted elsewhere or is the policy's doing (context
    overflow, max_turns, engine trouble, capture trouble, load shedding, a trial
    closed under the call)."""
    policy_or_counted = (
        ContextOverflow,
        MaxTurnsReached,
        EngineUnavailable,
        EngineFailure,
        CaptureFailed,
        ResourceExhausted,
        TrialNotFound,
    )
    if isinstance(exc, policy_or_counted):
        return None
    if isinstance(exc, HarnessError):
        return "refused" if 400 <= exc.http_status < 500 else "proxy_error"
    return "proxy_error"


def retry_headers(exc: BaseException) -> dict[str, str]:
    if isinstance(exc, EngineUnavailable | ResourceExhausted | CaptureFailed):
        return {"x-should-retry": "true", "retry-after": "1"}
    if isinstance(exc, EngineFailure):
        return {"x-should-retry": "false"}
    return {}


def status_of(exc: BaseException, protocol: str) -> int:
    if isinstance(exc, EngineUnavailable) and protocol == "anthropic":
        return 529  # "overloaded": Claude Code and the SDK back off and retry
    return exc.http_status if isinstance(exc, HarnessError) else 500


def _openai_type(exc: BaseException) -> tuple[str, str | None]:
    table: list[tuple[type, str, str | None]] = [
        (ContextOverflow, "invalid_request_error", "context_length_exceeded"),
        (ModelNotFound, "invalid_request_error", "model_not_found"),
        (BadToken, "authentication_error", "invalid_api_key"),
        (WrongTrial, "permission_error", None),
        (TrialNotFound, "not_found_error", None),
        (EngineUnavailable, "server_error", "engine_unavailable"),
        (EngineFailure, "server_error", "engine_error"),
        (BodyTooLarge, "invalid_request_error", "request_too_large"),
        (MaxTurnsReached, "invalid_request_error", "max_turns_reached"),
        (InvalidArgument, "invalid_request_error", None),
    ]
    for cls, kind, code in table:
        if isinstance(exc, cls):
            return kind, code
    return "server_error", None


def _anthropic_type(exc: BaseException) -> str:
    table: list[tuple[type, str]] = [
        (BadToken, "authentication_error"),
        (WrongTrial, "permission_error"),
        (NotFound, "not_found_error"),
        (BodyTooLarge, "request_too_large"),
        (EngineUnavailable, "overloaded_error"),
        (ResourceExhausted, "rate_limit_error"),
        (InvalidArgument, "invalid_request_error"),
        (FailedPrecondition, "invalid_request_error"),
    ]
    return next((kind for cls, kind in table if isinstance(exc, cls)), "api_error")


def anthropic_message(exc: BaseException) -> str:
    if isinstance(exc, ContextOverflow):
        # The wording Claude Code and the SDK look for.
        return f"prompt is too long: {exc.prompt_tokens} tokens > {exc.window} maximum"
    return str(exc)


def _google_message(exc: BaseException, message: str) -> str:
    if isinstance(exc, ContextOverflow):
        # Google's wording for an over-long prompt.
        return (
            f"The input token count ({exc.prompt_tokens}) exceeds the maximum number of tokens allowed ({exc.window})."
        )
    return message


def error_body(exc: BaseException, protocol: str) -> dict[str, Any]:
    message = str(exc) if isinstance(exc, HarnessError) else f"internal error: {type(exc).__name__}"
    if protocol == "gemini":
        # Google's shape: the HTTP status, the message, the gRPC status name.
        status = exc.grpc_code.name if isinstance(exc, HarnessError) else "INTERNAL"
        return {"error": {"code": status_of(exc, protocol), "message": _google_message(exc, message), "status": status}}
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": _anthropic_type(exc), "message": anthropic_message(exc)}}
    kind, code = _openai_type(exc)
    if isinstance(exc, BadRequest):
        return {"error": {"message": message, "type": kind, "param": exc.param, "code": exc.code or code}}
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
