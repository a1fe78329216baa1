"""The bookkeeping of the fault-injection suite: what was sent, what the API answered, and whether
what it accepted reached the sink.

Three pieces, each usable alone:

- ``Ledger``: per idempotency key, the state of one event (``accepted``, ``rejected`` or
  ``unknown``), fed by ``classify_response`` / ``classify_exception`` (pure);
- ``send_events``: a trio load generator that POSTs events at a steady rate, records the answers
  and retries the unknown ones with the same idempotency key;
- ``check``: pure; compares the ledger, the delivery ids the sink received and the deliveries'
  final states in Postgres, and returns a ``Report``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import httpx
import msgspec
import trio

from notifier.testing import Received

EXAMPLES_PER_KIND = 5


class State(StrEnum):
    ACCEPTED = "accepted"  # 202, or 200 for a repeated idempotency key: the event is stored
    REJECTED = "rejected"  # a definite 4xx (not 408/429): nothing was stored, do not retry
    UNKNOWN = "unknown"  # timeout, connection error, 5xx, 408, 429: retry with the same key


@dataclass(frozen=True)
class Answer:
    """What one attempt told us."""

    state: State
    status_code: int | None = None  # None when no HTTP answer arrived
    event_id: str | None = None
    delivery_ids: tuple[str, ...] = ()
    error: str | None = None


class _DeliveryBody(msgspec.Struct):
    id: str


class _EventBody(msgspec.Struct):
    id: str
    deliveries: list[_DeliveryBody]


def classify_response(status_code: int, body: bytes) -> Answer:
    """Pure: 200/202 with the event's answer body is ``accepted``; 408, 429, 5xx, any other
    status and a 200/202 whose body cannot be read are ``unknown`` (the same key again settles
    it); any other 4xx is ``rejected``."""
    if status_code in (200, 202):
        try:
            event = msgspec.json.decode(body, type=_EventBody)
        except msgspec.DecodeError as exc:
            return Answer(State.UNKNOWN, status_code, error=f"unreadable answer: {exc}")
        return Answer(
            State.ACCEPTED,
            status_code,
            event_id=event.id,
            delivery_ids=tuple(d.id for d in event.deliveries),
        )
    if 400 <= status_code < 500 and status_code not in (408, 429):
        return Answer(State.REJECTED, status_code, error=_excerpt(body))
    return Answer(State.UNKNOWN, status_code, error=_excerpt(body))


def classify_exception(exc: httpx.TransportError) -> Answer:
    """Pure: no answer (connection refused or reset, timeout …) is ``unknown``."""
    return Answer(State.UNKNOWN, None, error=f"{type(exc).__name__}: {exc}")


def _excerpt(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")


@dataclass(frozen=True)
class Entry:
    """The latest state of one event, by idempotency key."""

    key: str
    state: State
    attempts: int
    status_code: int | None
    event_id: str | None
    delivery_ids: tuple[str, ...]
    error: str | None
    recovered_answer: bool  # unknown at first, accepted on a retry with the same key


@dataclass(frozen=True)
class Observation:
    """One request and its answer, on the test's clock: when it was sent, when the answer (or
    the error) came, the status (None: no HTTP answer) and the ``Retry-After`` header."""

    key: str
    sent_at: float
    answered_at: float
    status_code: int | None
    retry_after: str | None = None


class Ledger:
    """Every event sent, by idempotency key, in the order first sent. A definite answer
    (``accepted``, ``rejected``) is final; only an ``unknown`` entry may be recorded again.
    ``observations`` keeps every request in the order answered."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self.observations: list[Observation] = []

    def record(self, key: str, answer: Answer) -> Entry:
        before = self._entries.get(key)
        if before is not None and before.state is not State.UNKNOWN:
            raise ValueError(f"{key}: already {before.state}, cannot record {answer.state}")
        entry = Entry(
            key=key,
            state=answer.state,
            attempts=1 if before is None else before.attempts + 1,
            status_code=answer.status_code,
            event_id=answer.event_id,
            delivery_ids=answer.delivery_ids,
            error=answer.error,
            recovered_answer=before is not None and answer.state is State.ACCEPTED,
        )
        self._entries[key] = entry
        return entry

    def __getitem__(self, key: str) -> Entry:
        return self._entries[key]

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def keys_in(self, state: State) -> list[str]:
        return [e.key for e in self._entries.values() if e.state is state]

    def count(self, state: State) -> int:
        return sum(1 for e in self._entries.values() if e.state is state)


# -- the load generator -------------------------------------------------------------------------


async def send_events(
    client: httpx.AsyncClient,
    ledger: Ledger,
    *,
    count: int,
    rate_per_second: float,
    event_type: str = "chaos.test",
    retry_unknown_for_seconds: float = 60.0,
    retry_pause_seconds: float = 1.0,
    max_in_flight: int = 8,
    payload: Callable[[int], dict[str, object]] | None = None,
    held: int = 0,
    release: trio.Event | None = None,
) -> None:
    """POST ``count`` events to ``/v1/events`` (relative to the client's ``base_url``; the client
    carries the API key), the n-th at ``start + n / rate_per_second``, with at most
    ``max_in_flight`` requests in flight: a slow answer does not delay the next send unless all
    of them are taken. Event n is ``{"type": event_type, "payload": {"seq": n},
    "idempotency_key": "chaos-<n>"}`` (``payload(n)`` replaces the payload when given). Every
    request is also kept in ``ledger.observations``.

    Then, while some events are ``unknown``, retry all of them with their keys, a round every
    ``retry_pause_seconds``; no round starts later than ``retry_unknown_for_seconds`` after the
    first pass ended, and those still unknown then stay so in the ledger.

    With ``release``, the last ``held`` events wait for it to be set, then go at the same rate
    (a fault scenario holds its tail back until the fault has healed, so that some events are
    always sent, and delivered, after the heal).
    """
    if rate_per_second <= 0:
        raise ValueError(f"rate_per_second must be > 0, got {rate_per_second}")
    limiter = trio.CapacityLimiter(max_in_flight)

    async def attempt(n: int) -> None:
        key = f"chaos-{n}"
        body = {
            "type": event_type,
            "payload": {"seq": n} if payload is None else payload(n),
            "idempotency_key": key,
        }
        async with limiter:
            sent_at = trio.current_time()
            retry_after = None
            try:
                response = await client.post("/v1/events", json=body)
            except httpx.TransportError as exc:  # TimeoutException is one of them
                answer = classify_exception(exc)
            else:
                answer = classify_response(response.status_code, response.content)
                retry_after = response.headers.get("retry-after")
        ledger.observations.append(
            Observation(key, sent_at, trio.current_time(), answer.status_code, retry_after)
        )
        ledger.record(key, answer)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for n in range(count):
            if release is not None and n == count - held:
                await release.wait()
                start = max(start, trio.current_time() - n / rate_per_second)
            await trio.sleep_until(start + n / rate_per_second)
            nursery.start_soon(attempt, n)

    retry_deadline = trio.current_time() + retry_unknown_for_seconds
    while unknown := ledger.keys_in(State.UNKNOWN):
        next_round = trio.current_time() + retry_pause_seconds
        if next_round > retry_deadline:
            break
        await trio.sleep_until(next_round)
        async with trio.open_nursery() as nursery:
            for key in unknown:
                nursery.start_soon(attempt, int(key.removeprefix("chaos-")))


def answered_during(
    observations: Iterable[Observation], windows: Iterable[tuple[float, float]]
) -> list[Observation]:
    """Pure: the requests sent and answered inside one of ``windows`` (``(start, end)``, on the
    same clock), in order."""
    spans = list(windows)
    return [
        o for o in observations
        if any(start <= o.sent_at and o.answered_at <= end for start, end in spans)
    ]  # fmt: skip


def outage_violations(
    observations: Iterable[Observation], windows: Iterable[tuple[float, float]]
) -> list[Observation]:
    """Pure: the requests made entirely while Postgres was down (inside one of ``windows``)
    that were not answered ``503`` with a ``Retry-After`` — a ``202`` then would be an
    acceptance of data that was never committed, and no answer at all leaves the client
    guessing."""
    return [
        o for o in answered_during(observations, windows)
        if not (o.status_code == 503 and o.retry_after)
    ]  # fmt: skip


# -- the checker --------------------------------------------------------------------------------


def delivery_ids_of(received: Iterable[Received]) -> list[str]:
    """The ``webhook-id`` (the delivery id) of every request a ``WebhookSink`` received."""
    return [r.headers["webhook-id"] for r in received]


@dataclass(frozen=True)
class Report:
    """Counts of events (``accepted``, ``rejected``, ``unknown_left``, ``recovered``) and of
    deliveries (the rest), with up to ``EXAMPLES_PER_KIND`` ids for each non-zero count:
    idempotency keys for event counts, delivery ids for delivery counts."""

    accepted: int = 0
    rejected: int = 0
    unknown_left: int = 0
    recovered: int = 0
    deliveries: int = 0  # deliveries of accepted events, the ones owed
    delivered: int = 0  # ... received at least once
    dead: int = 0  # ... whose final status is DEAD (received or not)
    lost: int = 0
    duplicated: int = 0  # extra copies, over every id received
    unexpected: int = 0  # distinct received ids that belong to no accepted event
    not_stored: int = 0  # accepted events that Postgres has no row for
    examples: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def ok(self, max_duplicates: int) -> bool:
        return (
            self.lost == 0
            and self.unexpected == 0
            and self.not_stored == 0
            and self.duplicated <= max_duplicates
        )

    def summary(self) -> str:
        """One line: every count, then examples of what went wrong."""
        counts = " ".join(f"{kind}={getattr(self, kind)}" for kind in _KINDS)
        problems = [
            f"{kind}: {', '.join(self.examples[kind])}"
            for kind in _PROBLEM_KINDS
            if self.examples.get(kind)
        ]
        return "; ".join([counts, *problems])


_KINDS = (
    "accepted",
    "rejected",
    "unknown_left",
    "recovered",
    "deliveries",
    "delivered",
    "dead",
    "lost",
    "duplicated",
    "unexpected",
    "not_stored",
)
_PROBLEM_KINDS = ("lost", "unexpected", "not_stored", "duplicated", "unknown_left", "rejected")


def check(
    ledger: Ledger,
    received_delivery_ids: Sequence[str],
    final_states: Mapping[str, tuple[str, str | None]],
    stored_event_ids: Collection[str] | None = None,
) -> Report:
    """Pure. ``final_states`` maps delivery id -> (status, last_error) as read from Postgres,
    and ``stored_event_ids`` holds the ids of the events it has (when given, an accepted event
    missing from it is ``not_stored``).

    A delivery of an accepted event is lost when it is missing from ``final_states`` (Postgres
    has no row for what it accepted, whether or not the sink got it), or when it was never
    received and is not ``DEAD`` with a non-empty ``last_error`` (a death with a reason is an
    outcome, not a loss). An event whose first answer was unknown counts as ``recovered`` when
    it was accepted on a retry and every one of its deliveries was received.
    """
    copies = Counter(received_delivery_ids)
    found: dict[str, list[str]] = {kind: [] for kind in _KINDS}
    owed: set[str] = set()
    for entry in ledger:
        if entry.state is State.REJECTED:
            found["rejected"].append(entry.key)
        elif entry.state is State.UNKNOWN:
            found["unknown_left"].append(entry.key)
        else:
            found["accepted"].append(entry.key)
            if stored_event_ids is not None and entry.event_id not in stored_event_ids:
                found["not_stored"].append(entry.key)
            if entry.recovered_answer and all(copies[d] for d in entry.delivery_ids):
                found["recovered"].append(entry.key)
            for delivery_id in entry.delivery_ids:
                owed.add(delivery_id)
                found["deliveries"].append(delivery_id)
                state = final_states.get(delivery_id)
                if copies[delivery_id]:
                    found["delivered"].append(delivery_id)
                if state is not None and state[0] == "DEAD":
                    found["dead"].append(delivery_id)
                if state is None or not (copies[delivery_id] or _dead_with_reason(state)):
                    found["lost"].append(delivery_id)
    duplicated = 0
    for delivery_id, n in copies.items():  # in the order first received
        if n > 1:
            duplicated += n - 1
            found["duplicated"].append(delivery_id)
        if delivery_id not in owed:
            found["unexpected"].append(delivery_id)
    counts = {kind: len(ids) for kind, ids in found.items()}
    counts["duplicated"] = duplicated
    examples = {kind: tuple(ids[:EXAMPLES_PER_KIND]) for kind, ids in found.items() if ids}
    return Report(**counts, examples=examples)


def _dead_with_reason(state: tuple[str, str | None]) -> bool:
    status, last_error = state
    return status == "DEAD" and bool(last_error and last_error.strip())
