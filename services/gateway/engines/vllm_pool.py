"""The vLLM engine: one replica per vLLM OpenAI-compatible server.

Generation, by default (``vllm_stream_interval`` > 1): ``POST /inference/v1/generate``,
vLLM's token endpoint (``vllm_tokens``): events of that many tokens, versions from the
weight-version spans it reports; a server without it (403/404) gets the per-token path,
and the token endpoint is asked again after a bounded backoff (``TOKEN_RETRY_S`` doubling
up to ``TOKEN_RETRY_MAX_S``): the next request after it is the probe. A 403 may be a
replica restarting with other flags, or a proxy in front of it briefly refusing, so
one refusal must not cost the replica its wide events for good.
A whole reply (``GenerateInput.whole``) asks for events of its whole budget: two events,
its first token and the rest with its end. A reply whose caller watches no stop string
(``GenerateInput.wide``) asks for events of ``vllm_stream_interval_wide``.
Per token (``vllm_stream_interval = 1``): ``POST /v1/completions`` with ``prompt`` as token ids,
``logprobs: 1`` and ``return_token_ids: true``, streamed (SSE); a request for
top logprobs asks ``logprobs: k`` with ``return_tokens_as_token_ids: true``
(alternatives keyed ``token_id:N``). vLLM returns
routed experts (``--enable-return-routed-experts``, MoE models) only on
non-streamed replies, so a request that asks for routes is sent unstreamed.
Start servers with ``--logprobs-mode processed_logprobs`` so the logprobs are
the sampling distribution's, like the local engine's default.

Control needs ``VLLM_SERVER_DEV_MODE=1`` on the server (its RL endpoints):

- Pause/Resume: ``POST /pause?mode=keep`` freezes running requests in vLLM's
  queue with their KV cache, ``POST /resume`` lets them continue.
- UpdateWeights (default ``options["transfer"] = "reload"``): ``POST
  /collective_rpc`` calling the workers' ``reload_weights(weights_path=...)``
  (in place, from a safetensors checkpoint folder), then ``/reset_prefix_cache``
  and ``/update_weight_version``.
- Collective/NCCL hook (``options["transfer"] = "weight_transfer"``): the
  trainer drives vLLM's weight-transfer engine; the gateway calls
  ``/init_weight_transfer_engine`` (when ``options["init_info"]`` is given, JSON),
  ``/start_weight_update``, ``/update_weights`` with ``options["update_info"]``
  (JSON) and ``/finish_weight_update``. The trainer side of the group is the
  trainer's business; this path is not exercised on CPU.

Policy versions, per-token path: a token carries the version current when it
arrived. While paused, arriving tokens were sampled before the pause, so they keep
the old version until Resume; pause before updating for exact per-token versions.
Token endpoint: vLLM's own record of which weights sampled each token (``Holdback``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx
import numpy as np

from harnessrl import tls
from harnessrl.errors import ConfigError, InvalidArgument
from services.gateway import modelfiles
from services.gateway.engines import vllm_tokens
from services.gateway.engines.base import F32, I32, Chunk, Engine, EngineInfo, GenerateInput
from services.gateway.engines.vllm_completions import FINISH, completion_body, decode_routes, parse_top_logprobs
from services.gateway.engines.vllm_http import HttpError, HttpPool, HttpStatus, Response, sse_batches
from services.gateway.errors import ContextLengthExceeded, EngineFailed, EngineUnavailable
from services.gateway.settings import Settings

log = logging.getLogger(__name__)

UNKNOWN_VOCAB = 2**31 - 1

# What every vLLM server behind this engine must be started with (the module docstring
# says why); docker-compose.yml's vLLM service is checked against these by a test.
REQUIRED_SERVER_FLAGS: tuple[tuple[str, str], ...] = (("--logprobs-mode", "processed_logprobs"),)
REQUIRED_SERVER_ENV: dict[str, str] = {"VLLM_SERVER_DEV_MODE": "1"}
# vllm_stream_interval > 1 only: the token endpoint (vllm_tokens) is behind this flag.
STREAM_INTERVAL_SERVER_FLAGS: tuple[str, ...] = ("--enable-scale-out",)
# After the token endpoint answers 403/404: per-token requests for this long, then one probe;
# each further refusal doubles the wait, up to the cap (see the module docstring).
TOKEN_RETRY_S = 30.0
TOKEN_RETRY_MAX_S = 600.0
# MoE policies only (routes for R3): the server must return them.
MOE_SERVER_FLAGS: tuple[str, ...] = ("--enable-return-routed-experts",)


def _client_error(status: int, text: str) -> Exception:
    try:
        detail = json.loads(text)
        message = detail.get("error", {}).get("message") or detail.get("message") or text
    except (json.JSONDecodeError, AttributeError):
        message = text
    message = str(message)[:2000]
    if "context length" in message or "maximum model length" in message or "max_model_len" in message:
        return ContextLengthExceeded.from_message(message)
    return InvalidArgument(f"vLLM rejected the request ({status}): {message}")


def replica_tls(settings: Settings) -> tls.TlsSettings | None:
    """How the client verifies an ``https`` replica: the gateway's ``tls.ca_file``
    (presenting its ``cert_file`` when set, for replicas behind mTLS), else the
    process's client table (``HARNESSRL_TLS_*``); None: the system's CAs."""
    table = settings.tls if settings.tls.dials_tls else tls.client()
    return table if table.dials_tls else None


def replica_verify(table: tls.TlsSettings | None, replica: str) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for ``table`` (True: the system's CAs, never unverified)."""
    if table is None:
        return True
    try:
        return tls.client_context(table) or True
    except (ssl.SSLError, OSError) as e:
        files = f"ca_file {table.ca_file}, cert_file {table.cert_file}"
        raise ConfigError(f"vLLM replica {replica}: cannot load the TLS files ({files}): {e}") from e


class VllmEngine(Engine):
    """One vLLM server; see the module docstring."""

    kind = "vllm"

    def __init__(self, settings: Settings, url: str, name: str = "vllm-0") -> None:
        super().__init__(name)
        self.settings = settings
        self.url = url.rstrip("/")
        self.served_model = settings.vllm_model or ""
        self.version = settings.initial_version
        self._stamp, self._epoch = -1, 0
        self._stamp_version = self.version
        self._paused = False
        self._context_window = settings.context_window or 0
        self._vocab = UNKNOWN_VOCAB
        self._client: httpx.AsyncClient | None = None  # health, models, control, unstreamed replies
        self._http: HttpPool | None = None  # streamed completions: one event per token (see vllm_http)
        self._tls: tls.TlsSettings | None = None  # how the client verifies an https replica (None: system CAs)
        self._running: dict[str, Response | None] = {}
        # Token endpoint refused (403/404): per-token requests until ``_tokens_retry_at``
        # (monotonic), then the next request probes it; the wait doubles per refusal.
        self.token_retry_s, self.token_retry_max_s = TOKEN_RETRY_S, TOKEN_RETRY_MAX_S
        self._tokens_retry_at = 0.0
        self._tokens_backoff = 0.0
        self._aborted: set[str] = set()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise EngineUnavailable(f"vLLM replica {self.name} is not started")
        return self._client

    async def start(self) -> None:
        headers = {}
        if self.settings.vllm_api_key is not None:
            headers["Authorization"] = f"Bearer {self.settings.vllm_api_key.get_secret_value()}"
        limits = httpx.Limits(max_connections=self.settings.vllm_max_concurrency + 8)
        self._tls = replica_tls(self.settings)
        verify = replica_verify(self._tls, self.name)
        timeout = self.settings.vllm_timeout_s
        self._client = httpx.AsyncClient(
            base_url=self.url, headers=headers, limits=limits, timeout=timeout, verify=verify
        )
        self._http = HttpPool(self.url, headers, timeout, verify)
        model_dir = self.settings.model_path
        if model_dir is not None and (model_dir / "config.json").exists():
            self._vocab = modelfiles.vocab_size(model_dir)
        # The server may still be starting: the health probe reinstates it later.
        try:
            await self.check_health()
        except EngineUnavailable as e:
            log.warning("vLLM replica not ready", extra={"kv": {"replica": self.name, "error": str(e)}})

    async def close(self) -> None:
        for request_id in list(self._running):
            await self.abort(request_id)
        if self._http is not None:
            self._http.close()
        if self._client is not None:
            await self._client.aclose()

    def info(self) -> EngineInfo:
        return EngineInfo(
            model=self.served_model or "(vllm: not reached yet)",
            context_window=self._context_window,
            vocab_size=self._vocab,
            policy_version=self.version,
            in_flight=len(self._running),
            capacity=self.settings.vllm_max_concurrency,
        )

    async def check_health(self) -> None:
        try:
            health = await self.client.get("/health", timeout=5)
            health.raise_for_status()
            if not self.served_model or not self._context_window:
                models = (await self.client.get("/v1/models", timeout=5)).json()["data"]
                entry = next((m for m in models if m["id"] == self.served_model), models[0])
                self.served_model = entry["id"]
                self._context_window = self.settings.context_window or int(entry.get("max_model_len") or 0)
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            raise EngineUnavailable(f"vLLM server {self.url} is not healthy: {await self._why(e)}") from e

    async def _why(self, e: Exception) -> str:
        """The error in words; for an https replica whose connection failed, what TLS
        says of it (a wrong CA, a client certificate the replica wants)."""
        said = str(e) or type(e).__name__
        url = httpx.URL(self.url)
        if url.scheme != "https" or not isinstance(e, httpx.TransportError | HttpError) or self._tls is None:
            return said
        why = await asyncio.to_thread(tls.probe, url.host, url.port or 443, self._tls)
        return f"{said} (TLS: {why})" if why else said

    # --- generation ---------------------------------------------------------------

    async def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        if request.sampling.return_routed_experts:
            async for chunk in self._generate_once(request):
                yield chunk
            return
        if self._http is None:
            raise EngineUnavailable(f"vLLM replica {self.name} is not started")
        # Events of many tokens come from the token endpoint (vllm_tokens: exact versions);
        # a server that does not serve it gets per-token events from /v1/completions.
        tokens_api = self.settings.vllm_stream_interval > 1 and time.monotonic() >= self._tokens_retry_at
        try:
            async for chunk in self._stream(request, tokens_api):
                yield chunk
        except _NoTokenEndpoint as e:
            self._tokens_backoff = min(max(self._tokens_backoff * 2, self.token_retry_s), self.token_retry_max_s)
            self._tokens_retry_at = time.monotonic() + self._tokens_backoff
            flags = " ".join(STREAM_INTERVAL_SERVER_FLAGS)
            why = (
                f"{e}: one event per token for {self._tokens_backoff:g} s, then asked again "
                f"(start vLLM with {flags} for vllm_stream_interval)"
            )
            log.warning("vLLM replica has no token endpoint", extra={"kv": {"replica": self.name, "why": why}})
            async for chunk in self._stream(request, False):
                yield chunk
            return
        if tokens_api and self._tokens_backoff:
            log.info("vLLM replica serves the token endpoint again", extra={"kv": {"replica": self.name}})
            self._tokens_backoff = 0.0

    async def _stream(self, request: GenerateInput, tokens_api: bool) -> AsyncGenerator[Chunk, None]:
        assert self._http is not None
        rid = request.request_id
        self._running[rid] = None
        interval, top = self.settings.vllm_stream_interval, request.sampling.top_logprobs
        if tokens_api:
            if request.whole:  # the first token's event and the last: two wakes however long the reply
                interval = max(interval, request.budget)
            elif request.wide:  # no stop string is watched: nothing is sampled past one seen late
                interval = max(interval, self.settings.vllm_stream_interval_wide)
            path, body = vllm_tokens.PATH, vllm_tokens.generate_body(self.served_model, request, interval)
        else:
            path, body = "/v1/completions", completion_body(self.served_model, request, stream=True)
        holdback = vllm_tokens.Holdback(self._epoch, self._stamp)
        started = False
        tail: list[Chunk] = []
        response: Response | None = None
        try:
            response = await self._http.stream_post(path, body)
            if rid in self._aborted:  # aborted while the request was on its way
                raise HttpError("aborted")
            self._running[rid] = response
            finish, cached, spans = "", 0, None
            async for events in sse_batches(response.aiter_bytes()):
                parsed: list[Chunk] = []
                for event in events:
                    if tokens_api:
                        one, finish_now, cached_now, spans_now = vllm_tokens.parse_event(event, self._stamp, top)
                        spans = spans_now or spans
                    else:
                        one, finish_now, cached_now = self._parse_event(event, top)
                    finish, cached = finish or finish_now, cached or cached_now
                    if one is not None and len(one):
                        parsed.append(one)
                merged = merge_chunks(parsed)
                out = holdback.take(merged, self._epoch) if tokens_api else merged
                if finish:  # the reply's last tokens: kept to go out with its finish (usage follows at once);
                    # unsent, they leave ``started`` as it was: a failure now leaves nothing sent to retry over
                    tail += out
                    continue
                for chunk in out:
                    started = True
                    yield chunk
            if tokens_api:
                tail += holdback.finish(spans, self.settings.initial_version)
            for chunk in _with_finish(tail, finish or "stop", cached):
                yield chunk
        except HttpStatus as e:
            if tokens_api and e.status in (403, 404):  # disabled (403) or too old a vLLM (404)
                if rid in self._aborted:  # aborted on its way: no fallback to run it again
                    yield Chunk.empty("abort")
                    return
                raise _NoTokenEndpoint(f"{self.url}{path} answered {e.status}") from e
            if e.status < 500:
                raise _client_error(e.status, e.text) from e
            raise EngineUnavailable(f"vLLM server {self.url} answered {e.status}: {e.text[:500]}") from e
        except HttpError as e:
            if rid in self._aborted:
                for chunk in tail:  # sampled before the abort: kept, as every token sent before it
                    yield chunk
                yield Chunk.empty("abort")
            elif started:
                raise EngineFailed(f"vLLM server {self.url} failed mid-generation: {e}") from e
            else:
                raise EngineUnavailable(f"vLLM server {self.url} unreachable: {e}") from e
        finally:
            self._running.pop(rid, None)
            self._aborted.discard(rid)
            if response is not None:
                await response.aclose()  # a no-op once read to the end (back in the pool)

    def _parse_event(self, event: dict[str, Any], top: int = 0) -> tuple[Chunk | None, str, int]:
        usage = event.get("usage")
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) if usage else 0
        choices = event.get("choices")
        if not choices:
            return None, "", cached
        choice = choices[0]
        token_ids = choice.get("token_ids") or []
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs") or []
        n = len(token_ids)
        if len(logprobs) != n:
            raise EngineFailed(f"vLLM sent {n} token ids but {len(logprobs)} logprobs")
        versions = self._one_version if n == 1 else np.full(n, self._stamp_version, I32)
        chunk = Chunk(np.array(token_ids, I32), np.array(logprobs, F32), versions)
        if top:
            chunk.top_ids, chunk.top_logprobs = parse_top_logprobs(lp, n, top)
        reason = choice.get("finish_reason")
        return chunk, FINISH.get(reason, "stop") if reason else "", cached

    @property
    def _stamp_version(self) -> int:
        return self._stamp

    @_stamp_version.setter
    def _stamp_version(self, version: int) -> None:
        """Versions stamped on arriving tokens; a one-token event (most of a stream)
        shares one read-only array instead of allocating its own."""
        if version != self._stamp:
            self._epoch += 1  # replies under way hold what comes next (vllm_tokens.Holdback)
        self._stamp = version
        self._one_version = np.full(1, version, I32)
        self._one_version.flags.writeable = False

    async def _generate_once(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        """Unstreamed: the only way vLLM returns routed experts."""
        self._running[request.request_id] = None
        try:
            response = await self.client.post(
                "/v1/completions", json=completion_body(self.served_model, request, False)
            )
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"vLLM server {self.url} unreachable: {e}") from e
        finally:
            self._running.pop(request.request_id, None)
        if response.status_code >= 400:
            if response.status_code < 500:
                raise _client_error(response.status_code, response.text)
            raise EngineUnavailable(f"vLLM server {self.url} answered {response.status_code}: {response.text[:500]}")
        data = response.json()
        chunk, finish, _ = self._parse_event(data, request.sampling.top_logprobs)
        assert chunk is not None
        chunk.routed_experts = decode_routes(data["choices"][0].get("routed_experts"), len(chunk))
        chunk.finish_reason = finish or "stop"
        yield chunk

    async def abort(self, request_id: str) -> bool:
        if request_id not in self._running:
            return False
        self._aborted.add(request_id)
        response = self._running.get(request_id)
        if response is not None:
            await response.aclose()  # vLLM aborts a request whose client went away
        return True

    # --- control --------------------------------------------------------------------

    async def _post(self, path: str, **kwargs: Any) -> Any:
        try:
            response = await self.client.post(path, **kwargs)
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"vLLM server {self.url}: {path} failed: {e}") from e
        if response.status_code == 404:
            raise EngineUnavailable(
                f"vLLM server {self.url} has no {path}; start it with VLLM_SERVER_DEV_MODE=1 (RL endpoints)"
            )
        if response.status_code >= 400:
            raise EngineFailed(f"vLLM server {self.url}: {path} answered {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    async def pause(self, timeout_s: float) -> int:
        self._paused = True
        await self._post("/pause", params={"mode": "keep"}, timeout=max(timeout_s, 1.0) + 30)
        return len(self._running)

    async def resume(self) -> int:
        held = len(self._running) if self._paused else 0
        await self._post("/resume")
        self._paused = False
        self._stamp_version = self.version
        return held

    async def load_weights(self, version: int, checkpoint_path: str, options: Mapping[str, str]) -> None:
        transfer = options.get("transfer", "reload")
        if transfer == "reload":
            if not checkpoint_path:
                raise InvalidArgument("checkpoint_path is required to reload vLLM weights")
            body = {"method": "reload_weights", "kwargs": {"weights_path": checkpoint_path}}
            await self._post("/collective_rpc", json=body, timeout=self.settings.vllm_timeout_s)
        elif transfer == "weight_transfer":
            try:
                update_info = json.loads(options["update_info"])
                init_info = json.loads(options["init_info"]) if "init_info" in options else None
            except (KeyError, json.JSONDecodeError) as e:
                raise InvalidArgument(
                    f"transfer=weight_transfer needs JSON options update_info[/init_info]: {e}"
                ) from e
            if init_info is not None:
                await self._post("/init_weight_transfer_engine", json={"init_info": init_info})
            await self._post("/start_weight_update")
            await self._post("/update_weights", json={"update_info": update_info}, timeout=self.settings.vllm_timeout_s)
            await self._post("/finish_weight_update", json={"weight_version": str(version)})
        else:
            raise InvalidArgument(f"unknown weight transfer {transfer!r}; valid: 'reload', 'weight_transfer'")
        await self._post("/reset_prefix_cache")
        await self._post("/update_weight_version", json={"new_version": str(version)})
        self.version = version
        if not self._paused:
            self._stamp_version = version


class _NoTokenEndpoint(Exception):
    """The replica does not serve vllm_tokens.PATH (raised before any token)."""


def merge_chunks(chunks: list[Chunk]) -> list[Chunk]:
    """Chunks that arrived in one network read, as one chunk: one gRPC message for the
    proxy instead of one per token, with no wait added (what arrived together was ready
    together). Ids, logprobs and versions are concatenated in order, unchanged; chunks
    with top logprobs on only some of them stay apart, so each row keeps its token."""
    if len(chunks) <= 1:
        return chunks
    tops = [c.top_ids is not None and c.top_logprobs is not None for c in chunks]
    if any(tops) and not all(tops):
        return chunks
    merged = Chunk(
        np.concatenate([c.ids for c in chunks]),
        np.concatenate([c.logprobs for c in chunks]),
        np.concatenate([c.versions for c in chunks]),
    )
    if all(tops):
        merged.top_ids = np.concatenate([c.top_ids for c in chunks if c.top_ids is not None])
        merged.top_logprobs = np.concatenate([c.top_logprobs for c in chunks if c.top_logprobs is not None])
    return [merged]


def _with_finish(tail: list[Chunk], finish: str, cached: int) -> list[Chunk]:
    """A reply's last chunks with its finish reason and cached count on the last one: one
    message fewer per reply than an empty finish chunk after them (each message wakes the
    gateway's and the proxy's gRPC threads and loops)."""
    out = merge_chunks(tail) or [Chunk.empty()]
    out[-1].finish_reason, out[-1].cached_prompt_tokens = finish, cached
    return out
