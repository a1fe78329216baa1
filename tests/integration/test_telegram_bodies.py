"""The Telegram adapter against a real socket whose answer never ends: it reads the answer
only to its limit through the shared bounded body reader (``adapters.http.BoundedTransport``),
closes the connection, and leaves no async generator half-way (trio would report it with a
``ResourceWarning``, which this suite turns into a failure). The reader's own tests, over a
fake network backend, are in ``tests/unit/test_bounded_body.py``.
"""

from __future__ import annotations

import gc
from functools import partial

import pytest
import trio

from notifier.adapters.telegram import TelegramAdapter
from notifier.errors import RetriableError
from notifier.testing import worker_message

TOKEN = "987654321:AAF-integration_token_never_logged"


ENDLESS_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: 1000000000\r\n\r\n" + b'{"ok": true, "result": "'
)


async def endless_bot_api(hung_up: trio.Event, stream: trio.SocketStream) -> None:
    """Answers a request with a 200 whose body never ends; sets ``hung_up`` when the client
    closes the connection."""
    request = b""
    while b"\r\n\r\n" not in request:
        request += await stream.receive_some()
    try:
        await stream.send_all(ENDLESS_HEAD)
        while True:
            await stream.send_all(b"x" * 16384)
    except trio.BrokenResourceError:
        hung_up.set()


async def test_an_endless_answer_is_read_only_to_the_limit_and_the_connection_closed() -> None:
    hung_up = trio.Event()
    async with trio.open_nursery() as nursery:
        serve = partial(trio.serve_tcp, partial(endless_bot_api, hung_up), 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        port = listeners[0].socket.getsockname()[1]
        adapter = TelegramAdapter(TOKEN, api_base_url=f"http://127.0.0.1:{port}")
        message = worker_message(channel_type="telegram", channel_config={"chat_id": 4242})
        try:
            with trio.fail_after(10), pytest.raises(RetriableError) as info:
                await adapter.deliver(message)
            # A 200 whose body was cut at the limit is not a Bot API success (not JSON).
            assert str(info.value).startswith('HTTP 200: {"ok": true, "result": "xxx')
            assert str(info.value).endswith("(not a Bot API success)")
            with trio.fail_after(10):
                await hung_up.wait()
            # An async generator left half-way is finalised by trio with a ResourceWarning,
            # which this suite turns into a failure: collect now so that it shows here.
            gc.collect()
        finally:
            await adapter.aclose()
            nursery.cancel_scope.cancel()
