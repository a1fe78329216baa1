"""Local servers that stand in for receivers: a webhook sink on trio that records every
request, and Telegram's Bot API on it, with failures scripted per chat."""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import h11
import trio

# -- webhook sink -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # trio.current_time() when it arrived

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookSink:
    """Records requests; answers each with ``respond(received) -> (status, headers, body)``."""

    respond: Callable[[Received], tuple[int, dict[str, str], bytes]] = field(
        default=lambda _: (200, {}, b"ok")
    )
    received: list[Received] = field(default_factory=list)
    port: int = 0
    delay_seconds: float = 0.0  # how long each answer takes (to hold deliveries in flight)
    _changed: trio.Event = field(default_factory=trio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def wait_for(self, count: int) -> list[Received]:
        """Wait until at least ``count`` requests arrived (bound it with ``trio.fail_after``)."""
        while len(self.received) < count:
            await self._changed.wait()
        return self.received

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request: h11.Request | None = None
                body = b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        conn.receive_data(data)
                    elif isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert request is not None
                got = Received(
                    method=request.method.decode(),
                    path=request.target.decode(),
                    headers={k.decode().lower(): v.decode() for k, v in request.headers},
                    body=body,
                    at=trio.current_time(),
                )
                self.received.append(got)
                self._changed.set()
                self._changed = trio.Event()
                if self.delay_seconds:
                    await trio.sleep(self.delay_seconds)
                status, headers, payload = self.respond(got)
                out = [(k, v) for k, v in headers.items()] + [("content-length", str(len(payload)))]
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=out)))
                await stream.send_all(conn.send(h11.Data(data=payload)) or b"")
                await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            return
        finally:
            await stream.aclose()


@asynccontextmanager
async def open_sink(
    respond: Callable[[Received], tuple[int, dict[str, str], bytes]] | None = None,
    *,
    port: int = 0,
    delay_seconds: float = 0.0,
) -> AsyncIterator[WebhookSink]:
    sink = WebhookSink(port=port, delay_seconds=delay_seconds)
    if respond is not None:
        sink.respond = respond
    async with trio.open_nursery() as nursery:
        await nursery.start(sink.serve)
        yield sink
        nursery.cancel_scope.cancel()


# -- fake Telegram Bot API ----------------------------------------------------------------------


@dataclass(frozen=True)
class BotApiReply:
    """A scripted Bot API failure: the HTTP status and the ``ok: false`` answer's fields."""

    status: int
    description: str
    retry_after: int | None = None

    @classmethod
    def too_many_requests(cls, retry_after: int) -> BotApiReply:
        return cls(429, f"Too Many Requests: retry after {retry_after}", retry_after)


CHAT_NOT_FOUND = BotApiReply(400, "Bad Request: chat not found")
BOT_BLOCKED = BotApiReply(403, "Forbidden: bot was blocked by the user")
SERVER_ERROR = BotApiReply(500, "Internal Server Error")


@dataclass(frozen=True)
class BotApiCall:
    """One request to the fake, with what it answered."""

    token: str  # from the path: /bot<token>/<method>
    method: str
    chat_id: int | str | None
    text: str | None
    at: float  # trio.current_time() when it arrived
    status: int


class FakeBotApi:
    """The ``sendMessage`` method of the Telegram Bot API, recording every call.

    Each chat answers ``200 {"ok": true, ...}`` unless scripted otherwise with ``script``.
    With ``token`` set, calls with another token answer ``401 Unauthorized``, as Telegram does.
    Use it through ``open_fake_bot_api``; ``url`` is the adapter's ``api_base_url``.
    """

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.calls: list[BotApiCall] = []
        self.sink: WebhookSink | None = None
        self._script: dict[str, deque[BotApiReply]] = defaultdict(deque)
        self._always: dict[str, BotApiReply] = {}
        self._changed = trio.Event()
        self._message_ids = 0

    @property
    def url(self) -> str:
        assert self.sink is not None, "use open_fake_bot_api"
        return f"http://127.0.0.1:{self.sink.port}"

    def script(
        self, chat_id: int | str, reply: BotApiReply, *, times: int | None = 1
    ) -> FakeBotApi:
        """Answer ``sendMessage`` to ``chat_id`` with ``reply`` the next ``times`` times (after
        what is already scripted), or from now on for ever with ``times=None``."""
        if times is None:
            self._always[str(chat_id)] = reply
        else:
            self._script[str(chat_id)].extend([reply] * times)
        return self

    def sent(self, chat_id: int | str | None = None) -> list[BotApiCall]:
        """The messages the fake accepted (200), optionally only those to ``chat_id``."""
        return [
            c for c in self.calls
            if c.status == 200 and (chat_id is None or str(c.chat_id) == str(chat_id))
        ]  # fmt: skip

    async def wait_for(self, count: int) -> list[BotApiCall]:
        """Wait until at least ``count`` calls arrived (bound it with ``trio.fail_after``)."""
        while len(self.calls) < count:
            await self._changed.wait()
        return self.calls

    def respond(self, received: Received) -> tuple[int, dict[str, str], bytes]:
        parts = received.path.split("?", 1)[0].strip("/").split("/")
        token = parts[0].removeprefix("bot") if parts and parts[0].startswith("bot") else ""
        method = parts[1] if len(parts) == 2 else ""
        try:
            body = json.loads(received.body) if received.body else {}
        except ValueError:
            body = None
        fields = body if isinstance(body, dict) else {}
        chat_id, text = fields.get("chat_id"), fields.get("text")
        status, answer = self._answer(token, method, body, chat_id, text)
        self.calls.append(BotApiCall(token, method, chat_id, text, received.at, status))
        self._changed.set()
        self._changed = trio.Event()
        return status, {"content-type": "application/json"}, json.dumps(answer).encode()

    def _answer(
        self, token: str, method: str, body: Any, chat_id: Any, text: Any
    ) -> tuple[int, dict[str, Any]]:
        def error(reply: BotApiReply) -> tuple[int, dict[str, Any]]:
            answer: dict[str, Any] = {
                "ok": False, "error_code": reply.status, "description": reply.description,
            }  # fmt: skip
            if reply.retry_after is not None:
                answer["parameters"] = {"retry_after": reply.retry_after}
            return reply.status, answer

        if not token or (self.token is not None and token != self.token):
            return error(BotApiReply(401, "Unauthorized"))
        if method != "sendMessage":
            return error(BotApiReply(404, "Not Found"))
        if not isinstance(body, dict):
            return error(BotApiReply(400, "Bad Request: invalid JSON body"))
        if chat_id is None or chat_id == "":
            return error(BotApiReply(400, "Bad Request: chat_id is empty"))
        if not isinstance(text, str) or not text.strip():
            return error(BotApiReply(400, "Bad Request: message text is empty"))
        if len(text.encode("utf-16-le")) // 2 > 4096:
            return error(BotApiReply(400, "Bad Request: message is too long"))
        key = str(chat_id)
        if self._script.get(key):
            return error(self._script[key].popleft())
        if key in self._always:
            return error(self._always[key])
        self._message_ids += 1
        result = {"message_id": self._message_ids, "chat": {"id": chat_id}, "text": text}
        return 200, {"ok": True, "result": result}


@asynccontextmanager
async def open_fake_bot_api(
    token: str | None = None, *, port: int = 0
) -> AsyncIterator[FakeBotApi]:
    """Serve a ``FakeBotApi`` on 127.0.0.1 (an h11 server: ``WebhookSink``) while inside."""
    api = FakeBotApi(token)
    async with open_sink(api.respond, port=port) as sink:
        api.sink = sink
        yield api
