"""Fixtures of the proxy's unit tests: the real tokenizer and templates of the
default model (a plain HF folder prepared by setup)."""

from __future__ import annotations

import pytest

from harnessrl.paths import default_model_dir
from services.proxy.capture.state import TrialCapture
from services.proxy.chat.render import Renderer
from services.proxy.chat.template import ChatTemplate, resolve_template
from services.proxy.chat.tokenizer import Tokenizer
from tests.unit.proxy.capture_harness import Harness


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer(default_model_dir())


@pytest.fixture(scope="session")
def hermes(tokenizer: Tokenizer) -> ChatTemplate:
    return resolve_template(default_model_dir(), "auto", tokenizer.special_tokens)


@pytest.fixture(scope="session")
def renderer(hermes: ChatTemplate, tokenizer: Tokenizer) -> Renderer:
    return Renderer(hermes, tokenizer)


@pytest.fixture
def harness(renderer: Renderer) -> Harness:
    return Harness(TrialCapture(renderer, render_check=True))
