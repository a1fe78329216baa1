"""The fault-injection bookkeeping: answer classification, the ledger, the load generator against a
fake API (httpx.MockTransport, virtual time) and the checker as a table."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from notifier.testing import Received

from .ledger import (
    Answer,
    Ledger,
    Observation,
    Report,
    State,
    answered_during,
    check,
    classify_exception,
    classify_response,
    delivery_ids_of,
    outage_violations,
    send_events,
)


def event_body(key: str, delivery_ids: Sequence[str] = ()) -> bytes:
    """An answer body shaped like ``POST /v1/events``'s."""
    return json.dumps(
        {
            "id": f"e-{key}",
            "type": "chaos.test",
            "recipient": None,
            "created_at": "2024-05-01T12:00:00.000000Z",
            "deliveries": [
                {"id": d, "channel_id": "c-1", "channel_type": "webhook", "status": "PENDING"}
                for d in delivery_ids
            ],
        }
    ).encode()


# -- classification -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "state"),
    [
        (202, event_body("k", ["d1", "d2"]), State.ACCEPTED),  # stored now
        (200, event_body("k", ["d1"]), State.ACCEPTED),  # stored before: a replay of the key
        (202, event_body("k"), State.ACCEPTED),  # stored, fanned out to no channel
        (202, b"<html>proxy</html>", State.UNKNOWN),  # 202 but no event in it: ask again
        (202, b'{"id": "e"}', State.UNKNOWN),  # no deliveries in the answer: ask again
        (400, b"{}", State.REJECTED),  # not JSON
        (401, b"{}", State.REJECTED),  # bad API key
        (409, b"{}", State.REJECTED),  # key reused with another body
        (413, b"{}", State.REJECTED),
        (422, b"{}", State.REJECTED),  # breaks a rule
        (408, b"", State.UNKNOWN),  # request timeout: nothing definite
        (429, b"{}", State.UNKNOWN),  # rate limited: nothing stored, try again
        (500, b"", State.UNKNOWN),  # the transaction may or may not have committed
        (502, b"", State.UNKNOWN),  # a proxy in front
        (503, b"{}", State.UNKNOWN),  # Postgres unreachable
        (201, b"{}", State.UNKNOWN),  # not an answer the route gives
        (302, b"", State.UNKNOWN),
    ],
)
def test_classify_response(status: int, body: bytes, state: State) -> None:
    answer = classify_response(status, body)
    assert (answer.state, answer.status_code) == (state, status)


def test_an_accepted_answer_carries_the_event_and_its_deliveries() -> None:
    answer = classify_response(202, event_body("k", ["d1", "d2"]))
    assert (answer.event_id, answer.delivery_ids) == ("e-k", ("d1", "d2"))


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("refused"),
        httpx.ReadError("reset by peer"),
        httpx.RemoteProtocolError("closed mid-answer"),
        httpx.ConnectTimeout("connect"),
        httpx.ReadTimeout("read"),
        httpx.PoolTimeout("pool"),
    ],
)
def test_no_answer_is_unknown(exc: httpx.TransportError) -> None:
    answer = classify_exception(exc)
    assert (answer.state, answer.status_code) == (State.UNKNOWN, None)
    assert answer.error is not None
    assert type(exc).__name__ in answer.error


# -- the ledger ---------------------------------------------------------------------------------


def test_an_unknown_event_accepted_later_is_marked_recovered() -> None:
    ledger = Ledger()
    ledger.record("k", Answer(State.UNKNOWN, 503))
    ledger.record("k", Answer(State.UNKNOWN, None, error="ConnectError"))
    entry = ledger.record("k", classify_response(200, event_body("k", ["d1"])))
    assert entry.state is State.ACCEPTED
    assert entry.recovered_answer
    assert (entry.attempts, entry.event_id, entry.delivery_ids) == (3, "e-k", ("d1",))


def test_an_event_accepted_at_once_is_not_recovered() -> None:
    ledger = Ledger()
    assert not ledger.record("k", classify_response(202, event_body("k"))).recovered_answer


def test_an_unknown_event_rejected_later_is_rejected_and_not_recovered() -> None:
    ledger = Ledger()
    ledger.record("k", Answer(State.UNKNOWN, 503))
    entry = ledger.record("k", Answer(State.REJECTED, 422))
    assert (entry.state, entry.recovered_answer) == (State.REJECTED, False)


@pytest.mark.parametrize("final", [State.ACCEPTED, State.REJECTED])
def test_a_definite_answer_is_final(final: State) -> None:
    ledger = Ledger()
    ledger.record("k", Answer(final, 202 if final is State.ACCEPTED else 422))
    with pytest.raises(ValueError, match="already"):
        ledger.record("k", Answer(State.UNKNOWN, 503))


def test_the_ledger_keeps_the_order_first_sent() -> None:
    ledger = Ledger()
    for key in ("b", "a", "c"):
        ledger.record(key, Answer(State.UNKNOWN, 503))
    ledger.record("a", Answer(State.ACCEPTED, 200))
    assert [e.key for e in ledger] == ["b", "a", "c"]
    assert ledger.keys_in(State.UNKNOWN) == ["b", "c"]
    assert (len(ledger), ledger.count(State.ACCEPTED), "a" in ledger) == (3, 1, True)


# -- the checker --------------------------------------------------------------------------------

# Ledger rows: (key, history, delivery ids). History letters, one per attempt: U unknown,
# A accepted (its last letter), R rejected.
LedgerRows = list[tuple[str, str, list[str]]]


def ledger_of(rows: LedgerRows) -> Ledger:
    ledger = Ledger()
    for key, history, delivery_ids in rows:
        for letter in history:
            if letter == "A":
                ledger.record(key, classify_response(202, event_body(key, delivery_ids)))
            elif letter == "R":
                ledger.record(key, Answer(State.REJECTED, 422))
            else:
                ledger.record(key, Answer(State.UNKNOWN, 503))
    return ledger


FinalState = tuple[str, str | None]
DELIVERED: FinalState = ("DELIVERED", None)
DEAD_404: FinalState = ("DEAD", "HTTP 404")
TWO_EVENTS: LedgerRows = [("k1", "A", ["d1"]), ("k2", "A", ["d2", "d3"])]
ALL_DELIVERED = {"d1": DELIVERED, "d2": DELIVERED, "d3": DELIVERED}


@pytest.mark.parametrize(
    ("rows", "received", "final_states", "expected"),
    [
        # no loss: every delivery received once
        (
            TWO_EVENTS,
            ["d1", "d3", "d2"],
            ALL_DELIVERED,
            {"accepted": 2, "deliveries": 3, "delivered": 3, "lost": 0, "duplicated": 0},
        ),
        # a loss: d2 never arrived and Postgres says it is still retrying
        (
            TWO_EVENTS,
            ["d1", "d3"],
            {**ALL_DELIVERED, "d2": ("RETRYING", "HTTP 503")},
            {"delivered": 2, "lost": 1},
        ),
        # DEAD with a reason is an outcome, not a loss
        (
            TWO_EVENTS,
            ["d1", "d3"],
            {**ALL_DELIVERED, "d2": DEAD_404},
            {"delivered": 2, "dead": 1, "lost": 0},
        ),
        # DEAD without a reason is lost, as is one whose reason is blank
        (
            TWO_EVENTS,
            ["d1"],
            {"d1": DELIVERED, "d2": ("DEAD", None), "d3": ("DEAD", "  ")},
            {"delivered": 1, "dead": 2, "lost": 2},
        ),
        # received, then DEAD (the sink answered 2xx too late): delivered and dead, not lost
        (
            TWO_EVENTS,
            ["d1", "d2", "d3"],
            {**ALL_DELIVERED, "d2": DEAD_404},
            {"delivered": 3, "dead": 1, "lost": 0},
        ),
        # an accepted event's delivery that Postgres has no row for is lost, received or not
        (
            TWO_EVENTS,
            ["d1", "d2"],
            {"d1": DELIVERED},
            {"delivered": 2, "lost": 2},
        ),
        # duplicates: the extra copies are counted (d1 three times, d2 twice)
        (
            TWO_EVENTS,
            ["d1", "d2", "d1", "d3", "d1", "d2"],
            ALL_DELIVERED,
            {"delivered": 3, "duplicated": 3, "lost": 0, "unexpected": 0},
        ),
        # unexpected: x1 belongs to no accepted event (counted once, its copy is a duplicate)
        (
            TWO_EVENTS,
            ["d1", "d2", "d3", "x1", "x1"],
            ALL_DELIVERED,
            {"delivered": 3, "unexpected": 1, "duplicated": 1},
        ),
        # recovered: unknown twice, then accepted, and delivered
        (
            [("k1", "UUA", ["d1"]), ("k2", "A", ["d2"])],
            ["d1", "d2"],
            {"d1": DELIVERED, "d2": DELIVERED},
            {"accepted": 2, "recovered": 1, "lost": 0},
        ),
        # accepted on a retry but one delivery missing: not recovered, and lost
        (
            [("k1", "UA", ["d1", "d2"])],
            ["d1"],
            {"d1": DELIVERED, "d2": ("PENDING", None)},
            {"accepted": 1, "recovered": 0, "lost": 1},
        ),
        # an event fanned out to no channel owes nothing
        (
            [("k1", "A", [])],
            [],
            {},
            {"accepted": 1, "deliveries": 0, "lost": 0},
        ),
        # unknown_left: never answered definitely; nothing owed, nothing lost
        (
            [("k1", "UUU", []), ("k2", "A", ["d2"])],
            ["d2"],
            {"d2": DELIVERED},
            {"accepted": 1, "unknown_left": 1, "lost": 0},
        ),
        # rejected events owe nothing, including one rejected on a retry
        (
            [("k1", "R", []), ("k2", "UR", []), ("k3", "A", ["d3"])],
            ["d3"],
            {"d3": DELIVERED},
            {"accepted": 1, "rejected": 2, "unknown_left": 0, "recovered": 0, "lost": 0},
        ),
    ],
)
def test_check(
    rows: LedgerRows,
    received: list[str],
    final_states: dict[str, tuple[str, str | None]],
    expected: dict[str, int],
) -> None:
    report = check(ledger_of(rows), received, final_states)
    assert {kind: getattr(report, kind) for kind in expected} == expected


def test_check_gives_examples_of_each_non_zero_kind() -> None:
    rows: LedgerRows = [(f"k{n}", "A", [f"d{n}"]) for n in range(8)] + [("u", "U", [])]
    received = ["d0", "d0", "x1", "x2"]
    report = check(ledger_of(rows), received, {f"d{n}": ("PENDING", None) for n in range(8)})
    assert report.lost == 7
    assert report.examples["lost"] == ("d1", "d2", "d3", "d4", "d5")  # the first five
    assert report.examples["duplicated"] == ("d0",)
    assert report.examples["unexpected"] == ("x1", "x2")
    assert report.examples["unknown_left"] == ("u",)  # event kinds name the idempotency key
    assert "rejected" not in report.examples
    assert "recovered" not in report.examples


@pytest.mark.parametrize(
    ("report", "max_duplicates", "ok"),
    [
        (Report(accepted=3, deliveries=3, delivered=3), 0, True),  # clean
        (Report(duplicated=2), 2, True),  # duplicates within the allowance
        (Report(duplicated=3), 2, False),  # more than allowed
        (Report(lost=1), 10, False),  # a loss is never fine
        (Report(unexpected=1), 10, False),  # nor is a delivery nobody asked for
        (Report(unknown_left=2, dead=1, rejected=1), 0, True),  # outcomes, not failures
    ],
)
def test_report_ok(report: Report, max_duplicates: int, ok: bool) -> None:
    assert report.ok(max_duplicates) is ok


def test_summary_is_one_line_with_counts_then_problems() -> None:
    report = check(ledger_of(TWO_EVENTS), ["d1", "d1", "x9"], ALL_DELIVERED)
    assert report.summary() == (
        "accepted=2 rejected=0 unknown_left=0 recovered=0 deliveries=3 delivered=1 dead=0"
        " lost=2 duplicated=1 unexpected=1 not_stored=0; lost: d2, d3; unexpected: x9;"
        " duplicated: d1"
    )
    assert "\n" not in report.summary()


def test_an_accepted_event_that_postgres_does_not_have_is_not_stored() -> None:
    # k2's event row is gone (its deliveries too): both counted, and the report is not ok
    report = check(ledger_of(TWO_EVENTS), ["d1"], {"d1": DELIVERED}, stored_event_ids={"e-k1"})
    assert (report.not_stored, report.lost) == (1, 2)
    assert report.examples["not_stored"] == ("k2",)
    assert not report.ok(max_duplicates=10)
    stored = check(ledger_of(TWO_EVENTS), ["d1", "d2", "d3"], ALL_DELIVERED, {"e-k1", "e-k2"})
    assert (stored.not_stored, stored.ok(max_duplicates=0)) == (0, True)


def obs(
    key: str, sent_at: float, answered_at: float, status: int | None, retry: str | None = None
) -> Observation:
    return Observation(key, sent_at, answered_at, status, retry)


OUTAGE = [(10.0, 20.0), (30.0, 35.0)]


@pytest.mark.parametrize(
    ("observation", "inside", "violation"),
    [
        (obs("a", 11, 12, 503, "1"), True, False),  # the promised answer
        (obs("b", 11, 12, 202), True, True),  # accepted while Postgres was down
        (obs("c", 31, 32, 200), True, True),  # a replay answer needs Postgres too
        (obs("d", 11, 12, 503), True, True),  # 503 without Retry-After
        (obs("e", 11, 12, 500, "1"), True, True),  # a 500 is not the promised answer
        (obs("f", 11, 12, None), True, True),  # no answer at all
        (obs("g", 9, 12, 202), False, False),  # sent before the outage: may have committed
        (obs("h", 19, 21, 202), False, False),  # answered after it
        (obs("i", 10, 20, 503, "1"), True, False),  # the edges belong to the window
        (obs("j", 21, 29, 202), False, False),  # between two outages
    ],
)
def test_outage_rule(observation: Observation, inside: bool, violation: bool) -> None:
    assert (answered_during([observation], OUTAGE) == [observation]) is inside
    assert (outage_violations([observation], OUTAGE) == [observation]) is violation


def test_delivery_ids_of_reads_the_webhook_id_header() -> None:
    received = [
        Received("POST", "/hook", {"webhook-id": d, "webhook-timestamp": "1"}, b"{}", 0.0)
        for d in ("d1", "d2", "d1")
    ]
    assert delivery_ids_of(received) == ["d1", "d2", "d1"]


# -- the load generator, against a fake API ------------------------------------------------------

Step = int | type[httpx.TransportError] | str  # a status, an exception to raise, or a behaviour


class FakeApi:
    """``POST /v1/events`` with idempotency: the first accepted attempt of a key answers 202, later
    ones 200 with the same event. Each key's attempts follow its script, then 202/200:
    a status (no event stored), an exception class (no answer, nothing stored), ``"lost_answer"``
    (stored, then the connection drops), ``"slow"`` (takes 5 s, then answers)."""

    def __init__(
        self,
        scripts: dict[str, list[Step]] | None = None,
        payload: Any = None,  # (n) -> the payload event n must carry; None: {"seq": n}
    ) -> None:
        self.payload = payload or (lambda n: {"seq": n})
        self.scripts = {k: deque(v) for k, v in (scripts or {}).items()}
        self.always: dict[str, int] = {}  # key -> status every attempt answers
        self.attempts: list[tuple[float, str]] = []  # (trio time, key) of every request
        self.stored: set[str] = set()
        self.in_flight = 0
        self.max_in_flight = 0

    def times_of(self, key: str) -> list[float]:
        return [t for t, k in self.attempts if k == key]

    def first_sends(self) -> list[tuple[float, str]]:
        seen: set[str] = set()
        out = []
        for t, key in self.attempts:
            if key not in seen:
                seen.add(key)
                out.append((t, key))
        return out

    async def handler(self, request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("POST", "/v1/events")
        body: dict[str, Any] = json.loads(request.content)
        seq = body["payload"]["seq"]
        key = f"chaos-{seq}"
        assert body == {"type": "chaos.test", "payload": self.payload(seq), "idempotency_key": key}
        self.attempts.append((trio.current_time(), key))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(key, request)
        finally:
            self.in_flight -= 1

    async def _answer(self, key: str, request: httpx.Request) -> httpx.Response:
        script = self.scripts.get(key)
        step: Step | None = script.popleft() if script else None
        if step is None and key in self.always:
            step = self.always[key]
        if step == "slow":
            await trio.sleep(5)
        else:
            await trio.lowlevel.checkpoint()
        if isinstance(step, type):
            raise step("injected", request=request)
        if isinstance(step, int):
            headers = {"Retry-After": "1"} if step == 503 else {}
            error = {"error": {"code": "x", "message": "injected"}}
            return httpx.Response(step, json=error, headers=headers)
        status = 200 if key in self.stored else 202
        self.stored.add(key)
        if step == "lost_answer":
            raise httpx.ReadError("connection reset after commit", request=request)
        return httpx.Response(status, content=event_body(key, [f"d-{key}"]))


def client_for(api: FakeApi) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.MockTransport(api.handler),
        base_url="http://notifier.test",
        headers={"Authorization": "Bearer nk_test"},
    )


async def test_sends_at_a_steady_rate(mock_clock: trio.testing.MockClock) -> None:
    api = FakeApi()
    ledger = Ledger()
    async with client_for(api) as client:
        await send_events(client, ledger, count=10, rate_per_second=5)
    assert [t for t, _ in api.attempts] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8]
    assert [k for _, k in api.attempts] == [f"chaos-{n}" for n in range(10)]
    assert ledger.count(State.ACCEPTED) == 10
    entry = ledger["chaos-3"]
    assert (entry.status_code, entry.event_id, entry.delivery_ids) == (
        202,
        "e-chaos-3",
        ("d-chaos-3",),
    )
    assert trio.current_time() == 1.8  # nothing unknown: no retry round


async def test_the_held_tail_waits_for_its_release_then_keeps_the_rate(
    mock_clock: trio.testing.MockClock,
) -> None:
    api = FakeApi()
    ledger = Ledger()
    release = trio.Event()

    async def heal_later() -> None:
        await trio.sleep(3)
        release.set()

    async with client_for(api) as client, trio.open_nursery() as nursery:
        nursery.start_soon(heal_later)
        await send_events(client, ledger, count=6, rate_per_second=5, held=2, release=release)
    assert [t for t, _ in api.attempts] == [0.0, 0.2, 0.4, 0.6, 3.0, 3.2]
    assert [k for _, k in api.attempts] == [f"chaos-{n}" for n in range(6)]
    assert ledger.count(State.ACCEPTED) == 6


async def test_a_slow_answer_does_not_stall_the_pacing(mock_clock: trio.testing.MockClock) -> None:
    api = FakeApi({"chaos-1": ["slow"], "chaos-2": ["slow"]})
    ledger = Ledger()
    async with client_for(api) as client:
        await send_events(client, ledger, count=6, rate_per_second=10)
    assert [t for t, _ in api.attempts] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert ledger.count(State.ACCEPTED) == 6
    assert trio.current_time() == 5.2  # the last slow answer


async def test_at_most_max_in_flight_requests(mock_clock: trio.testing.MockClock) -> None:
    api = FakeApi({f"chaos-{n}": ["slow"] for n in range(20)})
    ledger = Ledger()
    async with client_for(api) as client:
        await send_events(client, ledger, count=20, rate_per_second=100, max_in_flight=8)
    assert api.max_in_flight == 8
    starts = [t for t, _ in api.attempts]
    assert starts[:8] == [n / 100 for n in range(8)]  # paced while a slot is free
    assert starts[8] == 5.0  # then each waits for the first answer to come back
    assert ledger.count(State.ACCEPTED) == 20


async def test_unknown_events_are_retried_with_the_same_key(
    mock_clock: trio.testing.MockClock,
) -> None:
    api = FakeApi(
        {
            "chaos-1": [httpx.ConnectError],  # refused, then fine
            "chaos-3": [503, 503],  # Postgres down twice
            "chaos-4": [422],  # a definite no: not retried
            "chaos-5": ["lost_answer"],  # stored, answer lost: the retry gets 200
            "chaos-6": [httpx.ReadTimeout, 429],  # timeout, then rate limited, then fine
            "chaos-7": [503, 409],  # unknown, then a definite no
        }
    )
    api.always["chaos-8"] = 503  # never gets a definite answer
    ledger = Ledger()
    async with client_for(api) as client:
        await send_events(client, ledger, count=10, rate_per_second=5, retry_unknown_for_seconds=5)

    states = {e.key: e.state for e in ledger}
    assert states == {
        **{f"chaos-{n}": State.ACCEPTED for n in (0, 1, 2, 3, 5, 6, 9)},
        "chaos-4": State.REJECTED,
        "chaos-7": State.REJECTED,
        "chaos-8": State.UNKNOWN,
    }
    recovered = {e.key for e in ledger if e.recovered_answer}
    assert recovered == {"chaos-1", "chaos-3", "chaos-5", "chaos-6"}
    assert ledger["chaos-5"].status_code == 200  # the replay of the stored event
    assert ledger["chaos-5"].delivery_ids == ("d-chaos-5",)
    assert ledger["chaos-8"].status_code == 503

    # every request carried its own key (checked by the fake); retries are rounds one second
    # apart after the first pass ended at 1.8, the last one starting no later than 1.8 + 5
    assert [t for t, _ in api.first_sends()] == [n / 5 for n in range(10)]
    assert api.times_of("chaos-4") == [0.8]
    assert api.times_of("chaos-1") == [0.2, 2.8]
    assert api.times_of("chaos-3") == [0.6, 2.8, 3.8]
    assert api.times_of("chaos-6") == [1.2, 2.8, 3.8]
    assert api.times_of("chaos-8") == [1.6, 2.8, 3.8, 4.8, 5.8, 6.8]
    assert ledger["chaos-8"].attempts == 6
    assert trio.current_time() == 6.8
    # the fake stored each accepted event exactly once, whatever the number of attempts
    assert api.stored == {k for k, s in states.items() if s is State.ACCEPTED}


async def test_every_request_is_observed_with_its_times_and_retry_after(
    mock_clock: trio.testing.MockClock,
) -> None:
    api = FakeApi({"chaos-1": [503, "slow"], "chaos-2": [httpx.ConnectError]})
    ledger = Ledger()
    async with client_for(api) as client:
        await send_events(client, ledger, count=3, rate_per_second=10)
    assert ledger.observations == [
        Observation("chaos-0", 0.0, 0.0, 202),
        Observation("chaos-1", 0.1, 0.1, 503, "1"),
        Observation("chaos-2", 0.2, 0.2, None),
        Observation("chaos-2", 1.2, 1.2, 202),  # the retry round, one second after the pass
        Observation("chaos-1", 1.2, 6.2, 202),  # sent with it, answered slowly
    ]


async def test_a_payload_function_shapes_each_event(mock_clock: trio.testing.MockClock) -> None:
    def payload(n: int) -> dict[str, object]:
        return {"seq": n, "marker": n % 2 == 1}

    api = FakeApi(payload=payload)  # the fake checks every body against it
    ledger = Ledger()
    async with client_for(api) as client:
        await send_events(client, ledger, count=4, rate_per_second=10, payload=payload)
    assert ledger.count(State.ACCEPTED) == 4


async def test_without_retry_time_unknowns_stay_unknown(
    mock_clock: trio.testing.MockClock,
) -> None:
    api = FakeApi({"chaos-0": [httpx.ConnectError]})
    ledger = Ledger()
    async with client_for(api) as client:
        await send_events(client, ledger, count=2, rate_per_second=1, retry_unknown_for_seconds=0)
    assert (ledger["chaos-0"].state, ledger["chaos-1"].state) == (State.UNKNOWN, State.ACCEPTED)
    assert len(api.attempts) == 2


async def test_the_ledger_feeds_the_checker(mock_clock: trio.testing.MockClock) -> None:
    api = FakeApi({"chaos-2": [503]})
    ledger = Ledger()
    async with client_for(api) as client:
        await send_events(client, ledger, count=4, rate_per_second=10)
    received = ["d-chaos-0", "d-chaos-1", "d-chaos-2", "d-chaos-3", "d-chaos-1"]
    final = {f"d-chaos-{n}": DELIVERED for n in range(4)}
    report = check(ledger, received, final)
    assert (report.accepted, report.recovered, report.delivered) == (4, 1, 4)
    assert (report.lost, report.duplicated, report.unexpected) == (0, 1, 0)
    assert report.ok(max_duplicates=1)
    assert not report.ok(max_duplicates=0)


async def test_rate_must_be_positive() -> None:
    async with client_for(FakeApi()) as client:
        with pytest.raises(ValueError, match="rate_per_second"):
            await send_events(client, Ledger(), count=1, rate_per_second=0)
