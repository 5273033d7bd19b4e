"""Registry of sandbox backends by name; an unknown name lists the valid ones.
Backends import their SDKs lazily, so ``local`` needs neither Docker nor Kubernetes."""

from __future__ import annotations

import importlib

from services.sandbox.backends.base import Backend
from services.sandbox.common.errors import UnknownName
from services.sandbox.common.settings import Settings

BACKENDS = {
    "local": "services.sandbox.backends.local:LocalBackend",
    "docker": "services.sandbox.backends.docker:DockerBackend",
    "kubernetes": "services.sandbox.backends.kubernetes:KubernetesBackend",
}


def create_backend(settings: Settings) -> Backend:
    try:
        target = BACKENDS[settings.backend]
    except KeyError:
        raise UnknownName(f"unknown sandbox backend {settings.backend!r}; valid backends: {sorted(BACKENDS)}") from None
    module, _, cls = target.partition(":")
    backend: Backend = getattr(importlib.import_module(module), cls)(settings)
    return backend
