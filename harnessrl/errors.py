"""A small typed error hierarchy shared by every service, and its mapping to
gRPC and HTTP status codes. Services subclass these; servicers and routes map
them with ``grpc_code``/``http_status`` and never swallow anything else."""

from __future__ import annotations

import grpc


class HarnessError(Exception):
    """Base class: an error a client should see with a clear message."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_status: int = 500
    retryable: bool = False


class InvalidArgument(HarnessError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class NotFound(HarnessError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class AlreadyExists(HarnessError):
    grpc_code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 409


class FailedPrecondition(HarnessError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 409


class Unauthenticated(HarnessError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class PermissionDenied(HarnessError):
    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403


class ResourceExhausted(HarnessError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    retryable = True


class Unavailable(HarnessError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    retryable = True


class Cancelled(HarnessError):
    grpc_code = grpc.StatusCode.CANCELLED
    http_status = 499


class ConfigError(InvalidArgument):
    """A configuration file or setting is invalid; the message names the file and field."""


def grpc_code(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status for an exception: its own for HarnessError, INTERNAL otherwise."""
    return exc.grpc_code if isinstance(exc, HarnessError) else grpc.StatusCode.INTERNAL


def http_status(exc: BaseException) -> int:
    return exc.http_status if isinstance(exc, HarnessError) else 500
