"""A lean HTTP/1.1 client for the vLLM engine's streamed replies, and their SSE reader.

Every SSE event vLLM sends crosses this path (one per token with
``vllm_stream_interval = 1``), so its cost per network read is the gateway's cost per
event: httpx (h11, anyio, a timeout scope and exception
mapping per read) cost several times what is left here, asyncio's stream reader
with chunked decoding and line splitting over bytes. Connections are kept alive
in a small pool per replica; ``https`` replicas are dialled with the same
``ssl.SSLContext`` the engine's httpx client verifies with (``replica_verify``),
never unverified. Control calls and unstreamed replies stay on httpx.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from services.gateway.errors import EngineFailed

MAX_LINE = 1 << 20  # a header or chunk-size line longer than this is not HTTP from vLLM
IDLE_KEPT = 32  # idle connections kept per replica


class HttpError(Exception):
    """The connection failed or the response was not valid HTTP/1.1 (``str`` says which)."""


class HttpStatus(Exception):
    """The server answered with an error status; ``text`` is its body."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.status, self.text = status, text


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.reused = False

    def close(self) -> None:
        self.writer.close()


class Response:
    """A streamed response body; ``close`` drops the connection (vLLM aborts a
    request whose client went away), reading it to the end returns it to the pool.

    A read that waits ``timeout`` seconds without data fails the response: one timer
    per response checks each ``timeout`` whether data came (a timer per read costs
    more than the read), so a silent server is given up on after one to two periods."""

    def __init__(self, pool: HttpPool, conn: _Conn, length: int | None, keep: bool, timeout: float) -> None:
        self._pool, self._conn, self._length, self._keep, self._timeout = pool, conn, length, keep, timeout
        self._closed = False
        self._timed_out = False
        self._reads = 0
        self._seen = -1
        self._watch = asyncio.get_running_loop().call_later(timeout, self._check)

    def _check(self) -> None:
        if self._closed:
            return
        if self._reads == self._seen:  # no data since the last check
            self._timed_out = True
            self._conn.close()
            return
        self._seen = self._reads
        self._watch = asyncio.get_running_loop().call_later(self._timeout, self._check)

    async def _read(self, pending: Awaitable[bytes]) -> bytes:
        try:
            data = await pending
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise self._failed(e) from e
        self._reads += 1
        return data

    def _failed(self, e: BaseException | None) -> HttpError:
        if self._timed_out:
            return HttpError(f"no data from the server in {self._timeout:g} s")
        if self._closed:
            return HttpError("response closed")
        return HttpError(f"connection failed mid-response: {type(e).__name__}: {e}")

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it arrives, one piece per network read (chunked or sized)."""
        reader = self._conn.reader
        if self._length is not None:
            left = self._length
            while left > 0:
                data = await self._read(reader.read(min(left, 1 << 16)))
                if not data:
                    raise self._failed(ConnectionError("connection closed before the end of the response"))
                left -= len(data)
                yield data
        else:
            while True:
                size_line = await self._read(reader.readuntil(b"\r\n"))
                try:
                    size = int(size_line.split(b";", 1)[0], 16)
                except ValueError as e:
                    raise HttpError(f"bad chunk size line {size_line[:40]!r}") from e
                if size == 0:
                    while (await self._read(reader.readuntil(b"\r\n"))) != b"\r\n":
                        pass  # trailers
                    break
                data = await self._read(reader.readexactly(size + 2))
                yield data[:-2]
        self._done()

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self.aiter_bytes()])

    def _done(self) -> None:
        if not self._closed:
            self._closed = True
            self._watch.cancel()
            self._pool.release(self._conn, self._keep)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._watch.cancel()
            self._conn.close()


class HttpPool:
    """Streamed POSTs to one server (``base_url``: http or https, optional path prefix)."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        timeout_s: float,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self.ssl: ssl.SSLContext | None = None
        if url.scheme == "https":
            # True: the system's CAs (as httpx's verify=True), never unverified.
            self.ssl = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = self.port == (443 if self.ssl else 80)
        self._head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._host_header = host if default_port else f"{host}:{self.port}"
        self.timeout_s = timeout_s
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                    limit=MAX_LINE,
                )
        except TimeoutError as e:
            raise HttpError(f"connect timed out after {self.timeout_s:g} s") from e
        except (OSError, ssl.SSLError) as e:
            raise HttpError(str(e) or type(e).__name__) from e
        return _Conn(reader, writer)

    def release(self, conn: _Conn, keep: bool) -> None:
        if keep and len(self._idle) < IDLE_KEPT and not conn.reader.at_eof() and not conn.writer.is_closing():
            conn.reused = True
            self._idle.append(conn)
        else:
            conn.close()

    async def stream_post(self, path: str, body: object) -> Response:
        """POSTs ``body`` (JSON); returns the response once its head arrived. An error
        status raises ``HttpStatus`` with the body read; a broken connection ``HttpError``.
        A kept-alive connection the server closed meanwhile is redialled once (the
        request never reached it)."""
        payload = orjson.dumps(body)
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\n{self._head}"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode("latin-1")
        while True:
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                conn.writer.write(head + payload)
                status_line = await self._line(conn)
            except HttpError:
                conn.close()
                if conn.reused:
                    continue
                raise
            if not status_line:
                conn.close()
                if conn.reused:
                    continue
                raise HttpError("the server closed the connection without answering")
            return await self._response(conn, status_line)

    async def _line(self, conn: _Conn) -> bytes:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await conn.reader.readuntil(b"\r\n")
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                return b""
            raise HttpError("connection closed mid-header") from e
        except TimeoutError as e:
            raise HttpError(f"no answer from the server in {self.timeout_s:g} s") from e
        except (OSError, asyncio.LimitOverrunError, ssl.SSLError) as e:
            raise HttpError(str(e) or type(e).__name__) from e

    async def _response(self, conn: _Conn, status_line: bytes) -> Response:
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            conn.close()
            raise HttpError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
        status = int(parts[1])
        length: int | None = None
        chunked, keep = False, parts[0] == b"HTTP/1.1"
        while (line := await self._line(conn)) != b"\r\n":
            if not line:
                conn.close()
                raise HttpError("connection closed mid-header")
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"connection":
                keep = value != b"close"
        if not chunked and length is None:
            conn.close()  # a body that ends when the connection does: not what vLLM sends
            raise HttpError(f"HTTP {status} response with neither Content-Length nor chunked encoding")
        response = Response(self, conn, None if chunked else length, keep, self.timeout_s)
        if status >= 400:
            text = (await response.aread()).decode(errors="replace")
            raise HttpStatus(status, text)
        return response

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


async def sse_batches(body: AsyncIterator[bytes]) -> AsyncGenerator[list[dict[str, Any]], None]:
    """The stream's ``data:`` events, grouped by network read (per-token lines parsed as
    bytes with orjson: a text line decoder and json cost more per token). What follows
    ``[DONE]`` is read and ignored, so the connection can be reused."""
    tail = b""
    async for data in body:
        *lines, tail = (tail + data).split(b"\n")
        events, done = sse_parse(lines)
        if events:
            yield events
        if done:
            async for _ in body:
                pass
            return
    events, _ = sse_parse([tail])  # a last line without its newline
    if events:
        yield events


def sse_parse(lines: list[bytes]) -> tuple[list[dict[str, Any]], bool]:
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
