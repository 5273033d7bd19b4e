"""The harness's own thread identity from a Responses request's ``client_metadata``.

Codex puts ``x-codex-turn-metadata`` there (a JSON object, sent as a string or an
object) with ``thread_id``, ``thread_source`` ("subagent" for a spawned agent) and
``parent_thread_id``. Untrusted: bounded, and anything malformed is ignored with a
counted warning (the request is served; the capture falls back to its own rules).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from services.proxy.chat.conversation import ThreadHint

log = logging.getLogger(__name__)

KEY = "x-codex-turn-metadata"
MAX_CHARS = 4096  # the metadata string
MAX_ID = 256  # one id
malformed = 0  # hints ignored because malformed (process-wide count)


def thread_hint(client_metadata: Any) -> ThreadHint | None:
    """The hint in ``client_metadata``, or None (absent or malformed)."""
    if not isinstance(client_metadata, dict) or KEY not in client_metadata:
        return None
    raw = client_metadata[KEY]
    meta: Any = raw
    if isinstance(raw, str):
        if len(raw) > MAX_CHARS:
            return _ignore(f"longer than {MAX_CHARS} characters")
        try:
            meta = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _ignore("not valid JSON")
    if not isinstance(meta, dict):
        return _ignore("not a JSON object")
    fields = [meta.get(k, "") for k in ("thread_id", "thread_source", "parent_thread_id")]
    if any(not isinstance(f, str) or len(f) > MAX_ID for f in fields):
        return _ignore(f"thread_id, thread_source, parent_thread_id must be strings of at most {MAX_ID} characters")
    if not fields[0]:
        return None
    return ThreadHint(*fields)


def _ignore(why: str) -> ThreadHint | None:
    global malformed
    malformed += 1
    log.warning("client_metadata %s ignored: %s", KEY, why)
    return None
