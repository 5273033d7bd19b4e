"""One model call, protocol-agnostic: plan the capture, generate through the
gateway while streaming text out, parse tool calls, commit the capture.

Nothing is committed as a turn unless generation finished: a call that fails,
whose client goes away mid-generation (before or after the response's headers),
or that the engine ends with "abort" is aborted (never a half turn recorded as
whole, never a turn the harness did not receive). Of one whose client left, what
the engine had sampled is kept for audit in an ``abandoned`` thread, never trained
(``services/proxy/abandoned.py``).

A streamed call whose first chunk takes longer than a grace (``[proxy]
stream_headers_after_s``) has its headers sent before it: ``events`` then yields
``KeepAlive`` every ``stream_keepalive_s`` until the first chunk, and an error of
that chunk (overflow, engine failure) is raised from ``events``, which the routes
send in the stream in their protocol's error shape."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
from opentelemetry import trace

from harnessrl import metrics, telemetry
from harnessrl.arrays import I32
from harnessrl.logs import kv
from harnessrl.v1 import gateway_pb2, records_pb2
from services.proxy.abandoned import keep_abandoned
from services.proxy.capture import stopcut
from services.proxy.capture.state import OurTurn, Plan, Sampled
from services.proxy.chat.conversation import Conversation
from services.proxy.chat.render import SampledIds
from services.proxy.chat.stream import Delta, OutputStream, StopStrings
from services.proxy.chat.toolchoice import ToolForcing
from services.proxy.errors import ContextOverflow, EngineFailure, EngineUnavailable, MaxTurnsReached, TrialNotFound
from services.proxy.gateway_client import EngineContextOverflow
from services.proxy.replies import (
    drain_after_finish,
    engine_stops,
    prefilled,
    routes_of,
    sampled_reply,
    submit_parts,
)
from services.proxy.sampling import Chosen
from services.proxy.sampling import choose as choose_sampling
from services.proxy.sampling import max_tokens as sampling_max_tokens
from services.proxy.trials import ProxyCore, Trial

log = logging.getLogger(__name__)


@dataclass
class CallParams:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    call_id_prefix: str = "call_"
    top_logprobs: int = 0  # alternatives to ask the engine for (reported to the client, never sampled from)
    forcing: ToolForcing = field(default_factory=ToolForcing)  # how tool_choice / parallel_tool_calls are honoured
    # The client takes the reply only at its end (not streamed): with no stop string to
    # watch for, the gateway sends it in one message (GenerateRequest.whole_reply).
    whole: bool = False

    @property
    def stops(self) -> list[str]:
        """Every string that ends generation: the client's, then tool forcing's."""
        return [*self.stop, *self.forcing.stops]


@dataclass(frozen=True)
class ToolCallOut:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class Done:
    """The end of a call: everything a non-streaming response needs."""

    turn_id: str
    content: str
    reasoning: str
    calls: list[ToolCallOut]
    finish_reason: str  # stop | length | tool_calls
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stop_sequence: str | None = None  # the stop string that ended the turn, if one did


@dataclass(frozen=True)
class KeepAlive:
    """Nothing yet: the first chunk is still coming (a long prefill). A streamed
    route sends its protocol's keep-alive so the client's read timeouts do not fire."""


KEEPALIVE = KeepAlive()
Event = Delta | Done | KeepAlive


class ModelCall:
    def __init__(self, core: ProxyCore, trial: Trial, conv: Conversation, params: CallParams) -> None:
        self.core = core
        self.trial = trial
        self.conv = conv
        self.params = params
        self.turn_id = uuid.uuid4().hex[:24]
        self.request_id = f"{trial.spec.trial_id}-{self.turn_id}"
        self.plan: Plan | None = None
        self.sampling: Chosen | None = None  # what the engine samples this call with
        self.prefill_ids = b""  # int32 LE: a forced tool call's opening, ending the prompt (context, not sampled)
        self._chunks: AsyncIterator[gateway_pb2.GenerateChunk] | None = None
        self._first: gateway_pb2.GenerateChunk | None = None
        self._pending: asyncio.Future[gateway_pb2.GenerateChunk] | None = None  # the first chunk, on its way
        self.span: trace.Span = trace.INVALID_SPAN
        # What the engine sent so far (int32 / float32 LE per chunk), read by routes that
        # return logprobs; the capture commits exactly these arrays.
        self.received_ids: list[bytes] = []
        self.received_logprobs: list[bytes] = []
        self.received_top: list[gateway_pb2.TopLogprobs] = []  # one per entry of received_ids
        self._call_ids: dict[int, str] = {}  # tool call index -> id, given when the call starts streaming
        self._reading = False  # events() began: its own finally accounts for the call

    @property
    def prompt_tokens(self) -> int:
        return self.plan.prompt_tokens if self.plan else 0

    async def start(self, grace: float | None = None) -> None:
        """Plans and starts generation; every error a harness should get as an HTTP
        status (overflow, engine down, bad input) is raised here, before any output.
        ``grace``: the longest wait for the first chunk (None: no limit); past it
        ``start`` returns with the chunk still coming, and its errors come from ``events``.

        The call is a span of the trial's trace (``proxy.request``): the Generate
        and AppendSegment RPCs it makes are its children; ``events`` ends it."""
        if self.core.tracing:  # spans cost CPU on the hot path: only when this process exports them
            self.span = _tracer().start_span(
                "proxy.request",
                context=self.trial.trace_context,
                kind=trace.SpanKind.SERVER,
                attributes=telemetry.trial_attributes(self.trial.spec) | {"harnessrl.request_id": self.request_id},
            )
        try:
            with trace.use_span(self.span, end_on_exit=False):
                await self._start(grace)
        except BaseException as e:
            self._end_span(e)
            raise

    def _end_span(self, error: BaseException | None = None) -> None:
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.span.end()

    async def _start(self, grace: float | None) -> None:
        trial, core = self.trial, self.core
        if trial.max_turns and trial.turns >= trial.max_turns:
            trial.max_turns_reached = True
            raise MaxTurnsReached(f"trial {trial.spec.trial_id} reached max_turns={trial.max_turns}")
        self.plan = plan = trial.capture.plan(self.conv)
        if self.params.forcing.prefill:
            self.prefill_ids = core.model.tokenizer.encode_array(self.params.forcing.prefill).tobytes()
            self.plan = plan = prefilled(plan, self.prefill_ids)
        try:
            window = await core.context_window(trial)
        except Exception:
            trial.engine_errors += 1
            raise
        if plan.prompt_tokens >= window:
            trial.context_overflow = True
            raise ContextOverflow(plan.prompt_tokens, window)
        s = core.settings
        room = window - plan.prompt_tokens
        max_tokens = sampling_max_tokens(self.params.max_tokens, s.default_max_tokens, s.max_tokens_cap, room, trial)
        chosen = self.sampling = choose_sampling(
            s.sampling,
            {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k},
            {"temperature": self.params.temperature, "top_p": self.params.top_p, "top_k": self.params.top_k},
        )
        trial.count_overrides(chosen.overridden)
        sampling = gateway_pb2.SamplingParams(
            temperature=chosen.temperature,
            top_p=chosen.top_p,
            top_k=chosen.top_k,
            max_tokens=max_tokens,
            stop_token_ids=core.model.tokenizer.stop_ids,
            return_routed_experts=s.return_routed_experts,
            top_logprobs=self.params.top_logprobs,
            stop=engine_stops(self.params.stops),
        )
        request = gateway_pb2.GenerateRequest(
            request_id=self.request_id,
            trial_id=trial.spec.trial_id,
            thread=plan.thread.name,
            prompt_ids=plan.prompt,
            sampling=sampling,
            whole_reply=self.params.whole and not self.params.stops,
            wide_events=not self.params.stops,  # no stop string to see soon: wider engine events
        )
        self._chunks = trial.engine.generate(request)
        pending = self._pending = asyncio.ensure_future(self._first_chunk(self._chunks, window))
        try:
            await asyncio.wait([pending], timeout=grace)
        except BaseException:
            pending.cancel()
            raise
        if pending.done():
            self._first = pending.result()  # its error: an HTTP status, as no header has gone

    async def _first_chunk(
        self, chunks: AsyncIterator[gateway_pb2.GenerateChunk], window: int
    ) -> gateway_pb2.GenerateChunk:
        """The first chunk of the reply, its failure counted against the trial once."""
        assert self.plan is not None
        try:
            return await anext(chunks)
        except EngineContextOverflow as e:
            self.trial.context_overflow = True
            raise ContextOverflow(self.plan.prompt_tokens, window) from e
        except Exception:
            self.trial.engine_errors += 1
            raise

    async def _await_first(self) -> AsyncIterator[KeepAlive]:
        """Yields KEEPALIVE every ``stream_keepalive_s`` until the first chunk has come.
        Its error is raised (counted already, the span ended); a client that leaves
        meanwhile aborts the call."""
        assert self._pending is not None
        every = self.core.settings.stream_keepalive_s
        try:
            while not self._pending.done():
                await asyncio.wait([self._pending], timeout=every)
                if not self._pending.done():
                    yield KEEPALIVE
            self._first = self._pending.result()
        except BaseException as e:
            if not self._pending.done():  # the client left (or the proxy is stopping): abandoned
                await self._aborted()
            else:
                self._end_span(e)
            raise

    async def events(self) -> AsyncIterator[Event]:
        """Streams text as it is sampled, then one Done after the capture is committed;
        KeepAlive first while the first chunk is still coming (``start``'s grace passed)."""
        assert self.plan is not None and self._chunks is not None and self._pending is not None
        self._reading = True
        if self._first is None:
            async for k in self._await_first():
                yield k
        assert self._first is not None
        started = time.monotonic()
        tok = self.core.model.tokenizer
        decoder = tok.decoder()
        out = OutputStream(self.core.model.parser, self.conv.tools, self.core.model.reasoning)
        stopper = StopStrings(self.params.stops)
        ids, logprobs = self.received_ids, self.received_logprobs
        versions: list[bytes] = []
        routes: list[np.ndarray] = []
        last = self._first
        committed = False
        client_left = False
        try:
            for delta in out.feed(self.params.forcing.prefill):
                if (sent := self._outgoing(delta)) is not None:
                    yield sent
            chunk: gateway_pb2.GenerateChunk | None = self._first
            while chunk is not None:
                last = chunk
                t = chunk.tokens
                if t.ids:
                    ids.append(t.ids)
                    logprobs.append(t.logprobs)
                    if self.params.top_logprobs:
                        self.received_top.append(chunk.top_logprobs)
                    versions.append(t.policy_versions)
                    if t.routed_experts.data:
                        routes.append(routes_of(t.routed_experts))
                    text = stopper.feed(decoder.steps(np.frombuffer(t.ids, I32)))
                    for delta in out.feed(text):
                        if (sent := self._outgoing(delta)) is not None:
                            yield sent
                if chunk.finish_reason == "abort" and stopper.hit is None:
                    # The engine cut the reply (stopping, or an abort of ours): not a finished
                    # turn, and the harness gets no end of it; nothing is captured.
                    raise EngineUnavailable("the engine aborted the generation before it finished")
                if chunk.finish_reason or stopper.hit is not None:
                    if chunk.finish_reason and self.core.tracing:
                        await drain_after_finish(self._chunks)
                    break
                chunk = await anext(self._chunks, None)
            if stopper.hit is not None:
                # The engine may still be sampling (one that cannot watch text): stop it;
                # what it sent past the stop is cut from the capture below.
                await self._stop_engine()
            else:
                await self._chunks.aclose()  # type: ignore[attr-defined]
            for delta in out.feed(stopper.feed(decoder.flush()) + stopper.flush()):
                if (sent := self._outgoing(delta)) is not None:
                    yield sent
            final = out.finish()
            for delta in final.deltas:
                if (sent := self._outgoing(delta)) is not None:
                    yield sent
            engine_finish = "stop" if stopper.hit is not None else last.finish_reason or "stop"
            sampled = sampled_reply(ids, logprobs, versions, routes, engine_finish, tok.stop_ids)
            if stopper.hit is not None:
                sampled = self._cut_at_stop(sampled, stopper.seen_chars)
            # Each call keeps the id its first streamed delta carried and the arguments
            # text its deltas spelled out.
            calls = [
                ToolCallOut(self._call_ids.get(i) or self._new_call_id(), c.name, final.arguments[i])
                for i, c in enumerate(final.calls[: self.params.forcing.max_calls])
            ]
            finish = "tool_calls" if calls else ("length" if sampled.finish_reason == "length" else "stop")
            self.trial.dropped_tool_calls += len(final.calls) - len(calls)  # parallel_tool_calls false
            if final.malformed:
                self.trial.malformed_tool_calls += 1
            # Counts of what is captured, not the engine's report: a stop string cuts
            # the reply short of the engine's count, and a stream may end without usage.
            usage = records_pb2.Usage(
                prompt_tokens=self.plan.prompt_tokens,
                completion_tokens=sampled.num_tokens,
                cached_prompt_tokens=min(last.usage.cached_prompt_tokens, self.plan.prompt_tokens),
            )
            with trace.use_span(self.span, end_on_exit=False):
                self._commit(sampled, calls, final.content, finish, usage)
            committed = True
            if self.span.is_recording():
                self.span.set_attributes(
                    {
                        "harnessrl.thread": self.plan.thread.name,
                        "harnessrl.prompt_tokens": self.plan.prompt_tokens,
                        "harnessrl.sampled_tokens": sampled.num_tokens,
                        "harnessrl.finish_reason": finish,
                    }
                )
            metrics.TOKENS.labels("proxy", "prompt").inc(self.plan.prompt_tokens)
            metrics.TOKENS.labels("proxy", "sampled").inc(sampled.num_tokens)
            log.info(
                "turn",
                extra=kv(
                    trial=self.trial.spec.trial_id,
                    thread=self.plan.thread.name,
                    prompt=self.plan.prompt_tokens,
                    sampled=sampled.num_tokens,
                    s=round(time.monotonic() - started, 3),
                ),
            )
            yield Done(
                self.turn_id,
                final.content,
                final.reasoning,
                calls,
                finish,
                self.plan.prompt_tokens,
                sampled.num_tokens,
                last.usage.cached_prompt_tokens,
                stopper.hit if stopper.hit in self.params.stop else None,  # a forcing stop is no stop sequence
            )
        except (EngineUnavailable, EngineFailure, EngineContextOverflow) as e:
            self.trial.engine_errors += 1
            self.span.record_exception(e)
            raise
        except Exception as e:
            # A failure of the proxy's own mid-call (a stream's status line is gone, so
            # the route's error handler never sees it).
            self.trial.note_failure(e, "turn")
            raise
        except (GeneratorExit, asyncio.CancelledError):  # the route stopped reading: its client left
            client_left = True
            raise
        finally:
            if not committed:
                self.trial.aborted_turns += 1
                metrics.FAILURES.labels("proxy", "turn_aborted").inc()
                if client_left:
                    keep_abandoned(self, versions, routes)
                self.span.set_status(trace.Status(trace.StatusCode.ERROR, "aborted"))
                await self._stop_engine()
            self._end_span()

    def _new_call_id(self) -> str:
        return f"{self.params.call_id_prefix}{uuid.uuid4().hex[:24]}"

    def _outgoing(self, delta: Delta) -> Delta | None:
        """A delta as the client gets it: a call's first delta carries its id; calls past
        ``forcing.max_calls`` (parallel_tool_calls false) are not sent, as Done drops them."""
        limit = self.params.forcing.max_calls
        if delta.kind in ("call", "args") and limit is not None and delta.index >= limit:
            return None
        return self._named(delta) if delta.kind == "call" else delta

    def _named(self, delta: Delta) -> Delta:
        """A call's first delta gets the call's id."""
        call_id = self._call_ids[delta.index] = self._new_call_id()
        return Delta("call", delta.text, delta.index, call_id)

    async def abandon(self) -> None:
        """Ends a started call whose events were never read (its client left before the
        first one): counted as aborted, the engine stopped, the span ended, nothing captured.
        A no-op once ``events`` began (its own ``finally`` does this) or before ``start``."""
        if self._reading or self._chunks is None:
            return
        self._reading = True
        if self._pending is not None and self._pending.done() and not self._pending.cancelled():
            self._pending.exception()  # a late first chunk's error (counted already) is read, not logged as lost
        await self._aborted()

    async def _aborted(self) -> None:
        """A turn that ends before its answer began: counted, the engine stopped, the span ended."""
        self.trial.aborted_turns += 1
        metrics.FAILURES.labels("proxy", "turn_aborted").inc()
        self.span.set_status(trace.Status(trace.StatusCode.ERROR, "aborted"))
        try:
            await self._stop_engine()
        finally:
            self._end_span()

    def _cut_at_stop(self, sampled: Sampled, chars: int) -> Sampled:
        """The capture without the tokens the harness was not given: from the first
        whose text ends past character ``chars``, where what it was given before the stop
        string ends (dropped, not masked: see ``stopcut``); counted in the trial's
        ``stop_cut_tokens``."""
        tok = self.core.model.tokenizer
        keep = stopcut.tokens_before(tok, np.frombuffer(sampled.ids, I32), chars)
        dropped = sampled.num_tokens - keep
        if not dropped:
            return sampled
        self.trial.stop_cut_tokens += dropped
        metrics.TOKENS.labels("proxy", "cut_at_stop").inc(dropped)
        self._trim_received(keep)
        return stopcut.cut(sampled, keep, tok.stop_ids)

    def _trim_received(self, keep: int) -> None:
        """The arrays routes report logprobs from, cut like the capture: a client
        that asked for logprobs gets those of the tokens it was given."""
        left = keep
        for i, chunk in enumerate(self.received_ids):
            n = len(chunk) // 4
            if n > left:
                self.received_ids[i] = chunk[: 4 * left]
                self.received_logprobs[i] = self.received_logprobs[i][: 4 * left]
                if i < len(self.received_top):
                    top, k = self.received_top[i], self.received_top[i].k
                    ids, lps = top.ids[: 4 * left * k], top.logprobs[: 4 * left * k]
                    self.received_top[i] = gateway_pb2.TopLogprobs(k=k, ids=ids, logprobs=lps)
                del self.received_ids[i + 1 :], self.received_logprobs[i + 1 :], self.received_top[i + 1 :]
                return
            left -= n

    async def _stop_engine(self) -> None:
        try:
            if self._pending is not None and not self._pending.done():
                # The first chunk's read is still running (in its task): cancelled, and the
                # stream is left to end with the abort below (closing it now would race the read).
                self._pending.cancel()
            elif self._chunks is not None:
                await self._chunks.aclose()  # type: ignore[attr-defined]
        finally:
            await self.trial.engine.abort(self.request_id)

    def _commit(
        self, sampled: Sampled, calls: list[ToolCallOut], content: str, finish: str, usage: records_pb2.Usage
    ) -> None:
        assert self.plan is not None
        trial = self.trial
        if trial.closed:
            raise TrialNotFound(f"trial {trial.spec.trial_id} was closed during the call")
        turn = OurTurn(
            self.turn_id,
            tuple(c.id for c in calls),
            content,
            SampledIds(self.prefill_ids + sampled.ids, sampled.ended_with_eos),  # the turn as the engine saw it
            tuple(c.name for c in calls),
        )
        sampling = self.sampling.record() if self.sampling is not None else None
        parts = trial.capture.commit(self.plan, sampled, turn, sampling)
        trial.turns += 1
        submit_parts(self.core, trial, parts, sampled, finish, usage)


def _tracer() -> trace.Tracer:
    return telemetry.tracer(__name__, "proxy")


def _json(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)
