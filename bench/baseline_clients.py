"""The delivery baseline's webhook clients (bench/baseline_asyncio.py), asyncio-flavoured, each
behind one ``post(url, headers, body) -> (status, answer)`` that reads the answer bounded.

- ``httpx``: one ``httpx.AsyncClient`` per worker task (anyio's asyncio backend): a shared
  client's pool scans its connections on every request, which costs more than the POST itself
  at 16 tasks.
- ``h11``: a minimal keep-alive client of h11 over asyncio streams, one connection per worker
  task: the floor of the HTTP work.
- ``aiohttp``: one ``aiohttp.ClientSession`` shared by every worker task, as aiohttp is meant to
  be used, its connector holding at most one connection per task; no cookie jar (a webhook
  keeps no cookies, and notifier keeps none).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp
import h11
import httpx

READ_LIMIT = 64 * 1024
TIMEOUT_SECONDS = 10.0
KINDS = ("httpx", "h11", "aiohttp")
# what a failed exchange raises, whichever the client: the attempt is then a retry
ERRORS = (httpx.HTTPError, h11.ProtocolError, aiohttp.ClientError, OSError, TimeoutError)


class Client(Protocol):
    async def post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]: ...

    async def aclose(self) -> None: ...


async def read_bounded(chunks: AsyncIterable[bytes], limit: int = READ_LIMIT) -> bytes:
    """The answer's first chunks, until ``limit`` bytes or more are in (the rest is left
    unread: a client then drops the connection rather than reuse it)."""
    data = b""
    async for chunk in chunks:
        data += chunk
        if len(data) >= limit:
            break
    return data


class HttpxClient:
    def __init__(self) -> None:
        self._client = httpx.AsyncClient(timeout=TIMEOUT_SECONDS)

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        async with self._client.stream("POST", url, content=body, headers=headers) as resp:
            return resp.status_code, await read_bounded(resp.aiter_raw())

    async def aclose(self) -> None:
        await self._client.aclose()


class AiohttpClient:
    def __init__(self, connections: int) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        async with self._session.post(url, data=body, headers=headers) as resp:
            return resp.status, await read_bounded(resp.content.iter_any())

    async def aclose(self) -> None:
        await self._session.close()


class H11Client:
    """One keep-alive HTTP/1.1 connection (h11 over asyncio streams), opened again when the
    server closes it or an exchange fails."""

    def __init__(self) -> None:
        self._conn: h11.Connection | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        parts = urlsplit(url)  # per attempt, as an HTTP client parses the URL of each request
        try:
            async with asyncio.timeout(TIMEOUT_SECONDS):
                return await self._exchange(
                    parts.hostname or "", parts.port or 80, parts.netloc, parts.path or "/",
                    headers, body,
                )  # fmt: skip
        except BaseException:
            self.close()
            raise

    async def _exchange(
        self, host: str, port: int, netloc: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes]:
        if self._conn is None or self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(host, port)
            self._conn = h11.Connection(h11.CLIENT)
        conn, reader, writer = self._conn, self._reader, self._writer
        fields = [("host", netloc), ("content-length", str(len(body))), *headers.items()]
        out = conn.send(h11.Request(method="POST", target=path, headers=fields)) or b""
        out += conn.send(h11.Data(data=body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        writer.write(out)
        await writer.drain()
        status, data = 0, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                if len(data) < READ_LIMIT:
                    data += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the server closed the connection")
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            self.close()
        return status, data

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._conn = self._reader = self._writer = None

    async def aclose(self) -> None:
        self.close()


def open_clients(kind: str, tasks: int) -> list[Client]:
    """The client of each of ``tasks`` worker tasks (asyncio-flavoured: call it on the running
    loop). aiohttp's one session is the same object in every place."""
    if kind == "aiohttp":
        shared = AiohttpClient(tasks)
        return [shared] * tasks
    if kind == "h11":
        return [H11Client() for _ in range(tasks)]
    if kind == "httpx":
        return [HttpxClient() for _ in range(tasks)]
    raise ValueError(f"no such client: {kind}")


async def close_clients(clients: list[Client]) -> None:
    for client in {id(c): c for c in clients}.values():
        await client.aclose()
