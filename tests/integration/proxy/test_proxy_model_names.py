"""Model names and refusals: every name a harness sends serves the trial's policy
and is recorded; with the allow-list on, an unknown name is a 404. A request the
proxy refuses itself (or fails inside) is counted in the trial's summary: that is
what makes the sandbox end the trial ``proxy_error``, never ``completed``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.integration.proxy.stack import MODEL, Stack, script

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("names")
    s = Stack(tmp, script(tmp, {"*": [{"content": "Hello."}]}))
    yield s
    s.stop()


def test_any_model_name_serves_the_policy_and_is_recorded(stack: Stack) -> None:
    base, token = stack.new_trial("any-name")
    oa = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    for name in ("harnessrl-policy", "gpt-9"):
        reply = oa.chat.completions.create(model=name, messages=MSG)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "Hello." and reply.model == name
    an = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=token, max_retries=0)
    message = an.messages.create(model="claude-default-model", max_tokens=16, messages=MSG)  # type: ignore[arg-type]
    assert message.model == "claude-default-model"
    summary = stack.close_trial("any-name")
    assert summary["requested_models"] == {"harnessrl-policy": 1, "gpt-9": 1, "claude-default-model": 1}
    assert summary["num_turns"] == 3 and summary["refused_requests"] == 0 and summary["proxy_errors"] == 0
    assert len(stack.export("any-name")) >= 1


def test_a_refused_request_is_counted_against_its_trial(stack: Stack) -> None:
    base, token = stack.new_trial("refused")
    r = httpx.post(
        f"{base}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert r.status_code == 400
    summary = stack.close_trial("refused")
    assert summary["refused_requests"] == 1 and summary["num_turns"] == 0
    assert summary["refusals"][0].startswith("400 chat/completions: invalid request")


def test_policy_outcomes_are_not_refusals(stack: Stack) -> None:
    base, token = stack.new_trial("turn-limit", max_turns=1)
    oa = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    oa.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
    summary = stack.close_trial("turn-limit")
    assert summary["max_turns_reached"] and summary["refused_requests"] == 0


def test_with_the_allow_list_an_unknown_name_is_a_404_and_a_refusal(tmp_path: Path) -> None:
    stack = Stack(tmp_path, script(tmp_path, {"*": [{"content": "Hello."}]}), accept_any_model_name=False)
    try:
        base, token = stack.new_trial("strict", model="my-alias")
        oa = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
        for name in (MODEL, "my-alias"):
            assert oa.chat.completions.create(model=name, messages=MSG).choices[0].message.content == "Hello."  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError) as e:
            oa.chat.completions.create(model="gpt-9", messages=MSG)  # type: ignore[arg-type]
        assert "does not exist" in str(e.value) and "my-alias" in str(e.value)
        summary = stack.close_trial("strict")
        assert summary["refused_requests"] == 1 and summary["num_turns"] == 2
        assert "gpt-9" not in summary["requested_models"]
    finally:
        stack.stop()
