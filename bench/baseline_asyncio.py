"""The delivery baseline: a plain asyncio process doing the delivery stage's work, to compare
notifier's workers with.

Per message, as notifier's ``--role workers`` does: consume from ``deliveries.webhook`` (aiormq,
prefetch 64), decode the message (notifier's ``WorkerMessage``), look the delivery's state up
(batched: one ``delivery_states`` statement for the lookups waiting together), skip it if it
was already attempted, POST it signed with Standard Webhooks (notifier's own signing functions)
over HTTP/1.1 keep-alive (``--http httpx``: one ``httpx.AsyncClient`` per worker task, on
anyio's asyncio backend; ``--http h11``: a minimal client of h11 over asyncio streams, one
connection per worker task), read the answer (bounded), record the
attempt (batched: notifier's own ``attempt_record_batch`` statement, which moves the delivery and
writes its attempt row), and only then acknowledge (``ack(multiple=True)`` up to the highest tag
below which everything is settled).

It leaves out what notifier does beyond the happy path (retry publishing, SSRF pinning,
timeouts per attempt, metrics, logs); the sink answers 200, so notifier takes no other path.

    python bench/baseline_asyncio.py --pg DSN --amqp URL [--http httpx|h11] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiormq
import asyncpg
import h11
import httpx

import notifier
from notifier.adapters.webhook.signing import build_request, signing_secrets
from notifier.messages import WorkerMessage, decode_message

# notifier's own statements, read from its query file: importing notifier.store would install
# trio-asyncio's event loop policy, and this process must run on plain asyncio.
QUERIES = Path(notifier.__file__).parent / "store" / "queries_attempts.sql"
READ_LIMIT = 64 * 1024
EXCERPT = 2048
MAX_BATCH = 256


class Batch:
    """Calls made while a statement runs wait for the next one, which takes them all."""

    def __init__(self, run: Any) -> None:
        self._run = run
        self._queue: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] = asyncio.Queue()

    async def __call__(self, item: Any) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, fut))
        return await fut

    async def loop(self) -> None:
        while True:
            taken = [await self._queue.get()]
            while not self._queue.empty() and len(taken) < MAX_BATCH:
                taken.append(self._queue.get_nowait())
            try:
                results = await self._run([item for item, _ in taken])
            except Exception as exc:
                for _, fut in taken:
                    fut.set_exception(exc)
                continue
            for (_, fut), result in zip(taken, results, strict=True):
                fut.set_result(result)


class Acks:
    """Settled delivery tags, acknowledged as the longest settled prefix."""

    def __init__(self, channel: aiormq.abc.AbstractChannel) -> None:
        self._ch = channel
        self._pending: dict[int, bool] = {}
        self._dirty = asyncio.Event()

    def received(self, tag: int) -> None:
        self._pending[tag] = False

    def settle(self, tag: int) -> None:
        self._pending[tag] = True
        self._dirty.set()

    async def loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            last = None
            for tag, done in list(self._pending.items()):
                if not done:
                    break
                del self._pending[tag]
                last = tag
            if last is not None:
                await self._ch.basic_ack(last, multiple=True)


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
            async with asyncio.timeout(10.0):
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


def load_queries() -> dict[str, str]:
    """The named blocks (``-- name: NAME``) of notifier's queries_attempts.sql."""
    blocks = re.split(r"^-- name: *(\S+) *$", QUERIES.read_text(), flags=re.M)
    return {name: sql.strip() for name, sql in zip(blocks[1::2], blocks[2::2], strict=True)}


async def run(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    if type(loop).__module__.split(".")[0] != "asyncio":
        raise SystemExit(f"not a plain asyncio loop: {type(loop)}")
    Q = load_queries()
    pool = await asyncpg.create_pool(args.pg, min_size=2, max_size=4)
    amqp = await aiormq.connect(args.amqp)
    channel = await amqp.channel()
    await channel.basic_qos(prefetch_count=args.prefetch)
    acks = Acks(channel)
    inbox: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()

    async def states(ids: list[uuid.UUID]) -> list[asyncpg.Record | None]:
        rows = await pool.fetch(Q["delivery_states"], ids)
        found = {r["id"]: r for r in rows}
        return [found.get(i) for i in ids]

    async def record(recs: list[tuple[Any, ...]]) -> list[bool]:
        columns = [list(c) for c in zip(*recs, strict=True)]
        rows = await pool.fetch(Q["attempt_record_batch"], *columns, 0.0)
        moved = {r["delivery_id"]: r["moved"] for r in rows}
        return [bool(moved.get(r[0])) for r in recs]

    state_of, record_attempt = Batch(states), Batch(record)
    # One client (one keep-alive connection) per worker task: a shared httpx client's pool
    # scans its connections on every request, which costs more than the POST itself at 16 tasks.
    clients: list[httpx.AsyncClient | H11Client] = [
        H11Client() if args.http == "h11" else httpx.AsyncClient(timeout=10.0)
        for _ in range(args.concurrency)
    ]

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        tag = message.delivery_tag
        assert tag is not None
        acks.received(tag)
        inbox.put_nowait((tag, message.body))

    async def deliver(
        client: httpx.AsyncClient | H11Client, message: WorkerMessage
    ) -> tuple[str, int | None, str | None, str | None]:
        cfg = message.channel_config
        now = time.time()
        headers, body = build_request(
            message, signing_secrets(cfg, now), cfg.get("headers") or {}, int(now)
        )
        try:
            if isinstance(client, H11Client):
                status, data = await client.post(cfg["url"], headers, body)
            else:
                async with client.stream("POST", cfg["url"], content=body, headers=headers) as resp:
                    data = b""
                    async for chunk in resp.aiter_raw():
                        data += chunk
                        if len(data) >= READ_LIMIT:
                            break
                status = resp.status_code
        except (httpx.HTTPError, h11.ProtocolError, OSError, TimeoutError) as exc:
            return "retry", None, repr(exc), None
        excerpt = data[:EXCERPT].decode("utf-8", "ignore") or None
        if 200 <= status < 300:
            return "delivered", status, None, excerpt
        return "retry", status, f"HTTP {status}", excerpt

    async def worker(client: httpx.AsyncClient | H11Client) -> None:
        while True:
            tag, raw = await inbox.get()
            message = decode_message(raw)
            state = await state_of(message.delivery_id)
            if (
                state is not None
                and state["status"] not in ("DELIVERED", "DEAD")
                and (state["attempt"] < message.attempt)
            ):
                started = datetime.now(UTC)
                t0 = time.monotonic()
                outcome, code, error, excerpt = await deliver(client, message)
                status = "DELIVERED" if outcome == "delivered" else "RETRYING"
                await record_attempt((
                    message.delivery_id, message.attempt, status, outcome, started,
                    int((time.monotonic() - t0) * 1000), code, error, excerpt, None, False,
                ))  # fmt: skip
            acks.settle(tag)

    await channel.basic_consume(args.queue, on_message, no_ack=False)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    tasks = [asyncio.create_task(t) for t in (state_of.loop(), record_attempt.loop(), acks.loop())]
    tasks += [asyncio.create_task(worker(c)) for c in clients]
    print("baseline running", flush=True)
    await stop.wait()
    for t in tasks:
        t.cancel()
    for c in clients:
        if isinstance(c, H11Client):
            c.close()
        else:
            await c.aclose()
    await amqp.close()
    await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", required=True)
    parser.add_argument("--amqp", required=True)
    parser.add_argument("--queue", default="deliveries.webhook")
    parser.add_argument("--http", choices=("httpx", "h11"), default="httpx")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prefetch", type=int, default=64)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
