"""Request models of the Gemini API (``generateContent``, ``countTokens``).

Fields are camelCase on the wire (snake_case is accepted too, as Google's JSON
mapping does); fields nobody knows are logged like every protocol's (``Loose``).
What is honoured, refused or ignored on purpose: ``honour.py``; the translation
to the canonical conversation: ``translate.py``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictBool, model_validator
from pydantic.alias_generators import to_camel

from services.proxy.errors import BadRequest
from services.proxy.protocol import Loose


class Camel(Loose):
    model_config = ConfigDict(extra="allow", alias_generator=to_camel, validate_by_name=True, validate_by_alias=True)


class FunctionCall(Camel):
    id: str | None = None
    name: str = Field(min_length=1)
    args: dict[str, Any] | None = None


class FunctionResponse(Camel):
    id: str | None = None
    name: str = Field(min_length=1)
    response: dict[str, Any] | None = None


class Part(Camel):
    text: str | None = None
    thought: StrictBool | None = None
    thought_signature: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None
    # Media and code execution: a text model sees a placeholder.
    inline_data: dict[str, Any] | None = None
    file_data: dict[str, Any] | None = None
    executable_code: dict[str, Any] | None = None
    code_execution_result: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Part:
        kinds = [k for k in PART_KINDS if getattr(self, k) is not None]
        if not kinds and self.thought_signature is not None:
            self.text = ""  # a signature alone (Gemini streams one on an empty text part)
            return self
        if len(kinds) != 1:
            names = ", ".join(to_camel(k) for k in PART_KINDS)
            got = ", ".join(to_camel(k) for k in kinds) or "none"
            raise ValueError(f"a part holds exactly one of {names}; got {got}")
        return self


PART_KINDS = (
    "text",
    "function_call",
    "function_response",
    "inline_data",
    "file_data",
    "executable_code",
    "code_execution_result",
)


class Content(Camel):
    role: Literal["user", "model", "function"] | None = None
    parts: list[Part] = Field(min_length=1)


class SystemInstruction(Camel):
    role: str | None = None
    parts: list[Part] = Field(default_factory=list)


class FunctionDeclaration(Camel):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    parameters: dict[str, Any] | None = None
    parameters_json_schema: dict[str, Any] | None = None
    response: Any = None
    response_json_schema: Any = None
    behavior: str | None = None

    @model_validator(mode="after")
    def _one_schema(self) -> FunctionDeclaration:
        if self.parameters is not None and self.parameters_json_schema is not None:
            raise ValueError("set parameters or parametersJsonSchema, not both")
        return self


class GeminiTool(Camel):
    function_declarations: list[FunctionDeclaration] | None = None


class FunctionCallingConfig(Camel):
    mode: Literal["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"] | None = None
    allowed_function_names: list[str] | None = None


class ToolConfig(Camel):
    function_calling_config: FunctionCallingConfig | None = None
    retrieval_config: Any = None


class ThinkingConfig(Camel):
    include_thoughts: StrictBool | None = None
    thinking_budget: int | None = None
    thinking_level: str | None = None


class GenerationConfig(Camel):
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    candidate_count: int | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    thinking_config: ThinkingConfig | None = None
    response_mime_type: str | None = None
    response_schema: Any = None
    response_json_schema: Any = None
    response_logprobs: StrictBool | None = None
    logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    response_modalities: list[str] | None = None
    speech_config: Any = None
    image_config: Any = None
    media_resolution: Any = None


class GenerateContentRequest(Camel):
    model: str | None = None  # in countTokens' generateContentRequest; the path names the model
    contents: list[Content] = Field(min_length=1)
    system_instruction: SystemInstruction | None = None
    tools: list[GeminiTool] | None = None
    tool_config: ToolConfig | None = None
    generation_config: GenerationConfig | None = None
    safety_settings: list[Any] | None = None
    cached_content: str | None = None
    labels: dict[str, Any] | None = None


class CountTokensRequest(Camel):
    contents: list[Content] | None = None
    generate_content_request: GenerateContentRequest | None = None
    system_instruction: SystemInstruction | None = None
    tools: list[GeminiTool] | None = None

    def as_generate(self) -> GenerateContentRequest:
        if self.generate_content_request is not None:
            if self.contents:
                raise BadRequest("countTokens: set contents or generateContentRequest, not both")
            return self.generate_content_request
        if not self.contents:
            raise BadRequest("countTokens: contents must not be empty")
        return GenerateContentRequest(
            contents=self.contents, system_instruction=self.system_instruction, tools=self.tools
        )
