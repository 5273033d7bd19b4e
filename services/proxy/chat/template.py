"""Chat templates: the model's own (from its folder) or a named override, compiled
once with the same Jinja environment transformers uses, so a render here is
byte-identical to ``tokenizer.apply_chat_template``."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from harnessrl.errors import ConfigError

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "templates"
# Named overrides shipped with the proxy; a setting may also name a .jinja file.
BUILTIN_TEMPLATES = {
    "hermes-chatml": BUILTIN_DIR / "hermes_chatml.jinja",
    "fenced-chatml": BUILTIN_DIR / "fenced_chatml.jinja",  # with tool parser "fenced"
}


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers overrides jinja's tojson (which escapes HTML); so must we.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters["fromjson"] = json.loads
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def read_model_template(model_dir: Path) -> str | None:
    """The template shipped in a HF model folder, if any."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.exists():
        return jinja_file.read_text()
    config = model_dir / "tokenizer_config.json"
    if config.exists():
        value = json.loads(config.read_text()).get("chat_template")
        if isinstance(value, str):
            return value
    return None


class ChatTemplate:
    """A compiled chat template plus the special tokens it is rendered with."""

    def __init__(self, source: str, name: str, special_tokens: dict[str, str]) -> None:
        self.source = source
        self.name = name
        self.sha256 = hashlib.sha256(source.encode()).hexdigest()
        self._special = dict(special_tokens)
        try:
            self._compiled = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ConfigError(f"chat template {name!r} does not compile: {e}") from e

    @property
    def renders_tools(self) -> bool:
        """Cheap static check: a template that never mentions ``tools`` cannot render them."""
        return "tools" in self.source

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        return self._compiled.render(
            messages=messages,
            tools=tools or None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._special,
        )


def resolve_template(model_dir: Path, choice: str, special_tokens: dict[str, str]) -> ChatTemplate:
    """``choice``: ``model`` (the folder's own), ``auto`` (the folder's own if it can
    render tools, else ``hermes-chatml``), a builtin name, or a path to a .jinja file."""
    own = read_model_template(model_dir)
    if choice in ("model", "auto"):
        if own is not None and (choice == "model" or "tools" in own):
            return ChatTemplate(own, f"{model_dir.name}:own", special_tokens)
        if choice == "model":
            raise ConfigError(f"{model_dir}: the model folder has no chat template")
        choice = "hermes-chatml"
    if choice in BUILTIN_TEMPLATES:
        return ChatTemplate(BUILTIN_TEMPLATES[choice].read_text(), choice, special_tokens)
    path = Path(choice).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"chat template {choice!r} is neither 'model', 'auto', a builtin ({sorted(BUILTIN_TEMPLATES)}) nor a file"
        )
    return ChatTemplate(path.read_text(), str(path), special_tokens)
