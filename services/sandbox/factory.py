"""Builds the worker-side objects from settings (backend, proxy and capture
clients, runner, worker), so the CLI, the server and tests wire them the same way."""

from __future__ import annotations

from services.sandbox.backends import create_backend
from services.sandbox.common.settings import Settings
from services.sandbox.queue.base import TrialQueue
from services.sandbox.trial.endpoints import CaptureFinalizer, ProxyAdmin
from services.sandbox.trial.runner import TrialRunner
from services.sandbox.worker import Worker


def build_runner(settings: Settings) -> TrialRunner:
    # The sandbox's own [sandbox.tls] when it names a CA; else the process's (HARNESSRL_TLS_*).
    tls = settings.tls if settings.tls.dials_tls else None
    proxy = None
    if settings.proxy_url:
        token = settings.proxy_admin_token.get_secret_value() if settings.proxy_admin_token else None
        proxy = ProxyAdmin(settings.proxy_url, token, tls_settings=tls)
    capture = None
    if settings.capture_target:
        token = settings.capture_token.get_secret_value() if settings.capture_token else None
        capture = CaptureFinalizer(settings.capture_target, token, tls_settings=tls)
    return TrialRunner(settings, create_backend(settings), proxy=proxy, capture=capture)


def build_worker(settings: Settings, queue: TrialQueue, name: str | None = None) -> Worker:
    return Worker(settings, queue, build_runner(settings), name=name)
