"""Engine registry: an engine selection string names the engine and its replicas.

``local``, ``vllm``, ``scripted:PATH``, or ``module.path:ClassName`` (a class
derived from :class:`Engine` whose constructor takes ``(settings, name)``).
An unknown string is an error that lists the valid ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from harnessrl import paths
from services.gateway.engines.base import Engine
from services.gateway.errors import UnknownEngine
from services.gateway.settings import Settings

Factory = Callable[[Settings, str], list[Engine]]

VALID = "'local', 'vllm', 'scripted:PATH' or 'module.path:ClassName'"


def model_dir(settings: Settings) -> Path:
    return (settings.model_path or paths.default_model_dir()).expanduser()


def _local(settings: Settings, arg: str) -> list[Engine]:
    from services.gateway.engines.local import LocalEngine

    return [LocalEngine(settings, name=f"local-{i}") for i in range(settings.replicas)]


def _vllm(settings: Settings, arg: str) -> list[Engine]:
    from services.gateway.engines.vllm_pool import VllmEngine

    if not settings.vllm_urls:
        raise UnknownEngine("engine 'vllm' needs at least one server URL in the gateway's vllm_urls setting")
    return [VllmEngine(settings, url, name=f"vllm-{i}") for i, url in enumerate(settings.vllm_urls)]


def _scripted(settings: Settings, arg: str) -> list[Engine]:
    from services.gateway.engines.scripted import ScriptedEngine

    if not arg:
        raise UnknownEngine("engine 'scripted' needs a script: 'scripted:PATH'")
    engine = ScriptedEngine.from_file(
        Path(arg).expanduser(),
        model_dir(settings),
        log_path=settings.scripted_log_path,
        model_name=settings.model_name,
        initial_version=settings.initial_version,
    )
    if settings.context_window is not None:
        engine.script.context_window = settings.context_window
    return [engine]


ENGINES: dict[str, Factory] = {"local": _local, "vllm": _vllm, "scripted": _scripted}


def _import_class(spec: str) -> type[Engine]:
    module_name, _, class_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownEngine(f"engine {spec!r}: cannot import module {module_name!r} ({e}); valid: {VALID}") from e
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise UnknownEngine(f"engine {spec!r}: {module_name}.{class_name} is not an Engine class; valid: {VALID}")
    return cls


def create_engines(settings: Settings) -> list[Engine]:
    """The replicas named by ``settings.engine`` (not started yet)."""
    spec = settings.engine.strip()
    name, sep, arg = spec.partition(":")
    if name in ENGINES and (sep == "") == (name != "scripted"):
        return ENGINES[name](settings, arg)
    if sep and name and arg and name not in ENGINES:
        cls = _import_class(spec)
        factory = cast(Any, cls)  # custom engines take (settings, name)
        return [factory(settings, f"{cls.kind}-{i}") for i in range(settings.replicas)]
    raise UnknownEngine(f"unknown engine {spec!r}; valid: {VALID}")
