"""Per-run namespace: run-scoped tokens on top of the service credential.

Every RPC already needs the service's bearer token (``auth_token``, checked
by the common interceptor). With ``run_token_key`` set, a caller must also
present ``x-harnessrl-run-token: HMAC-SHA256(run_token_key, run_id)`` for the
run its request names, so the stack of one run cannot read or overwrite
another run's data even though both hold the service credential. Tokens are
derived, not stored: a new run needs no configuration change on the store.
"""

from __future__ import annotations

import hashlib
import hmac

import grpc

from harnessrl.errors import PermissionDenied

RUN_TOKEN_HEADER = "x-harnessrl-run-token"


def run_token(key: str, run_id: str) -> str:
    """The token that grants access to ``run_id`` (hex HMAC-SHA256)."""
    return hmac.new(key.encode(), run_id.encode(), hashlib.sha256).hexdigest()


def run_metadata(key: str | None, run_id: str) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying the run token, or none without a key."""
    return ((RUN_TOKEN_HEADER, run_token(key, run_id)),) if key else ()


class RunGuard:
    def __init__(self, key: str | None) -> None:
        self._key = key

    def check(self, context: grpc.aio.ServicerContext, run_id: str) -> None:
        if self._key is None:
            return
        presented = dict(context.invocation_metadata() or ()).get(RUN_TOKEN_HEADER, "")
        if not isinstance(presented, str) or not hmac.compare_digest(presented, run_token(self._key, run_id)):
            raise PermissionDenied(f"missing or wrong {RUN_TOKEN_HEADER} for run {run_id!r}")
