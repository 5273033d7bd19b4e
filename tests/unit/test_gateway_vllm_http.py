"""The vLLM engine's lean HTTP/1.1 client (``vllm_http``), against real servers on
127.0.0.1: a kept-alive connection is reused, one the server closed meanwhile is
redialled, an error status comes back with its body, a response closed mid-stream
ends its reader and its connection, sized and chunked bodies both read whole."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
import pytest

from services.gateway.engines.vllm_http import HttpError, HttpPool, HttpStatus

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    start = await reader.readline()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
    return start, headers, body


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/prefix"


def test_a_kept_alive_connection_is_reused_and_the_request_is_sent_whole() -> None:
    seen: list[tuple[bytes, dict[bytes, bytes], bytes]] = []
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while not reader.at_eof():
            try:
                seen.append(await read_request(reader))
            except asyncio.IncompleteReadError:
                break
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            writer.write(head + chunked(b"data: 1\n", b"\ndata: [DONE]\n\n"))
            await writer.drain()
        writer.close()

    async def main() -> list[bytes]:
        server, url = await serve(handle)
        pool = HttpPool(url, {"Authorization": "Bearer k"}, 5)
        try:
            bodies = []
            for i in range(3):
                response = await pool.stream_post("/v1/completions", {"n": i})
                bodies.append(b"".join([p async for p in response.aiter_bytes()]))
            return bodies
        finally:
            pool.close()
            server.close()

    bodies = asyncio.run(main())
    assert bodies == [b"data: 1\n\ndata: [DONE]\n\n"] * 3
    assert connections == 1
    start, headers, body = seen[2]
    assert start == b"POST /prefix/v1/completions HTTP/1.1\r\n" and orjson.loads(body) == {"n": 2}
    assert headers[b"authorization"] == b"Bearer k" and headers[b"content-type"] == b"application/json"


def test_a_connection_the_server_closed_is_redialled_once() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # kept alive, then closed idle
        await writer.drain()
        writer.close()

    async def main() -> list[bytes]:
        server, url = await serve(handle)
        pool = HttpPool(url, {}, 5)
        try:
            out = []
            for _ in range(2):
                response = await pool.stream_post("/x", {})
                out.append(await response.aread())
                await asyncio.sleep(0.05)  # the server's close reaches the idle connection
            return out
        finally:
            pool.close()
            server.close()

    assert asyncio.run(main()) == [b"ok", b"ok"]
    assert connections == 2


def test_an_error_status_comes_back_with_its_body() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = b'{"error": {"message": "maximum model length is 2048"}}'
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    async def main() -> None:
        server, url = await serve(handle)
        pool = HttpPool(url, {}, 5)
        try:
            await pool.stream_post("/v1/completions", {})
        finally:
            pool.close()
            server.close()

    with pytest.raises(HttpStatus) as info:
        asyncio.run(main())
    assert info.value.status == 400 and "maximum model length" in info.value.text


def test_closing_a_response_mid_stream_ends_its_reader_and_drops_the_connection() -> None:
    gone = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await reader.read()  # EOF: the client went away (vLLM aborts the request here)
        gone.set()
        writer.close()

    async def main() -> tuple[list[bytes], str]:
        server, url = await serve(handle)
        pool = HttpPool(url, {}, 5)
        got: list[bytes] = []
        try:
            response = await pool.stream_post("/v1/completions", {})

            async def read() -> None:
                async for piece in response.aiter_bytes():
                    got.append(piece)

            reading = asyncio.ensure_future(read())
            await asyncio.sleep(0.05)
            await response.aclose()
            with pytest.raises(HttpError) as info:
                await reading
            await asyncio.wait_for(gone.wait(), 5)
            return got, str(info.value)
        finally:
            pool.close()
            server.close()

    got, error = asyncio.run(main())
    assert got == [b"first"] and "closed" in error


def test_a_refused_connection_is_an_http_error() -> None:
    async def main() -> None:
        server, url = await serve(lambda r, w: asyncio.sleep(0))
        server.close()
        await server.wait_closed()
        await HttpPool(url, {}, 5).stream_post("/v1/completions", {})

    with pytest.raises(HttpError):
        asyncio.run(main())


def test_a_server_that_goes_silent_mid_stream_times_out() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(5)
        writer.close()

    async def main() -> list[bytes]:
        server, url = await serve(handle)
        pool = HttpPool(url, {}, 0.2)
        got: list[bytes] = []
        try:
            response = await pool.stream_post("/v1/completions", {})
            async with asyncio.timeout(2):  # one to two periods of the 0.2 s timeout
                async for piece in response.aiter_bytes():
                    got.append(piece)
        finally:
            pool.close()
            server.close()
        return got

    with pytest.raises(HttpError, match=r"no data from the server in 0\.2 s"):
        asyncio.run(main())
