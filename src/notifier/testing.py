"""Fakes that ship with notifier, for its own tests and for anyone embedding it.

- ``WebhookSink``: a small HTTP server on trio that records every webhook it receives.
- ``FakeBotApi``: Telegram's ``sendMessage`` on a ``WebhookSink``, recording every call, with
  failures (429 with ``retry_after``, chat not found, bot blocked, 500) scripted per chat.
- ``MemoryOutbox``: an in-memory outbox with the relay's claim/finish/doorbell interface (a
  doorbell that can be lost, and LISTENs that fail on cue).
- ``MemoryBroker``: an in-memory publisher with RabbitMQ's routing, returns and nacks.
- ``fanout_targets``: the fan-out rule in Python, as the store's SQL implements it.
- ``MemoryDeliveries``: the worker's delivery store in memory, with the forward-only status rule.
- ``RecordingAdapter``: an adapter that records messages and succeeds, fails or stalls on cue;
  ``PacedAdapter`` adds a ``RateLimiter`` that lets one message through per interval.
- ``RecordingReporter``: the Sentry reporter's interface, keeping what it was given.
- ``RecordingObserver``: the worker's outcome observer, keeping every outcome it is told.
- ``SettleRecorder``: where a consumed message is settled, keeping each settlement.

The HTTP API's store in memory is ``notifier.testing_api.MemoryApiStore``.

They implement the same interfaces the production classes do; nothing is monkeypatched.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import h11
import msgspec
import trio

from notifier.adapters.base import Receipt
from notifier.broker.base import Confirm, Outgoing, Settle
from notifier.broker.topology import Topology
from notifier.errors import BrokerError, StoreUnavailable
from notifier.messages import WorkerMessage
from notifier.store.rows import (
    TERMINAL_STATUSES,
    AttemptRecord,
    Channel,
    DeliveryState,
    OutboxRow,
)
from notifier.worker.observe import Outcome

# -- worker messages ----------------------------------------------------------------------------


def worker_message(n: int = 1, **changes: Any) -> WorkerMessage:
    """A ``WorkerMessage`` for tests: delivery ``UUID(int=n)``, fixed other ids and time, a
    webhook channel; ``changes`` replace any field."""
    fields: dict[str, Any] = {
        "delivery_id": uuid.UUID(int=n),
        "event_id": uuid.UUID(int=1000 + n),
        "tenant_id": uuid.UUID(int=7),
        "channel_id": uuid.UUID(int=8),
        "channel_type": "webhook",
        "channel_config": {"url": "https://example.com/hook"},
        "event_type": "order.created",
        "recipient": None,
        "payload": {"n": n},
        "created_at": datetime(2024, 1, 1, tzinfo=UTC),
        "attempt": 1,
        "max_attempts": 5,
    }
    fields.update(changes)
    return WorkerMessage(**fields)


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


# -- fan-out rule -------------------------------------------------------------------------------


def pattern_matches(pattern: str, event_type: str) -> bool:
    """``*`` matches everything, ``a.b.*`` matches ``a.b.<anything>``, else exact: the rule of
    the SQL function ``notifier_type_matches`` (schema.sql), which the store's queries use, for
    the in-memory fakes; a test puts the same cases to both."""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return event_type.startswith(pattern[:-1])
    return pattern == event_type


def fanout_targets(
    channels: Iterable[Channel],
    *,
    tenant_id: uuid.UUID,
    event_type: str,
    recipient: str | None,
    channel_ids: Sequence[uuid.UUID] | None = None,
) -> list[Channel]:
    """The channels an event goes to (docs/architecture.md §3): enabled channels of the tenant that
    are named in ``channel_ids``, or, without it, whose recipient equals the event's (both may be
    None) and one of whose patterns matches the event type."""
    out = []
    for c in channels:
        if c.tenant_id != tenant_id or not c.enabled:
            continue
        if channel_ids is not None:
            if c.id in channel_ids:
                out.append(c)
        elif c.recipient == recipient and any(
            pattern_matches(p, event_type) for p in c.event_types
        ):
            out.append(c)
    return out


# -- in-memory outbox ---------------------------------------------------------------------------


class MemoryDoorbell:
    def __init__(self) -> None:
        self._event = trio.Event()
        self.connected = True

    def ring(self) -> None:
        self._event.set()

    def lost(self) -> None:
        """Its LISTEN connection is gone: it says so (one last ring) and never rings again."""
        self.connected = False
        self._event.set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


class MemoryClaim:
    def __init__(self, outbox: MemoryOutbox, rows: list[OutboxRow]) -> None:
        self._outbox = outbox
        self.rows = rows
        self._sent: list[int] = []
        self._refused: dict[int, str] = {}

    async def finish(self, sent: Sequence[int], refused: dict[int, str]) -> None:
        await trio.lowlevel.checkpoint()
        self._sent, self._refused = list(sent), dict(refused)


class MemoryOutbox:
    """The outbox with its locking semantics: claimed rows are invisible to other claims until
    the claim ends; deletes and refusals take effect only if the claim ends without error."""

    def __init__(self) -> None:
        self.rows: dict[int, OutboxRow] = {}
        self.refused: dict[int, str] = {}  # row id -> last error
        self._locked: set[int] = set()
        self._next_id = 1
        self.bell = MemoryDoorbell()
        # LISTEN: when each open_doorbell was asked for (trio time), and how many of the next
        # ones fail as if Postgres were unreachable.
        self.listened_at: list[float] = []
        self.listen_failures = 0

    def add(
        self,
        delivery_id: uuid.UUID,
        routing_key: str,
        body: bytes,
        *,
        created_at: datetime | None = None,
    ) -> int:
        """Insert a row (written now, unless ``created_at`` says otherwise) and ring."""
        row_id = self._next_id
        self._next_id += 1
        written = created_at or datetime.now(UTC)
        self.rows[row_id] = OutboxRow(row_id, delivery_id, routing_key, body, written)
        if self.bell.connected:  # nobody hears the NOTIFY while the LISTEN connection is lost
            self.bell.ring()
        return row_id

    def lose_doorbell(self) -> None:
        """The LISTEN connection is lost (a terminated backend): the doorbell in use says so."""
        self.bell.lost()

    @asynccontextmanager
    async def claim_outbox(self, limit: int) -> AsyncIterator[MemoryClaim]:
        await trio.lowlevel.checkpoint()
        free = [r for i, r in sorted(self.rows.items()) if i not in self._locked]
        fresh = [r for r in free if r.id not in self.refused]
        again = [r for r in free if r.id in self.refused]  # no waiting in memory: due at once
        free = (fresh + again)[:limit]
        claim = MemoryClaim(self, free)
        self._locked.update(r.id for r in free)
        try:
            yield claim
            for row_id in claim._sent:
                self.rows.pop(row_id, None)
                self.refused.pop(row_id, None)
            self.refused.update(claim._refused)
        finally:
            self._locked.difference_update(r.id for r in free)

    @asynccontextmanager
    async def open_doorbell(self) -> AsyncIterator[MemoryDoorbell]:
        """LISTEN; a new doorbell once the previous one was lost."""
        await trio.lowlevel.checkpoint()
        self.listened_at.append(trio.current_time())
        if self.listen_failures > 0:
            self.listen_failures -= 1
            raise StoreUnavailable("memory outbox: LISTEN failed")
        if not self.bell.connected:
            self.bell = MemoryDoorbell()
        yield self.bell


# -- in-memory broker ---------------------------------------------------------------------------


class MemoryBroker:
    """Routes by (exchange, routing key) like a direct exchange. Unroutable messages come back
    ``RETURNED``; ``nack_next``/``drop_confirms`` simulate a refusing or silent broker;
    ``block()``/``unblock()`` a broker alarm (publishes go unconfirmed and land nowhere);
    ``delete_queue`` a queue deleted under its users, ``declare_topology`` the declaration that
    brings it back (``refuse_declares`` makes that fail)."""

    def __init__(self) -> None:
        self.bindings: dict[tuple[str, str], str] = {}
        self.queues: dict[str, list[Outgoing]] = defaultdict(list)
        self.published: list[Outgoing] = []
        self.nack_next = 0
        self.drop_confirms = False
        self.closed = False
        self.declared: list[Topology] = []  # every declare_topology call
        self.refuse_declares = False
        self._unblocked: trio.Event | None = None  # while blocked: set when the block lifts

    def block(self) -> None:
        if self._unblocked is None:
            self._unblocked = trio.Event()

    def unblock(self) -> None:
        if self._unblocked is not None:
            self._unblocked.set()
            self._unblocked = None

    def close(self) -> None:
        """The connection is lost (a publisher waiting out a block wakes up to the error)."""
        self.closed = True
        self.unblock()

    async def wait_publishable(self) -> None:
        if self._unblocked is None:
            await trio.lowlevel.checkpoint()
        else:
            await self._unblocked.wait()
        self.check()

    def bind(self, exchange: str, routing_key: str, queue: str) -> None:
        self.bindings[(exchange, routing_key)] = queue

    def declare(self, topology: Topology) -> None:
        """Bind every queue of ``topology`` the way ``AmqpConnection.declare`` does."""
        for q in topology.queues:
            self.bind(q.exchange, q.routing_key, q.name)

    async def declare_topology(self, topology: Topology) -> None:
        """``AmqpConnection.declare``: record ``topology`` in ``declared`` and bind its queues;
        raise ``BrokerError`` instead while ``refuse_declares`` is set."""
        await trio.lowlevel.checkpoint()
        self.declared.append(topology)
        if self.refuse_declares:
            raise BrokerError("memory broker refuses declarations")
        self.declare(topology)

    def delete_queue(self, name: str) -> None:
        """``rabbitmqctl delete_queue``: its bindings and messages are gone."""
        self.bindings = {route: q for route, q in self.bindings.items() if q != name}
        self.queues.pop(name, None)

    async def publish(self, message: Outgoing) -> Confirm:
        """One message; the worker's retry publisher has this shape."""
        (confirm,) = await self.publish_batch([message])
        return confirm

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        await trio.lowlevel.checkpoint()
        results = []
        for m in messages:
            self.published.append(m)
            queue = self.bindings.get((m.exchange, m.routing_key))
            if self._unblocked is not None:
                results.append(Confirm.UNCONFIRMED)  # held by the alarm past the timeout
            elif self.drop_confirms:
                if queue:
                    self.queues[queue].append(m)  # it may have landed; we just never heard
                results.append(Confirm.UNCONFIRMED)
            elif queue is None:
                results.append(Confirm.RETURNED)
            elif self.nack_next > 0:
                self.nack_next -= 1
                results.append(Confirm.NACKED)
            else:
                self.queues[queue].append(m)
                results.append(Confirm.CONFIRMED)
        return results

    def check(self) -> None:
        if self.closed:
            raise BrokerError("memory broker closed")


# -- in-memory delivery store -------------------------------------------------------------------


class MemoryDeliveries:
    """The worker's ``DeliveryStore`` in memory, with the rule of ``attempt_record_batch`` in
    ``store/queries_attempts.sql``: a delivery's status never leaves ``DELIVERED`` or ``DEAD``
    and its attempt never goes back; the attempt row is kept whenever the delivery exists.

    Set ``unavailable = True`` to make every call raise ``StoreUnavailable`` (Postgres down).
    """

    def __init__(self) -> None:
        self.states: dict[uuid.UUID, DeliveryState] = {}
        self.last_errors: dict[uuid.UUID, str | None] = {}
        self.attempts: list[AttemptRecord] = []  # every attempt row written, in order
        self.unavailable = False

    def add(
        self,
        delivery_id: uuid.UUID,
        *,
        status: str = "PENDING",
        attempt: int = 0,
        channel_state: str = "enabled",
        channel_reason: str | None = None,
    ) -> None:
        """Create (or overwrite) a delivery row; ``channel_state`` is its channel's
        (``enabled``, ``disabled`` or ``deleted``)."""
        self.states[delivery_id] = DeliveryState(status, attempt, channel_state, channel_reason)

    def state(self, delivery_id: uuid.UUID) -> DeliveryState | None:
        return self.states.get(delivery_id)

    def _check(self) -> None:
        if self.unavailable:
            raise StoreUnavailable("memory store is unavailable")

    async def delivery_state(self, delivery_id: uuid.UUID) -> DeliveryState | None:
        await trio.lowlevel.checkpoint()
        self._check()
        return self.states.get(delivery_id)

    async def record_attempt(self, rec: AttemptRecord) -> bool:
        """Return whether the delivery row moved."""
        await trio.lowlevel.checkpoint()
        self._check()
        current = self.states.get(rec.delivery_id)
        if current is None:
            return False
        self.attempts.append(rec)
        if current.status in TERMINAL_STATUSES or current.attempt > rec.attempt:
            return False
        if rec.status is None:  # rate limited: status, attempt and last error stay
            return True
        self.states[rec.delivery_id] = msgspec.structs.replace(
            current, status=rec.status, attempt=rec.attempt
        )
        self.last_errors[rec.delivery_id] = rec.error
        return True


# -- recording adapter --------------------------------------------------------------------------


@dataclass(frozen=True)
class Delay:
    """A ``RecordingAdapter`` step: take ``seconds`` (trio time), then succeed."""

    seconds: float


AdapterStep = Receipt | Exception | Delay | None


class RecordingAdapter:
    """An ``Adapter`` that records every message it is asked to deliver.

    Each ``deliver`` call takes the next step of the script (``then(...)`` appends), or
    ``default`` once the script is used up: a ``Receipt`` or ``None`` succeeds with it, an
    exception instance is raised, a ``Delay`` sleeps that long and then succeeds.
    """

    secret_fields: frozenset[str] = frozenset({"secret"})

    def __init__(
        self,
        channel_type: str = "webhook",
        *steps: AdapterStep,
        default: AdapterStep = None,
    ) -> None:
        self.channel_type = channel_type
        self.default = default
        self.messages: list[WorkerMessage] = []
        self.called_at: list[float] = []  # trio.current_time() of each call
        self.closed = False
        self._script: deque[AdapterStep] = deque(steps)

    def then(self, *steps: AdapterStep) -> RecordingAdapter:
        self._script.extend(steps)
        return self

    def prepare_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return dict(config)

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        self.messages.append(message)
        self.called_at.append(trio.current_time())
        step = self._script.popleft() if self._script else self.default
        if isinstance(step, Delay):
            await trio.sleep(step.seconds)
            return None
        await trio.lowlevel.checkpoint()
        if isinstance(step, Exception):
            raise step
        return step

    async def aclose(self) -> None:
        self.closed = True


class PacedAdapter(RecordingAdapter):
    """A ``RecordingAdapter`` that is also a ``RateLimiter``: at most one delivery per
    ``interval_seconds`` (trio time); ``check`` answers how long the next one must wait."""

    def __init__(self, channel_type: str = "webhook", *, interval_seconds: float) -> None:
        super().__init__(channel_type)
        self.interval_seconds = interval_seconds
        self.waits: list[float] = []  # every non-zero answer of ``check``
        self._next_free = float("-inf")

    def check(self, message: WorkerMessage) -> float | None:
        now = trio.current_time()
        if now >= self._next_free:
            self._next_free = now + self.interval_seconds  # this message takes the slot
            return None
        wait = self._next_free - now
        self.waits.append(wait)
        return wait


# -- recording observer and settlements ---------------------------------------------------------


class RecordingObserver:
    """The worker's ``OutcomeObserver`` that keeps every outcome it is told, in order."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def observe(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


class SettleRecorder:
    """A ``SettleSink`` that keeps how each message was settled, in order."""

    def __init__(self) -> None:
        self.settled: list[Settle] = []

    def settle(self, delivery_tag: int, how: Settle) -> None:
        self.settled.append(how)


# -- recording reporter -------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    summary: str
    tags: dict[str, str]
    exc: BaseException | None


class RecordingReporter:
    """A ``Reporter`` that keeps every report, for tests."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(
        self, summary: str, *, tags: Mapping[str, str], exc: BaseException | None = None
    ) -> None:
        self.reports.append(Report(summary, dict(tags), exc))
