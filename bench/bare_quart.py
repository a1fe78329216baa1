"""The ingest probe's baseline: a quart-trio app on hypercorn that only reads the JSON body and
answers 202 — what the framework alone costs per request.

    python bench/bare_quart.py HOST:PORT
"""

from __future__ import annotations

import sys

import msgspec
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import Response, request
from quart_trio import QuartTrio

app = QuartTrio("bare")


@app.post("/v1/events")
async def post_event() -> Response:
    msgspec.json.decode(await request.get_data(cache=False))
    return Response(b'{"ok":true}', status=202, content_type="application/json")


def main() -> None:
    config = Config()
    config.bind = [sys.argv[1]]
    config.accesslog = None
    trio.run(serve, app, config)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
