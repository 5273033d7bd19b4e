"""The vLLM engine: one replica per vLLM OpenAI-compatible server.

Generation: ``POST /v1/completions`` with ``prompt`` as token ids,
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

Policy versions: a token carries the version current when it arrived. While
paused, arriving tokens were sampled before the pause, so they keep the old
version until Resume; pause before updating for exact per-token versions.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import orjson

from harnessrl import tls
from harnessrl.errors import ConfigError, InvalidArgument
from services.gateway import modelfiles
from services.gateway.engines.base import F32, I32, Chunk, Engine, EngineInfo, GenerateInput
from services.gateway.engines.vllm_http import HttpError, HttpPool, HttpStatus, Response
from services.gateway.errors import ContextLengthExceeded, EngineFailed, EngineUnavailable
from services.gateway.settings import Settings

log = logging.getLogger(__name__)

UNKNOWN_VOCAB = 2**31 - 1
FINISH = {"stop": "stop", "length": "length", "abort": "abort"}
VLLM_NEG_INF = -9999.0

# What every vLLM server behind this engine must be started with (the module docstring
# says why); docker-compose.yml's vLLM service is checked against these by a test.
REQUIRED_SERVER_FLAGS: tuple[tuple[str, str], ...] = (("--logprobs-mode", "processed_logprobs"),)
REQUIRED_SERVER_ENV: dict[str, str] = {"VLLM_SERVER_DEV_MODE": "1"}
# MoE policies only (routes for R3): the server must return them.
MOE_SERVER_FLAGS: tuple[str, ...] = ("--enable-return-routed-experts",)


def completion_body(model: str, request: GenerateInput, stream: bool) -> dict[str, Any]:
    s = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "prompt": request.prompt_ids.tolist(),
        "max_tokens": request.budget,
        "temperature": s.temperature,
        "top_p": s.top_p if 0 < s.top_p <= 1 else 1.0,
        "top_k": s.top_k if s.top_k > 0 else -1,
        "logprobs": max(1, s.top_logprobs),
        "return_token_ids": True,
        "stream": stream,
        "request_id": request.request_id,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if s.top_logprobs:
        body["return_tokens_as_token_ids"] = True
    if s.stop_token_ids:
        body["stop_token_ids"] = list(s.stop_token_ids)
    if s.seed:
        body["seed"] = s.seed % (2**63)
    if s.return_routed_experts:
        body["routed_experts_prompt_start"] = int(request.prompt_ids.shape[0])
    return body


def parse_top_logprobs(
    logprobs: dict[str, Any], n: int, k: int
) -> tuple[npt.NDArray[np.int32] | None, npt.NDArray[np.float32] | None]:
    """vLLM's ``top_logprobs`` (one ``{"token_id:N": logprob}`` per token, the sampled
    token among them) -> the k most likely ids and logprobs [n, k], -inf for excluded and padding;
    None when vLLM sent none for every token."""
    rows = logprobs.get("top_logprobs")
    if not isinstance(rows, list) or len(rows) != n:
        return None, None
    ids, values = np.zeros((n, k), I32), np.full((n, k), -np.inf, F32)
    for i, row in enumerate(rows):
        pairs = sorted(((float(v), key) for key, v in (row or {}).items() if key.startswith("token_id:")), reverse=True)
        for j, (value, key) in enumerate(pairs[:k]):
            # vLLM clamps -inf (a token the sampling filters exclude) to OpenAI's -9999.
            ids[i, j], values[i, j] = int(key[len("token_id:") :]), value if value > VLLM_NEG_INF else -np.inf
    return ids, values


def decode_routes(encoded: str | None, num_tokens: int) -> np.ndarray | None:
    """vLLM's base64 ``.npy`` routes [rows, layers, top_k] -> uint8 [num_tokens, layers, top_k].

    Rows start at the first reply token; the last sampled token was never fed
    forward, so it has no row and gets zeros."""
    if not encoded:
        return None
    routes = np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)
    if routes.ndim != 3:
        raise EngineFailed(f"vLLM returned routed experts of shape {routes.shape}, expected 3 dims")
    if routes.size and int(routes.max()) > 255:
        raise EngineFailed("vLLM returned expert indices above 255; they do not fit uint8")
    out = np.zeros((num_tokens, routes.shape[1], routes.shape[2]), np.uint8)
    rows = min(num_tokens, routes.shape[0])
    out[:rows] = routes[:rows]
    return out


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
        self._stamp_version = self.version
        self._paused = False
        self._context_window = settings.context_window or 0
        self._vocab = UNKNOWN_VOCAB
        self._client: httpx.AsyncClient | None = None  # health, models, control, unstreamed replies
        self._http: HttpPool | None = None  # streamed completions: one event per token (see vllm_http)
        self._tls: tls.TlsSettings | None = None  # how the client verifies an https replica (None: system CAs)
        self._running: dict[str, Response | None] = {}
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
        rid = request.request_id
        self._running[rid] = None
        body = completion_body(self.served_model, request, stream=True)
        started = False
        response: Response | None = None
        try:
            response = await self._http.stream_post("/v1/completions", body)
            if rid in self._aborted:  # aborted while the request was on its way
                raise HttpError("aborted")
            self._running[rid] = response
            finish, cached = "", 0
            async for events in _sse_batches(response.aiter_bytes()):
                parsed: list[Chunk] = []
                for event in events:
                    one, finish_now, cached_now = self._parse_event(event, request.sampling.top_logprobs)
                    finish, cached = finish or finish_now, cached or cached_now
                    if one is not None and len(one):
                        parsed.append(one)
                for chunk in merge_chunks(parsed):
                    started = True
                    yield chunk
            yield Chunk.empty(finish or "stop", cached)
        except HttpStatus as e:
            if e.status < 500:
                raise _client_error(e.status, e.text) from e
            raise EngineUnavailable(f"vLLM server {self.url} answered {e.status}: {e.text[:500]}") from e
        except HttpError as e:
            if rid in self._aborted:
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


async def _sse_batches(body: AsyncIterator[bytes]) -> AsyncGenerator[list[dict[str, Any]], None]:
    """The stream's ``data:`` events, grouped by network read (per-token lines parsed as
    bytes with orjson: a text line decoder and json cost more per token). What follows
    ``[DONE]`` is read and ignored, so the connection can be reused."""
    tail = b""
    async for data in body:
        *lines, tail = (tail + data).split(b"\n")
        events, done = _sse_parse(lines)
        if events:
            yield events
        if done:
            async for _ in body:
                pass
            return
    events, _ = _sse_parse([tail])  # a last line without its newline
    if events:
        yield events


def _sse_parse(lines: list[bytes]) -> tuple[list[dict[str, Any]], bool]:
    """The events of whole SSE lines, and whether ``[DONE]`` ended them."""
    events: list[dict[str, Any]] = []
    for line in lines:
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return events, True
        event = orjson.loads(payload)
        if "error" in event and "choices" not in event:
            raise EngineFailed(f"vLLM stream error: {event['error']}")
        events.append(event)
    return events, False
