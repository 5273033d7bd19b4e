"""The ``harnessrl`` command's first module: what must happen before gRPC is imported.

gRPC core reads its polling settings from the environment once, when ``grpc`` is
imported (setting them later changes nothing, measured), so the hot-path services
(``proxy|gateway|capture serve``) get theirs here, before ``stack.cli.main`` imports
anything. With gRPC 1.85's EventEngine client and listener turned off and the ``poll``
poller, a unary RPC between two idle processes cost 0.73-0.83 ms of server CPU vs
0.97-1.43 with the defaults (the same hour, this 2-core host; either setting alone gave
no clear gain), and the vLLM path 12.5-15.0 vs 14.9-16.9 CPU-ms per short turn
(``bench vllm-path``, docs/benchmarks.md). These services hold a
handful of connections each, so ``poll`` scales as far as they need. A variable set in
the environment wins (``GRPC_EXPERIMENTS=`` with ``GRPC_POLL_STRATEGY=epoll1`` restores
gRPC's defaults); other commands (``run``, ``bench``, the verl launcher) keep them."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping, Sequence

HOT_PATH_SERVICES = ("proxy", "gateway", "capture")
GRPC_ENV = {"GRPC_POLL_STRATEGY": "poll", "GRPC_EXPERIMENTS": "-event_engine_client,-event_engine_listener"}


def grpc_defaults(argv: Sequence[str], env: MutableMapping[str, str]) -> None:
    """Sets GRPC_ENV in ``env`` where unset, if ``argv`` (after the program) serves a hot-path service."""
    if len(argv) >= 2 and argv[0] in HOT_PATH_SERVICES and argv[1] == "serve":
        for key, value in GRPC_ENV.items():
            env.setdefault(key, value)


def main() -> None:
    if "grpc" not in sys.modules:  # too late otherwise (an embedding process imported it first)
        grpc_defaults(sys.argv[1:], os.environ)
    from stack.cli.main import main as run

    run()
