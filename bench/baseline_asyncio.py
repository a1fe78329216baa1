"""The delivery baseline: a plain asyncio process doing the delivery stage's work, to compare
notifier's workers with.

Per message, as notifier's ``--role workers`` does: consume from ``deliveries.webhook`` (aiormq,
prefetch 64), decode the message (notifier's ``WorkerMessage``), look the delivery's state up
(batched: one ``delivery_states`` statement for the lookups waiting together), skip it if it
was already attempted, POST it signed with Standard Webhooks (notifier's own signing functions)
over HTTP/1.1 keep-alive (``--http``: httpx, a minimal h11 client or aiohttp; see
bench/baseline_clients.py), read the answer (bounded), record the attempt (batched: notifier's
own ``attempt_record_batch`` statement, which moves the delivery and writes its attempt row),
and only then acknowledge (``ack(multiple=True)`` up to the highest tag below which everything
is settled).

``--loop`` picks the event loop: asyncio's default, or uvloop's. The fastest common Python
stack for this work is ``--loop uvloop --http aiohttp``.

It leaves out what notifier does beyond the happy path (retry publishing, SSRF pinning,
timeouts per attempt, metrics, logs); the sink answers 200, so notifier takes no other path.

    python -m bench.baseline_asyncio --pg DSN --amqp URL [--loop asyncio|uvloop]
        [--http httpx|h11|aiohttp] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiormq
import asyncpg
import uvloop

import notifier
from bench.baseline_clients import ERRORS, KINDS, Client, close_clients, open_clients
from notifier.adapters.webhook.signing import build_request, signing_secrets
from notifier.messages import WorkerMessage, decode_message

# notifier's own statements, read from its query file: importing notifier.store would install
# trio-asyncio's event loop policy, and this process must run on plain asyncio.
QUERIES = Path(notifier.__file__).parent / "store" / "queries_attempts.sql"
EXCERPT = 2048
LOOPS = ("asyncio", "uvloop")
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


def load_queries() -> dict[str, str]:
    """The named blocks (``-- name: NAME``) of notifier's queries_attempts.sql."""
    blocks = re.split(r"^-- name: *(\S+) *$", QUERIES.read_text(), flags=re.M)
    return {name: sql.strip() for name, sql in zip(blocks[1::2], blocks[2::2], strict=True)}


async def run(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    if loop_family(loop) != args.loop:
        raise SystemExit(f"not {args.loop}'s loop: {type(loop)}")
    Q = load_queries()
    pool = await asyncpg.create_pool(args.pg, min_size=2, max_size=4)
    amqp = await aiormq.connect(args.amqp)
    channel = await amqp.channel()
    await channel.basic_qos(prefetch_count=args.prefetch)
    acks = Acks(channel)
    inbox: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()

    # Each delivery with its created_at (its message's): the statements read the partitions of
    # the days from the batch's first to its last, as notifier's store does.
    async def states(keys: list[tuple[uuid.UUID, datetime]]) -> list[asyncpg.Record | None]:
        ids, created = [k[0] for k in keys], [k[1] for k in keys]
        rows = await pool.fetch(Q["delivery_states"], ids, min(created), max(created))
        found = {r["id"]: r for r in rows}
        return [found.get(i) for i in ids]

    async def record(recs: list[tuple[Any, ...]]) -> list[bool]:
        columns = [list(c) for c in zip(*(r[:-1] for r in recs), strict=True)]
        created = [r[-1] for r in recs]
        rows = await pool.fetch(
            Q["attempt_record_batch"], *columns, 0.0, min(created), max(created)
        )
        moved = {r["delivery_id"]: r["moved"] for r in rows}
        return [bool(moved.get(r[0])) for r in recs]

    state_of, record_attempt = Batch(states), Batch(record)
    clients = open_clients(args.http, args.concurrency)

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        tag = message.delivery_tag
        assert tag is not None
        acks.received(tag)
        inbox.put_nowait((tag, message.body))

    async def deliver(
        client: Client, message: WorkerMessage
    ) -> tuple[str, int | None, str | None, str | None]:
        cfg = message.channel_config
        now = time.time()
        headers, body = build_request(
            message, signing_secrets(cfg, now), cfg.get("headers") or {}, int(now)
        )
        try:
            status, data = await client.post(cfg["url"], headers, body)
        except ERRORS as exc:
            return "retry", None, repr(exc), None
        excerpt = data[:EXCERPT].decode("utf-8", "ignore") or None
        if 200 <= status < 300:
            return "delivered", status, None, excerpt
        return "retry", status, f"HTTP {status}", excerpt

    async def worker(client: Client) -> None:
        while True:
            tag, raw = await inbox.get()
            message = decode_message(raw)
            state = await state_of((message.delivery_id, message.created_at))
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
                    message.created_at,
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
    await close_clients(clients)
    await amqp.close()
    await pool.close()


def loop_family(loop: asyncio.AbstractEventLoop) -> str:
    """``asyncio`` or ``uvloop``: the package the running loop's class comes from."""
    return type(loop).__module__.split(".")[0]


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop ``--loop`` names (None: asyncio's default)."""
    return uvloop.new_event_loop if name == "uvloop" else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", required=True)
    parser.add_argument("--amqp", required=True)
    parser.add_argument("--queue", default="deliveries.webhook")
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument("--http", choices=KINDS, default="httpx")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prefetch", type=int, default=64)
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        runner.run(run(args))


if __name__ == "__main__":
    main()
