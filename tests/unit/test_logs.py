"""Logging configuration: one handler, written to the stderr of the moment."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from harnessrl.logs import configure, kv


def test_handler_follows_stderr_and_never_writes_to_a_closed_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure("INFO")
    configure("INFO")  # idempotent: still one handler
    assert len(root.handlers) == 1
    first.close()  # the stream a test's capture (or a CLI call) had, now gone
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("t").warning("after the swap", extra=kv(trial="a b"))
    assert 'warning t after the swap trial="a b"' in second.getvalue()


def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        configure("LOUD")
