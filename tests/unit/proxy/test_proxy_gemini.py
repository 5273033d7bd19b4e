"""The Gemini API's requests -> the canonical conversation, what is honoured,
refused (a 400 naming the field, in Google's error shape) or ignored on purpose."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harnessrl import metrics
from services.proxy.chat.conversation import Message, Tool, ToolCall
from services.proxy.chat.toolchoice import ToolForcing
from services.proxy.errors import (
    BadRequest,
    BadToken,
    BodyTooLarge,
    ContextOverflow,
    EngineUnavailable,
    ModelNotFound,
    WrongTrial,
    error_body,
    status_of,
)
from services.proxy.gemini.honour import ignored, include_thoughts, refusals, tool_choice
from services.proxy.gemini.models import CountTokensRequest, GenerateContentRequest
from services.proxy.gemini.routes import call_params, note_ignored
from services.proxy.gemini.translate import json_schema, signature, to_conversation, turn_of
from services.proxy.protocol import parse

USER = {"role": "user", "parts": [{"text": "hi"}]}
BASH = {"name": "bash", "parameters": {"type": "OBJECT", "properties": {"command": {"type": "STRING"}}}}
TOOLS = [{"functionDeclarations": [BASH, {"name": "ls"}]}]


def request(**kw: Any) -> GenerateContentRequest:
    return parse(GenerateContentRequest, json.dumps({"contents": [USER], **kw}).encode())


def bad(body: dict[str, Any]) -> str:
    """The 400's message for ``body``, from parsing or from the refusals."""
    with pytest.raises(BadRequest) as e:
        req = parse(GenerateContentRequest, json.dumps(body).encode())
        refusals(req)
        tool_choice(req, to_conversation(req).tools)
    return str(e.value)


def test_contents_become_the_canonical_conversation_with_signatures_as_turn_refs() -> None:
    sig = signature("turn123")
    req = request(
        systemInstruction={"parts": [{"text": "You are "}, {"text": "Gemini CLI."}]},
        contents=[
            {"role": "user", "parts": [{"text": "context\n"}, {"text": "task"}, {"inlineData": {"mimeType": "x"}}]},
            {
                "role": "model",
                "parts": [
                    {"text": "I think.", "thought": True},
                    {"text": "Running.", "thoughtSignature": sig},
                    {"functionCall": {"id": "c1", "name": "bash", "args": {"command": "ls"}}, "thoughtSignature": sig},
                    {"functionCall": {"name": "ls"}},
                    {"thoughtSignature": sig},  # what Gemini CLI keeps of the last, empty, part
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"id": "c1", "name": "bash", "response": {"output": "a.txt"}}},
                    {"text": "<reminder>"},
                    {"functionResponse": {"name": "ls", "response": {"error": "denied"}}},
                    {"functionResponse": {"name": "ls", "response": {"files": ["a"]}}},
                ],
            },
            {"role": "function", "parts": [{"function_response": {"name": "ls", "response": {}}}]},  # snake_case too
        ],
        tools=TOOLS,
    )
    conv = to_conversation(req)
    assert conv.system == "You are Gemini CLI." and conv.protocol == "gemini"
    assert conv.messages == (
        Message("user", "context\ntask[inlineData omitted]"),
        Message(
            "assistant",
            "Running.",
            (ToolCall("c1", "bash", '{"command": "ls"}'), ToolCall("", "ls", "{}")),
            reasoning="I think.",
            turn_ref="turn123",
        ),
        Message("tool", "a.txt", tool_call_id="c1"),
        Message("user", "<reminder>"),
        Message("tool", "Error: denied"),
        Message("tool", '{"files": ["a"]}'),
        Message("tool", "{}"),
    )
    bash = {"type": "object", "properties": {"command": {"type": "string"}}}
    assert conv.tools == (Tool("bash", "", bash), Tool("ls", "", {"type": "object", "properties": {}}))


def test_signatures_round_trip_in_both_base64_alphabets_and_foreign_ones_are_no_turn() -> None:
    sig = signature("abc")
    assert turn_of(sig) == "abc"
    assert turn_of(sig.replace("-", "+").replace("_", "/").rstrip("=")) == "abc"  # the SDK re-encodes
    assert turn_of("skip_thought_signature_validator") == ""  # Gemini CLI's synthetic one
    assert turn_of("aGVsbG8=") == "" and turn_of(None) == "" and turn_of("!!") == ""


def test_json_schema_lower_cases_gemini_type_names_only() -> None:
    schema = {
        "type": "OBJECT",
        "properties": {
            "type": {"type": "STRING", "enum": ["OBJECT"]},
            "xs": {"type": "ARRAY", "items": {"type": "INTEGER"}},
        },
        "anyOf": [{"type": ["STRING", "NULL"]}],
    }
    assert json_schema(schema) == {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["OBJECT"]},
            "xs": {"type": "array", "items": {"type": "integer"}},
        },
        "anyOf": [{"type": ["string", "null"]}],
    }
    js = {"type": "object", "properties": {"x": {"type": "string"}}}
    conv = to_conversation(request(tools=[{"functionDeclarations": [{"name": "f", "parametersJsonSchema": js}]}]))
    assert conv.tools[0].parameters == js


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, ("auto", "")),
        ({"mode": "AUTO"}, ("auto", "")),
        ({"mode": "NONE"}, ("none", "")),
        ({"mode": "ANY"}, ("required", "")),
        ({"mode": "ANY", "allowedFunctionNames": ["ls"]}, ("tool", "ls")),
        ({"mode": "ANY", "allowedFunctionNames": ["ls", "bash"]}, ("required", "")),
    ],
)
def test_function_calling_modes(config: dict[str, Any] | None, expected: tuple[str, str]) -> None:
    req = request(tools=TOOLS, toolConfig={"functionCallingConfig": config} if config else None)
    choice = tool_choice(req, to_conversation(req).tools)
    assert (choice.mode, choice.name) == expected and choice.parallel


def test_generation_config_is_honoured_and_thoughts_follow_include_thoughts() -> None:
    g = {
        "temperature": 1,
        "topP": 0.95,
        "topK": 64,
        "maxOutputTokens": 100,
        "stopSequences": ["END"],
        "candidateCount": 1,
    }
    req = request(generationConfig={**g, "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192}})
    p = call_params(req, ToolForcing(), stream=True)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.stop, p.whole) == (1, 0.95, 64, 100, ["END"], False)
    assert include_thoughts(req) and not include_thoughts(request())
    assert call_params(request(), ToolForcing(), stream=False).whole
    assert ignored(req) == ["generationConfig.thinkingConfig.thinkingBudget"]
    counter = metrics.IGNORED_FIELDS.labels("proxy", "gemini", "generationConfig.thinkingConfig.thinkingBudget")
    before = counter._value.get()
    note_ignored(req)
    assert counter._value.get() == before + 1
    more = request(
        safetySettings=[{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}],
        generationConfig={"thinkingConfig": {"thinkingLevel": "HIGH"}},
        tools=[{"functionDeclarations": [{"name": "f", "response": {"type": "STRING"}}]}],
    )
    assert ignored(more) == [
        "safetySettings",
        "generationConfig.thinkingConfig.thinkingLevel",
        "tools.functionDeclarations.response",
    ]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": "hi"}, "contents"),
        ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "contents.0.role"),
        ({"contents": [{"role": "user", "parts": []}]}, "contents.0.parts"),
        ({"contents": [{"role": "user", "parts": [{}]}]}, "a part holds exactly one of"),
        (
            {"contents": [{"role": "user", "parts": [{"text": "a", "functionCall": {"name": "f"}}]}]},
            "got text, functionCall",
        ),
        ({"contents": [{"role": "user", "parts": [{"text": 3}]}]}, "contents.0.parts.0.text"),
        ({"contents": [{"role": "user", "parts": [{"text": "x", "thought": "yes"}]}]}, "thought"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}, "functionCall.name"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]}, "args"),
        ({"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "f", "response": "x"}}]}]}, "response"),
        ({"contents": [USER], "systemInstruction": "be brief"}, "systemInstruction"),
        ({"contents": [USER], "tools": [{"functionDeclarations": [{"name": ""}]}]}, "functionDeclarations.0.name"),
        (
            {
                "contents": [USER],
                "tools": [{"functionDeclarations": [{"name": "f", "parameters": {}, "parametersJsonSchema": {}}]}],
            },
            "not both",
        ),
        ({"contents": [USER], "tools": [{"googleSearch": {}}]}, "tools[0].googleSearch"),
        ({"contents": [USER], "tools": [{"codeExecution": {}}]}, "tools[0].codeExecution"),
        ({"contents": [USER], "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}}, "mode"),
        ({"contents": [USER], "toolConfig": {"functionCallingConfig": {"mode": "VALIDATED"}}}, "VALIDATED"),
        (
            {
                "contents": [USER],
                "tools": TOOLS,
                "toolConfig": {"functionCallingConfig": {"mode": "AUTO", "allowedFunctionNames": ["ls"]}},
            },
            "only allowed with mode ANY",
        ),
        (
            {
                "contents": [USER],
                "tools": TOOLS,
                "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["rm"]}},
            },
            "['rm']",
        ),
        (
            {
                "contents": [USER],
                "tools": [{"functionDeclarations": [BASH, {"name": "ls"}, {"name": "cat"}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["ls", "cat"]}},
            },
            "allowedFunctionNames",
        ),
        ({"contents": [USER], "generationConfig": {"temperature": 3}}, "temperature"),
        ({"contents": [USER], "generationConfig": {"topP": -1}}, "topP"),
        ({"contents": [USER], "generationConfig": {"topK": "many"}}, "topK"),
        ({"contents": [USER], "generationConfig": {"maxOutputTokens": 0}}, "maxOutputTokens"),
        ({"contents": [USER], "generationConfig": {"stopSequences": "END"}}, "stopSequences"),
        ({"contents": [USER], "generationConfig": {"candidateCount": 2}}, "generationConfig.candidateCount"),
        ({"contents": [USER], "generationConfig": {"responseMimeType": "application/json"}}, "responseMimeType"),
        ({"contents": [USER], "generationConfig": {"responseJsonSchema": {"type": "object"}}}, "responseJsonSchema"),
        ({"contents": [USER], "generationConfig": {"responseSchema": {"type": "OBJECT"}}}, "responseSchema"),
        ({"contents": [USER], "generationConfig": {"responseLogprobs": True}}, "responseLogprobs"),
        ({"contents": [USER], "generationConfig": {"presencePenalty": 0.5}}, "presencePenalty"),
        ({"contents": [USER], "generationConfig": {"frequencyPenalty": 0.5}}, "frequencyPenalty"),
        ({"contents": [USER], "generationConfig": {"seed": 7}}, "seed"),
        ({"contents": [USER], "generationConfig": {"responseModalities": ["IMAGE"]}}, "responseModalities"),
        ({"contents": [USER], "generationConfig": {"speechConfig": {}}}, "speechConfig"),
        ({"contents": [USER], "generationConfig": {"thinkingConfig": {"includeThoughts": "yes"}}}, "includeThoughts"),
        ({"contents": [USER], "cachedContent": "cachedContents/abc"}, "cachedContent"),
        ({"contents": [USER], "tools": [{"functionDeclarations": [{"name": "f"}, {"name": "f"}]}]}, "declared twice"),
    ],
)
def test_malformed_or_unservable_fields_are_400s_naming_the_field(body: dict[str, Any], named: str) -> None:
    message = bad(body)
    assert named in message, message


def test_a_part_in_the_wrong_turn_is_refused() -> None:
    with pytest.raises(BadRequest, match="functionResponse part belongs to a user turn"):
        to_conversation(request(contents=[{"role": "model", "parts": [{"functionResponse": {"name": "f"}}]}]))
    with pytest.raises(BadRequest, match="functionCall part belongs to a model turn"):
        to_conversation(request(contents=[{"role": "user", "parts": [{"functionCall": {"name": "f"}}]}]))


def test_count_tokens_takes_contents_or_a_whole_request() -> None:
    plain = parse(CountTokensRequest, json.dumps({"contents": [USER]}).encode()).as_generate()
    whole = parse(
        CountTokensRequest, json.dumps({"generateContentRequest": {"model": "models/m", "contents": [USER]}}).encode()
    )
    assert plain.contents == whole.as_generate().contents
    with pytest.raises(BadRequest, match="contents must not be empty"):
        parse(CountTokensRequest, b"{}").as_generate()
    both = {"contents": [USER], "generateContentRequest": {"contents": [USER]}}
    with pytest.raises(BadRequest, match="not both"):
        parse(CountTokensRequest, json.dumps(both).encode()).as_generate()


@pytest.mark.parametrize(
    ("exc", "code", "status"),
    [
        (BadRequest("x"), 400, "INVALID_ARGUMENT"),
        (BodyTooLarge("x"), 413, "INVALID_ARGUMENT"),
        (BadToken("x"), 401, "UNAUTHENTICATED"),
        (WrongTrial("x"), 403, "PERMISSION_DENIED"),
        (ModelNotFound("x"), 404, "NOT_FOUND"),
        (EngineUnavailable("x"), 503, "UNAVAILABLE"),
        (ContextOverflow(9000, 8192), 400, "INVALID_ARGUMENT"),
        (RuntimeError("boom"), 500, "INTERNAL"),
    ],
)
def test_errors_in_google_shape(exc: Exception, code: int, status: str) -> None:
    body = error_body(exc, "gemini")
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "status"}
    assert (body["error"]["code"], body["error"]["status"]) == (code, status) and status_of(exc, "gemini") == code
    if isinstance(exc, ContextOverflow):
        assert (
            body["error"]["message"]
            == "The input token count (9000) exceeds the maximum number of tokens allowed (8192)."
        )
