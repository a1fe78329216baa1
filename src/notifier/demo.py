"""``python -m notifier.demo``: run notifier with a local webhook sink and deliver one event.

Creates the configured database if it is missing, applies the schema, creates the tenant
``demo`` (or, when an earlier run made it, gives it a new key and removes its channels), starts
the service and a sink on 127.0.0.1, subscribes the sink, posts an event and shows what
the sink received and what the API says about the delivery. Without ``--exit`` the service keeps
running (Ctrl-C stops it gracefully).
"""

from __future__ import annotations

import argparse
import functools
import json
import secrets
import sys

import asyncpg
import httpx
import trio

from notifier import service
from notifier.bridge import aio, open_bridge
from notifier.config import Config, load_config
from notifier.ingest.tenants import hash_api_key
from notifier.lifecycle import Stop
from notifier.logs import setup_fallback_logging, setup_logging
from notifier.store import open_store
from notifier.store.errors import TenantExists
from notifier.testing import WebhookSink, open_sink


async def ensure_database(url: str) -> None:
    """Trio-flavoured. Create the database named in ``url`` when it does not exist."""
    base, _, name = url.rpartition("/")
    name = name.split("?")[0]

    async def create() -> None:
        conn = await asyncpg.connect(f"{base}/postgres")
        try:
            if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                await conn.execute(f'CREATE DATABASE "{name}"')
                print(f"created database {name}")
        finally:
            await conn.close()

    await aio(create)


DEMO_TENANT = "demo"


async def remove_channels(api: httpx.AsyncClient) -> None:
    """The channels an earlier run left (their sinks are gone): a new event must not go there."""
    while items := (await api.get("/v1/channels")).raise_for_status().json()["items"]:
        for channel in items:
            (await api.delete(f"/v1/channels/{channel['id']}")).raise_for_status()


def show(title: str, data: object) -> None:
    print(f"\n== {title}\n{json.dumps(data, indent=2)}", flush=True)


async def demo(config: Config, exit_after: bool) -> None:
    async with open_bridge():
        await ensure_database(config.database.url)
        api_key = "nk_demo_" + secrets.token_urlsafe(24)
        async with open_store(config.database.url, max_size=2) as store:
            await store.migrate()
            # One tenant for every run: its key is not kept in clear, so a run gives it a new one.
            try:
                await store.create_tenant(DEMO_TENANT, hash_api_key(api_key))
            except TenantExists:
                await store.rotate_tenant_key(DEMO_TENANT, hash_api_key(api_key))
                await store.set_tenant_enabled(DEMO_TENANT, True)
        stop = Stop()
        async with open_sink() as sink, trio.open_nursery() as nursery:
            binds = await nursery.start(functools.partial(service.run, config, stop=stop))
            base = binds[0]
            headers = {"Authorization": f"Bearer {api_key}"}
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as api:
                await remove_channels(api)
                channel = await api.post(
                    "/v1/channels",
                    json={"type": "webhook", "name": "demo sink", "config": {"url": sink.url},
                          "event_types": ["order.*"]},
                )  # fmt: skip
                channel.raise_for_status()
                show("POST /v1/channels → 201 (the secret is shown only now)", channel.json())
                event = await api.post(
                    "/v1/events", json={"type": "order.created", "payload": {"order_id": 42}}
                )
                event.raise_for_status()
                show("POST /v1/events → 202", event.json())
                with trio.fail_after(30):
                    (got,) = await sink.wait_for(1)
                    delivery_id = event.json()["deliveries"][0]["id"]
                    while True:
                        delivery = (await api.get(f"/v1/deliveries/{delivery_id}")).json()
                        if delivery["status"] == "DELIVERED":
                            break
                        await trio.sleep(0.05)
                show("the sink received", {"headers": got.headers, "body": got.json()})
                show(f"GET /v1/deliveries/{delivery_id}", delivery)
            if exit_after:
                stop.set()
            else:
                print(
                    f"\nnotifier is running on {base} (Ctrl-C stops it). Try:\n"
                    f"  curl -s -X POST {base}/v1/events -H 'Authorization: Bearer {api_key}' "
                    "-H 'Content-Type: application/json' "
                    """-d '{"type": "order.paid", "payload": {"order_id": 43}}'""",
                    flush=True,
                )
            nursery.start_soon(_echo_sink, sink, stop)
            # service.run returns once stopped (Ctrl-C / SIGTERM, or --exit); so does the echo


async def _echo_sink(sink: WebhookSink, stop: Stop) -> None:
    seen = len(sink.received)
    with stop.intake():
        while True:
            await sink.wait_for(seen + 1)
            for got in sink.received[seen:]:
                webhook_id = got.headers.get("webhook-id")
                print(f"sink received {webhook_id}: {got.body.decode()}", flush=True)
            seen = len(sink.received)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m notifier.demo", description=__doc__)
    parser.add_argument("--config", metavar="FILE")
    parser.add_argument("--exit", action="store_true", help="stop once the demo event arrived")
    args = parser.parse_args()
    setup_fallback_logging()
    config = load_config(args.config)
    setup_logging(config.logging)
    try:
        trio.run(demo, config, args.exit)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
