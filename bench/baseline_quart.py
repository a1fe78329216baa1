"""The ingest baseline: a quart-trio app on hypercorn (trio worker) that only reads the JSON body
of a POST and answers 202 — the framework's floor under notifier's ``POST /v1/events``. Loaded
by the same wrk script; no access log, as notifier's ingest has none.

    python bench/baseline_quart.py --bind 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import request
from quart_trio import QuartTrio

app = QuartTrio(__name__)


@app.post("/<path:path>")
async def accept(path: str) -> tuple[dict[str, object], int]:
    body = await request.get_json()
    return {"accepted": 1 if isinstance(body, dict) else 0}, 202


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True)
    config = Config()
    config.bind = [parser.parse_args().bind]
    config.accesslog = None
    trio.run(serve, app, config)


if __name__ == "__main__":
    main()
