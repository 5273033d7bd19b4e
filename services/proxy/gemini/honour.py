"""What of a Gemini request the engine honours, refuses or ignores on purpose.

Honoured: temperature, topP, topK, maxOutputTokens, stopSequences, candidateCount 1,
thinkingConfig.includeThoughts (thought parts returned or not), the function-calling
modes. Refused with a 400 naming the field: what would need what the engines lack
(constrained decoding, several candidates, penalties, seeds, logprobs here, other
modalities, Google's built-in tools, cached content). Accepted and meaningless for
this engine: ``IGNORED``, logged once per process and counted."""

from __future__ import annotations

from pydantic.alias_generators import to_camel

from services.proxy.chat.conversation import Tool
from services.proxy.chat.toolchoice import ToolChoice
from services.proxy.errors import BadRequest
from services.proxy.gemini.models import GenerateContentRequest

PARAM = "toolConfig.functionCallingConfig"

# Accepted, meaningless for this engine, logged and counted: field -> why.
IGNORED = {
    "safetySettings": "the engine has no safety filter",
    "generationConfig.thinkingConfig.thinkingBudget": "the engine cannot bound thinking; the model thinks as it does",
    "generationConfig.thinkingConfig.thinkingLevel": "the engine cannot bound thinking; the model thinks as it does",
    "generationConfig.mediaResolution": "a text model sees no media",
    "tools.functionDeclarations.response": "a function's result schema is not rendered by chat templates",
    "tools.functionDeclarations.behavior": "calls are always blocking over HTTP",
    "toolConfig.retrievalConfig": "no retrieval tools are served",
    "labels": "billing labels",
}


def refusals(req: GenerateContentRequest) -> None:
    """400s naming what this proxy cannot honour (Google's tools, constrained decoding,
    several candidates, logprobs, penalties, seeds, other modalities, cached content)."""
    if req.cached_content:
        _refuse("cachedContent", "this proxy keeps no cached content; send the whole contents")
    for i, tool in enumerate(req.tools or ()):
        for name in tool.model_extra or {}:
            _refuse(f"tools[{i}].{name}", "only functionDeclarations tools are served (no built-in Google tools)")
    g = req.generation_config
    if g is None:
        return
    if g.candidate_count not in (None, 1):
        _refuse("generationConfig.candidateCount", f"must be 1, got {g.candidate_count}")
    if g.response_mime_type not in (None, "", "text/plain"):
        _refuse(
            "generationConfig.responseMimeType",
            f"{g.response_mime_type!r} needs constrained decoding, "
            "which this proxy's engines do not offer; omit it or use 'text/plain'",
        )
    for name in ("response_schema", "response_json_schema"):
        if getattr(g, name) is not None:
            _refuse(
                f"generationConfig.{to_camel(name)}",
                "a response schema needs constrained decoding, which this proxy's engines do not offer",
            )
    if g.response_logprobs or g.logprobs is not None:
        _refuse("generationConfig.responseLogprobs", "logprobs are not returned on the Gemini API here")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(g, name):
            _refuse(f"generationConfig.{to_camel(name)}", "the engines sample without penalties")
    if g.seed is not None:
        _refuse("generationConfig.seed", "the engines do not take a seed")
    if g.response_modalities and any(m.upper() != "TEXT" for m in g.response_modalities):
        _refuse("generationConfig.responseModalities", f"only TEXT is served, got {g.response_modalities}")
    for name in ("speech_config", "image_config"):
        if getattr(g, name) is not None:
            _refuse(f"generationConfig.{to_camel(name)}", "only text is generated")


def _refuse(field: str, why: str) -> None:
    raise BadRequest(f"{field}: {why}", param=field, code="unsupported_value")


def ignored(req: GenerateContentRequest) -> list[str]:
    """The ``IGNORED`` fields this request set."""
    out = []
    if req.safety_settings:
        out.append("safetySettings")
    if req.labels:
        out.append("labels")
    g = req.generation_config
    t = g.thinking_config if g else None
    if t is not None and t.thinking_budget is not None:
        out.append("generationConfig.thinkingConfig.thinkingBudget")
    if t is not None and t.thinking_level is not None:
        out.append("generationConfig.thinkingConfig.thinkingLevel")
    if g is not None and g.media_resolution is not None:
        out.append("generationConfig.mediaResolution")
    decls = [d for tool in req.tools or () for d in tool.function_declarations or ()]
    if any(d.response is not None or d.response_json_schema is not None for d in decls):
        out.append("tools.functionDeclarations.response")
    if any(d.behavior for d in decls):
        out.append("tools.functionDeclarations.behavior")
    if req.tool_config is not None and req.tool_config.retrieval_config is not None:
        out.append("toolConfig.retrievalConfig")
    return out


def include_thoughts(req: GenerateContentRequest) -> bool:
    g = req.generation_config
    return bool(g and g.thinking_config and g.thinking_config.include_thoughts)


# -- tool choice ---------------------------------------------------------------


def tool_choice(req: GenerateContentRequest, tools: tuple[Tool, ...]) -> ToolChoice:
    """``functionCallingConfig``: AUTO (default) and NONE as such; ANY forces a call,
    of the one allowed function if ``allowedFunctionNames`` names one, of any tool if
    it names none or all of them. A subset of several cannot be forced without
    constrained decoding, nor can VALIDATED: both are refused."""
    cfg = req.tool_config.function_calling_config if req.tool_config else None
    if cfg is None:
        return ToolChoice("auto", param=PARAM)
    mode = cfg.mode or "AUTO"
    allowed = cfg.allowed_function_names
    if mode == "VALIDATED":
        _refuse(f"{PARAM}.mode", "VALIDATED needs constrained decoding, which this proxy's engines do not offer")
    if allowed is not None and mode != "ANY":
        raise BadRequest(f"{PARAM}.allowedFunctionNames: only allowed with mode ANY, got mode {mode}", param=PARAM)
    if mode in ("AUTO", "MODE_UNSPECIFIED"):
        return ToolChoice("auto", param=PARAM)
    if mode == "NONE":
        return ToolChoice("none", param=PARAM)
    names = {t.name for t in tools}
    unknown = sorted(set(allowed or ()) - names)
    if unknown:
        raise BadRequest(
            f"{PARAM}.allowedFunctionNames: {unknown} are not among the tools {sorted(names)}", param=PARAM
        )
    chosen = set(allowed or ())
    if len(chosen) == 1:
        return ToolChoice("tool", chosen.pop(), param=PARAM)
    if not chosen or chosen == names:
        return ToolChoice("required", param=PARAM)
    _refuse(
        f"{PARAM}.allowedFunctionNames",
        "forcing a call among a subset of several tools needs constrained "
        "decoding; name one function, all of them, or send only the allowed tools",
    )
    raise AssertionError  # unreachable: _refuse raises
