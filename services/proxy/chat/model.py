"""Everything the proxy knows about the served model: tokenizer, chat template,
renderer and tool-call parser, built once from settings, plus preflight."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harnessrl.arrays import I32
from harnessrl.errors import ConfigError
from services.proxy.chat.conversation import Conversation, Message, Tool, ToolCall, tool_for_template
from services.proxy.chat.render import Renderer, RenderError, SampledIds
from services.proxy.chat.template import ChatTemplate, resolve_template
from services.proxy.chat.tokenizer import Tokenizer
from services.proxy.chat.toolparsers import ToolParser, get_parser

PROBE_TOOL = Tool("probe_tool", "preflight", {"type": "object", "properties": {"path": {"type": "string"}}})
PROBE_ARGS = {"path": "a b/c.txt"}


@dataclass
class ChatModel:
    model_dir: Path
    names: list[str]
    tokenizer: Tokenizer
    template: ChatTemplate
    renderer: Renderer
    parser: ToolParser
    reasoning: bool

    @classmethod
    def load(
        cls,
        model_dir: Path,
        names: list[str],
        template_choice: str,
        overrides: dict[str, str],
        parser_name: str,
        reasoning: bool,
    ) -> ChatModel:
        if not model_dir.is_dir():
            raise ConfigError(f"model_dir {model_dir} is not a directory (run setup, or set [proxy] model_dir)")
        tokenizer = Tokenizer(model_dir)
        choice = template_choice
        if choice == "auto" and model_dir.name in overrides:
            choice = overrides[model_dir.name]
        template = resolve_template(model_dir, choice, tokenizer.special_tokens)
        renderer = Renderer(template, tokenizer)
        model = cls(
            model_dir, names or [model_dir.name], tokenizer, template, renderer, get_parser(parser_name), reasoning
        )
        model.preflight()
        return model

    def preflight(self) -> None:
        """Catches a template/parser mismatch at startup, not after a day of training:
        the parser must read back the tool call the template writes."""
        call = {"id": "p1", "type": "function", "function": {"name": PROBE_TOOL.name, "arguments": PROBE_ARGS}}
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        tools = [tool_for_template(PROBE_TOOL)]
        rendered = self.template.render(messages, tools, add_generation_prompt=False)
        prefix = self.template.render(messages[:1], tools, add_generation_prompt=True)
        if PROBE_TOOL.name not in prefix:
            raise ConfigError(f"chat template {self.template.name!r} does not render tools; set an override")
        self._check_incremental()
        if not rendered.startswith(prefix):
            raise ConfigError(f"chat template {self.template.name!r} does not extend its generation prompt")
        body = rendered[len(prefix) :]
        body = body[: body.rfind(self.tokenizer.eos_text)] if self.tokenizer.eos_text in body else body
        result = self.parser.parse(body, (PROBE_TOOL,))
        got = [(c.name, c.arguments) for c in result.calls]
        if result.malformed or got != [(PROBE_TOOL.name, PROBE_ARGS)]:
            raise ConfigError(
                f"tool parser {self.parser.name!r} does not read the tool calls chat template "
                f"{self.template.name!r} writes: {json.dumps(body)} parsed as {got}"
            )

    def _check_incremental(self) -> None:
        """The capture tokenizes only new messages each turn; that is exact only if
        the template renders a conversation as the concatenation of its turns.
        Checked here on a conversation with every kind of message, so a template
        for which it is not true is refused at startup, not found in the data."""
        tools = (PROBE_TOOL,)
        eos = self.tokenizer.eos_id
        turn = SampledIds(np.asarray([*self.tokenizer.encode("ok"), eos], I32).tobytes(), True)
        cut = SampledIds(np.asarray(self.tokenizer.encode("cut off"), I32).tobytes(), False)
        call = (ToolCall("c1", PROBE_TOOL.name, json.dumps(PROBE_ARGS)),)
        steps: list[tuple[SampledIds, list[Message]]] = [
            (turn, [Message("tool", "result one", tool_call_id="c1"), Message("tool", "two", tool_call_id="c2")]),
            (cut, [Message("user", "go on"), Message("system", "a mid-conversation system message")]),
            (turn, []),
        ]
        messages = [Message("user", "task")]
        sampled: list[SampledIds | None] = [None]
        problem = (
            f"chat template {self.template.name!r} does not render conversations incrementally "
            "(a turn's rendering depends on later turns); token-faithful capture cannot use it"
        )
        try:
            context = self.renderer.full(Conversation("system", tuple(messages), tools), sampled)
            for ids, new in steps:
                messages.append(Message("assistant", "echo", call))
                sampled.append(ids)
                context += ids.ids + self.renderer.extension(ids, new).tobytes()
                messages += new
                sampled += [None] * len(new)
                if context != self.renderer.full(Conversation("system", tuple(messages), tools), sampled):
                    raise ConfigError(problem)
        except RenderError as e:
            raise ConfigError(f"{problem}: {e}") from e
