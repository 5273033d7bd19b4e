"""The proxy never crashes on input: arbitrary JSON (and non-JSON) bodies on
every endpoint get a 4xx with an error body in the protocol's shape, never a
500, and the proxy goes on serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.proxy.stack import MODEL, Stack, script

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
roles = st.sampled_from(["user", "assistant", "tool", "system", "developer", "x"])
message = st.fixed_dictionaries(
    {"role": roles},
    optional={"content": json_values, "tool_calls": json_values, "tool_call_id": json_values, "name": json_values},
)
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"model": st.just(MODEL) | json_values, "messages": st.lists(message, max_size=4) | json_values},
        optional={
            "tools": json_values,
            "stream": json_values,
            "max_tokens": json_values,
            "system": json_values,
            "input": json_values,
            "temperature": json_values,
        },
    ),
)
PATHS = ["/chat/completions", "/messages", "/messages/count_tokens", "/responses"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("fuzz")
    s = Stack(tmp, script(tmp, {"*": [{"content": "ok"}]}), render_check=False)
    yield s
    s.stop()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, path=st.sampled_from(PATHS), raw=st.booleans())
def test_arbitrary_bodies_never_crash_the_proxy(stack: Stack, body: Any, path: str, raw: bool) -> None:
    if not hasattr(stack, "fuzz_trial"):
        stack.fuzz_trial = stack.new_trial("fuzz")  # type: ignore[attr-defined]
    base, token = stack.fuzz_trial  # type: ignore[attr-defined]
    content = json.dumps(body).encode()[:-1] if raw else json.dumps(body).encode()
    r = httpx.post(
        base + path, content=content, headers={"x-api-key": token, "content-type": "application/json"}, timeout=60
    )
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["message"] and err["type"]
    else:
        assert r.headers["content-type"].startswith(("application/json", "text/event-stream"))
    assert httpx.get(f"{stack.url}/healthz").status_code == 200
