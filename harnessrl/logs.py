"""Logging: quiet by default, key=value fields, one call to configure."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO


class KeyValueFormatter(logging.Formatter):
    """``ts level logger msg k=v ...``; extra fields come from ``extra={"kv": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname.lower()} {record.name} {record.getMessage()}"
        kv: dict[str, Any] | None = getattr(record, "kv", None)
        if kv:
            base += " " + " ".join(f"{k}={_quote(v)}" for k, v in kv.items())
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


def _quote(value: Any) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to ``sys.stderr`` as it is at each record, never to a stream it kept:
    a test's captured stderr (or any stream swapped in after ``configure``) may be
    closed by then, and logging to it printed "--- Logging error ---" tracebacks."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:  # type: ignore[override]
        return sys.stderr


def configure(level: str = "WARNING") -> None:
    """Configures the root logger once (idempotent); ``level`` is a logging level name."""
    root = logging.getLogger()
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    root.setLevel(numeric)
    if not any(getattr(h, "_harnessrl", False) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(KeyValueFormatter())
        handler._harnessrl = True  # type: ignore[attr-defined]
        root.addHandler(handler)


def kv(**fields: Any) -> dict[str, Any]:
    """``log.info("msg", extra=kv(trial=...))``."""
    return {"kv": fields}
