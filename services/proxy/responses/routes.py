"""``POST /trials/<id>/v1/responses``: thin route; the event stream emits
reasoning, message and function-call items as the model produces them.
``previous_response_id`` continues a response the trial stored (``store``, true
by default; see ``store.py``), which ``GET``/``DELETE /v1/responses/<id>`` read
and drop."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from services.proxy.chat.conversation import ThreadHint
from services.proxy.chat.toolchoice import forcing
from services.proxy.chat.toolstream import Delta
from services.proxy.errors import ContextOverflow, error_body
from services.proxy.openai.logprobs import TokenLogprobs, responses_request
from services.proxy.protocol import SSE_KEEPALIVE, FastJSON, authenticate, core_of, grace, parse_request, sse
from services.proxy.responses.models import Item, ResponsesRequest, input_items, to_conversation, tool_choice
from services.proxy.responses.store import ResponseStore
from services.proxy.responses.thread_hint import thread_hint
from services.proxy.responses.tools import ToolNames, note_dropped
from services.proxy.trials import ProxyCore, Trial
from services.proxy.turn import CallParams, Done, KeepAlive, ModelCall, ToolCallOut

router = APIRouter()


@router.post("/trials/{trial_id}/v1/responses")
async def responses(trial_id: str, request: Request) -> Response:
    trial = authenticate(request, trial_id)
    body = await parse_request(request, ResponsesRequest, "responses")
    earlier = trial.responses.chain(body.previous_response_id) if body.previous_response_id else []
    hint = thread_hint((body.model_extra or {}).get("client_metadata"))
    call, names, lp = await begin(
        core_of(request), trial, body, earlier, whole=not body.stream, hint=hint, grace=grace(request, body.stream)
    )

    def store(done: Done) -> None:
        if body.store:
            keep(trial.responses, body, done, names)

    if body.stream:
        stream = EventStream(call, body.model, names, lp, store, echo(body))
        return StreamingResponse(stream.events(), media_type="text/event-stream")
    async for event in call.events():
        if isinstance(event, Done):
            items = _items(event, names, lp.take() if lp else None)
            obj = {**response_object(call.turn_id, body.model, "completed", items, event), **echo(body)}
            store(event)
            return FastJSON(obj)
    raise RuntimeError("generation ended without a result")


@router.get("/trials/{trial_id}/v1/responses/{response_id}")
async def get_response(trial_id: str, response_id: str, request: Request) -> Response:
    return FastJSON(authenticate(request, trial_id).responses.get(response_id))


@router.delete("/trials/{trial_id}/v1/responses/{response_id}")
async def delete_response(trial_id: str, response_id: str, request: Request) -> Response:
    authenticate(request, trial_id).responses.delete(response_id)
    return FastJSON({"id": response_id, "object": "response.deleted", "deleted": True})


async def begin(
    core: ProxyCore,
    trial: Trial,
    body: ResponsesRequest,
    earlier: Sequence[Item],
    *,
    whole: bool = False,
    hint: ThreadHint | None = None,
    grace: float | None = None,
) -> tuple[ModelCall, ToolNames, TokenLogprobs | None]:
    """Starts one turn (HTTP and WebSocket alike): ``earlier``, the items of the chain
    ``previous_response_id`` named, then the request's own input. ``whole``: the client
    takes the response only at its end (HTTP without ``stream``; a WebSocket streams).
    ``grace``: ``ModelCall.start``'s (HTTP streaming; a WebSocket's connection is open)."""
    core.check_model(trial, body.model)
    conv, names = to_conversation(body, earlier)
    if hint is not None:  # the harness's own thread identity decides the thread (capture/state.py)
        conv = dataclasses.replace(conv, thread_hint=hint)
    note_dropped(trial, names.dropped)
    top = responses_request(body.include, body.top_logprobs)
    choice = forcing(tool_choice(body), core.model, conv.tools)
    params = CallParams(
        body.max_output_tokens, body.temperature, body.top_p, top_logprobs=top or 0, forcing=choice, whole=whole
    )
    call = ModelCall(core, trial, conv, params)
    await call.start(grace)
    return call, names, TokenLogprobs(call, top) if top is not None else None


def echo(body: ResponsesRequest) -> dict[str, Any]:
    """Request fields a response object repeats."""
    return {
        "previous_response_id": body.previous_response_id or None,
        "store": body.store,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
    }


def keep(store: ResponseStore, body: ResponsesRequest, done: Done, names: ToolNames) -> None:
    """Keeps a finished response for ``previous_response_id``: the input its request
    added and its output items as a harness would echo them."""
    output = _items(done, names, None)
    obj = {**response_object(done.turn_id, body.model, "completed", output, done), **echo(body)}
    echoed = [Item.model_validate(o) for o in output]
    store.put(obj["id"], body.previous_response_id or None, input_items(body), echoed, obj)


def _call_item(c: ToolCallOut, names: ToolNames, status: str = "completed") -> dict[str, Any]:
    """A call's output item: a namespace's tool by its own name and ``namespace`` (``tools.py``)."""
    name, namespace = names.wire(c.name)
    spaced = {"namespace": namespace} if namespace else {}
    if c.name in names.custom:
        value = json.loads(c.arguments).get("input", c.arguments)
        text = value if isinstance(value, str) else json.dumps(value)
        return {
            "type": "custom_tool_call",
            "id": f"ctc_{c.id}",
            "call_id": c.id,
            "name": name,
            **spaced,
            "input": text,
            "status": status,
        }
    return {
        "type": "function_call",
        "id": f"fc_{c.id}",
        "call_id": c.id,
        "name": name,
        **spaced,
        "arguments": c.arguments,
        "status": status,
    }


def _reasoning_item(turn: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{turn}", "summary": [{"type": "summary_text", "text": text}]}


def _text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return part if logprobs is None else {**part, "logprobs": logprobs}


def _message_item(
    turn: str, text: str, status: str = "completed", logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    content = [_text_part(text, logprobs)] if status == "completed" else []
    return {"type": "message", "id": f"msg_{turn}", "status": status, "role": "assistant", "content": content}


def _items(done: Done, names: ToolNames, logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    items = [_reasoning_item(done.turn_id, done.reasoning)] if done.reasoning else []
    if done.content:  # the turn's logprobs ride on its text; a turn of tool calls only has none
        items.append(_message_item(done.turn_id, done.content, logprobs=logprobs))
    return items + [_call_item(c, names) for c in done.calls]


def response_object(
    turn: str, model: str, status: str, output: list[dict[str, Any]], done: Done | None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "id": f"resp_{turn}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "incomplete_details": None,
        "error": None,
    }
    if done is not None:
        if done.finish_reason == "length":
            obj["status"] = "incomplete"
            obj["incomplete_details"] = {"reason": "max_output_tokens"}
        obj["usage"] = {
            "input_tokens": done.prompt_tokens,
            "input_tokens_details": {"cached_tokens": done.cached_tokens},
            "output_tokens": done.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": done.prompt_tokens + done.completion_tokens,
        }
    return obj


class EventStream:
    def __init__(
        self,
        call: ModelCall,
        model: str,
        names: ToolNames,
        lp: TokenLogprobs | None,
        on_done: Callable[[Done], None] | None = None,
        echo: dict[str, Any] | None = None,
        encode: Callable[[dict[str, Any], str], bytes] = sse,
    ) -> None:
        self.call, self.model, self.names, self.lp = call, model, names, lp
        self.encode = encode  # one event as sent: an SSE frame, or a WebSocket message's JSON
        self.on_done = on_done  # called once the turn is committed, before response.completed
        self.echo = echo or {}  # request fields every response object repeats
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: str | None = None  # "reasoning" | "text" | "call"
        self.buffer = ""  # the open item's text (a call's: its arguments)
        self.tool = ("", "")  # the open call's id and name
        self.held: list[Delta] = []  # tool deltas sent after the message (when it carries logprobs)

    def _response(self, status: str, output: list[dict[str, Any]], done: Done | None) -> dict[str, Any]:
        return {**response_object(self.call.turn_id, self.model, status, output, done), **self.echo}

    def ev(self, kind: str, **data: Any) -> bytes:
        self.seq += 1
        return self.encode({"type": kind, "sequence_number": self.seq, **data}, kind)

    def _added(self, item: dict[str, Any]) -> bytes:
        return self.ev("response.output_item.added", output_index=len(self.output), item=item)

    def _close(self, finished: Done | None = None, whole: bool = True) -> list[bytes]:
        """Ends the open item; a call is whole when the next one starts or the turn
        confirms it (``finished``), and incomplete when text follows it (a malformed call)."""
        turn, idx, out = self.call.turn_id, len(self.output), []
        if self.open == "call":
            return self._close_call(finished, whole)
        if self.open == "reasoning":
            part: dict[str, Any] = {"type": "summary_text", "text": self.buffer}
            item_id = f"rs_{turn}"
            out.append(
                self.ev(
                    "response.reasoning_summary_text.done",
                    item_id=item_id,
                    output_index=idx,
                    summary_index=0,
                    text=self.buffer,
                )
            )
            out.append(
                self.ev(
                    "response.reasoning_summary_part.done",
                    item_id=item_id,
                    output_index=idx,
                    summary_index=0,
                    part=part,
                )
            )
            item = _reasoning_item(turn, self.buffer)
        elif self.open == "text":
            item_id, lps = f"msg_{turn}", self.lp.entries if self.lp else None
            if self.lp is not None and (rest := self.lp.take()):  # tokens after the last text delta
                out.append(self._text_delta("", rest))
            done = {"item_id": item_id, "output_index": idx, "content_index": 0}
            out.append(self.ev("response.output_text.done", **done, text=self.buffer, logprobs=lps or []))
            out.append(self.ev("response.content_part.done", **done, part=_text_part(self.buffer, lps)))
            item = _message_item(turn, self.buffer, logprobs=lps)
        else:
            return out
        out.append(self.ev("response.output_item.done", output_index=idx, item=item))
        self.output.append(item)
        self.open, self.buffer = None, ""
        return out

    def _tool(self, event: Delta) -> list[bytes]:
        """A call's start or a piece of its arguments, sent as it streams (a custom
        tool's input, which is not JSON, is sent whole when the call ends)."""
        if event.kind == "call":
            out = self._close()
            self.open, self.buffer, self.tool = "call", "", (event.id, event.text)
            if event.text not in self.names.custom:
                c = ToolCallOut(event.id, event.text, "")
                out.append(self._added(_call_item(c, self.names, "in_progress")))
            return out
        self.buffer += event.text
        if self.tool[1] in self.names.custom:
            return []
        item_id, idx = f"fc_{self.tool[0]}", len(self.output)
        return [self.ev("response.function_call_arguments.delta", item_id=item_id, output_index=idx, delta=event.text)]

    def _close_call(self, done: Done | None, whole: bool) -> list[bytes]:
        call_id, name = self.tool
        c = ToolCallOut(call_id, name, self.buffer)
        if done is not None:
            confirmed = [x for x in done.calls if x.id == call_id]
            whole, c = bool(confirmed), confirmed[0] if confirmed else c
        self.open, self.buffer = None, ""
        if name in self.names.custom:
            return self._call(c) if whole else []
        idx, item = len(self.output), _call_item(c, self.names, "completed" if whole else "incomplete")
        args = {"item_id": item["id"], "output_index": idx, "arguments": c.arguments}
        out = [self.ev("response.function_call_arguments.done", **args)]
        out.append(self.ev("response.output_item.done", output_index=idx, item=item))
        self.output.append(item)
        return out

    def _open(self, kind: str) -> list[bytes]:
        out = self._close(whole=False)
        turn, idx = self.call.turn_id, len(self.output)
        part: dict[str, Any]
        if kind == "reasoning":
            out.append(self._added({"type": "reasoning", "id": f"rs_{turn}", "summary": []}))
            part = {"type": "summary_text", "text": ""}
            out.append(
                self.ev(
                    "response.reasoning_summary_part.added",
                    item_id=f"rs_{turn}",
                    output_index=idx,
                    summary_index=0,
                    part=part,
                )
            )
        else:
            out.append(self._added(_message_item(turn, "", "in_progress")))
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(
                self.ev(
                    "response.content_part.added", item_id=f"msg_{turn}", output_index=idx, content_index=0, part=part
                )
            )
        self.open = kind
        return out

    async def events(self) -> AsyncGenerator[bytes, None]:
        inner = self._events()
        try:
            async for b in inner:
                yield b
        finally:  # a client that left before the call's first event: stop the engine all the same
            await inner.aclose()
            await self.call.abandon()

    async def _events(self) -> AsyncGenerator[bytes, None]:
        turn = self.call.turn_id
        yield self.ev("response.created", response=self._response("in_progress", [], None))
        yield self.ev("response.in_progress", response=self._response("in_progress", [], None))
        try:
            async for event in self.call.events():
                if isinstance(event, KeepAlive):  # the first token is still coming
                    yield SSE_KEEPALIVE
                    continue
                if isinstance(event, Done):
                    if self.held and event.calls:  # the message first, with the rest of the turn's logprobs
                        for b in self._close() + [b for held in self.held for b in self._tool(held)]:
                            yield b
                    for b in self._close(event):  # every other call has streamed by now
                        yield b
                    final = self._response("completed", self.output, event)
                    if self.on_done is not None:
                        self.on_done(event)
                    yield self.ev("response.completed", response=final)
                    return
                if event.kind in ("call", "args"):
                    if self.lp is not None:
                        # The message's logprobs cover every token of the turn, as unstreamed:
                        # its calls follow it once the turn has ended.
                        self.held.append(event)
                        continue
                    for b in self._tool(event):
                        yield b
                    continue
                if self.open != event.kind:
                    for b in self._open(event.kind):
                        yield b
                self.buffer += event.text
                idx = len(self.output)
                if event.kind == "reasoning":
                    yield self.ev(
                        "response.reasoning_summary_text.delta",
                        item_id=f"rs_{turn}",
                        output_index=idx,
                        summary_index=0,
                        delta=event.text,
                    )
                else:
                    yield self._text_delta(event.text, self.lp.take() if self.lp else [])
        except Exception as e:  # noqa: BLE001 - the status line is gone; the SDK reads response.failed
            body = error_body(e, "openai")["error"]
            failed = self._response("failed", self.output, None)
            failed["error"] = {
                "code": "context_length_exceeded" if isinstance(e, ContextOverflow) else body["code"] or "server_error",
                "message": body["message"],
            }
            yield self.ev("response.failed", response=failed)

    def _text_delta(self, text: str, logprobs: list[dict[str, Any]]) -> bytes:
        ids = {"item_id": f"msg_{self.call.turn_id}", "output_index": len(self.output), "content_index": 0}
        return self.ev("response.output_text.delta", **ids, delta=text, logprobs=logprobs)

    def _call(self, c: ToolCallOut) -> list[bytes]:
        """A whole call's events (a custom tool's: its input is sent once known)."""
        idx = len(self.output)
        item = _call_item(c, self.names)
        out = [
            self._added(
                {**_call_item(c, self.names, "in_progress"), "arguments": ""}
                if item["type"] == "function_call"
                else {**item, "input": "", "status": "in_progress"}
            )
        ]
        if item["type"] == "function_call":
            out.append(
                self.ev(
                    "response.function_call_arguments.delta", item_id=item["id"], output_index=idx, delta=c.arguments
                )
            )
            out.append(
                self.ev(
                    "response.function_call_arguments.done", item_id=item["id"], output_index=idx, arguments=c.arguments
                )
            )
        else:
            out.append(
                self.ev(
                    "response.custom_tool_call_input.delta", item_id=item["id"], output_index=idx, delta=item["input"]
                )
            )
            out.append(
                self.ev(
                    "response.custom_tool_call_input.done", item_id=item["id"], output_index=idx, input=item["input"]
                )
            )
        out.append(self.ev("response.output_item.done", output_index=idx, item=item))
        self.output.append(item)
        return out
