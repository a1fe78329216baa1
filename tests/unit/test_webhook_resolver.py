"""The webhook's resolver (``adapters.webhook.resolver``) over a fake ``Lookup`` passed through its
constructor, on trio's mock clock: ``/etc/hosts`` first, answers kept for their clamped TTL,
failures and silence kept briefly, one question in flight per name (a stalled name holds up
nobody else), a bounded number of names. The same resolver against real local DNS servers is
in ``tests/integration/test_webhook_dns.py``."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from notifier.adapters.webhook.resolver import (
    CachingResolver,
    ResolutionError,
    Resolved,
    parse_hosts,
)
from notifier.config import nameserver_address


class FakeLookup:
    """Answers from ``answers`` (name -> Resolved, or an error text); a name in ``stalled``
    never gets an answer. Records every question with its time."""

    def __init__(
        self, answers: dict[str, Resolved | str], stalled: frozenset[str] = frozenset()
    ) -> None:
        self.answers = answers
        self.stalled = stalled
        self.asked: list[tuple[str, float]] = []

    async def __call__(self, name: str) -> Resolved:
        self.asked.append((name, trio.current_time()))
        if name in self.stalled:
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()
        answer = self.answers[name]
        if isinstance(answer, str):
            raise ResolutionError(answer)
        return answer


def resolver(lookup: FakeLookup, **options: Any) -> CachingResolver:
    options.setdefault("hosts", {})
    options.setdefault("timeout_seconds", 5.0)
    return CachingResolver(lookup, **options)


GOOD = Resolved(("93.184.216.34", "2606:2800:220:1::1"), 60.0)


async def test_an_answer_is_the_lookups() -> None:
    lookup = FakeLookup({"hook.example": GOOD})
    assert await resolver(lookup)("hook.example", 443) == GOOD.addresses


async def test_names_in_the_hosts_table_are_never_asked() -> None:
    lookup = FakeLookup({})
    r = resolver(lookup, hosts={"receiver.internal": ("10.1.2.3",)})
    assert await r("Receiver.Internal.", 80) == ("10.1.2.3",)  # any case, trailing dot
    assert lookup.asked == []


@pytest.mark.parametrize(
    ("ttl", "kept"),
    [
        (60.0, 60.0),  # as the zone says
        (0.0, 5.0),  # no caching asked: 5 s all the same (one question per name per 5 s)
        (1.0, 5.0),  # raised to the floor
        (86_400.0, 300.0),  # a day: lowered to the ceiling, so a changed record is seen
    ],
)
async def test_an_answer_is_kept_for_its_ttl_within_limits(
    mock_clock: trio.testing.MockClock, ttl: float, kept: float
) -> None:
    lookup = FakeLookup({"hook.example": Resolved(("93.184.216.34",), ttl)})
    r = resolver(lookup)
    await r("hook.example", 443)
    mock_clock.jump(kept - 0.001)
    await r("hook.example", 443)
    assert len(lookup.asked) == 1  # from the cache
    mock_clock.jump(0.001)
    await r("hook.example", 443)
    assert [at for _, at in lookup.asked] == [0.0, kept]


async def test_a_failure_is_kept_briefly(mock_clock: trio.testing.MockClock) -> None:
    lookup = FakeLookup({"gone.example": "no such name"})
    r = resolver(lookup)
    for _ in range(3):
        with pytest.raises(ResolutionError, match=r"^no such name$"):
            await r("gone.example", 443)
    assert len(lookup.asked) == 1
    mock_clock.jump(5.0)
    with pytest.raises(ResolutionError):
        await r("gone.example", 443)
    assert [at for _, at in lookup.asked] == [0.0, 5.0]


async def test_an_empty_answer_is_a_failure() -> None:
    r = resolver(FakeLookup({"empty.example": Resolved((), 60.0)}))
    with pytest.raises(ResolutionError, match=r"^no address$"):
        await r("empty.example", 443)


async def test_silence_ends_at_the_timeout_and_is_kept_briefly(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookup = FakeLookup({}, stalled=frozenset({"stall.example"}))
    r = resolver(lookup, timeout_seconds=4.0)
    with pytest.raises(ResolutionError, match=r"^no answer within 4 s$"):
        await r("stall.example", 443)
    assert trio.current_time() == 4.0
    with pytest.raises(ResolutionError, match=r"^no answer within 4 s$"):
        await r("stall.example", 443)  # at once, from the cache
    assert trio.current_time() == 4.0
    assert len(lookup.asked) == 1


async def test_one_question_per_name_and_a_stalled_name_holds_up_no_other(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookup = FakeLookup({"hook.example": GOOD}, stalled=frozenset({"stall.example"}))
    r = resolver(lookup, timeout_seconds=5.0)
    failed_at: list[float] = []

    async def stalled() -> None:
        with pytest.raises(ResolutionError, match="no answer within 5 s"):
            await r("stall.example", 443)
        failed_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(stalled)
        await trio.testing.wait_all_tasks_blocked()
        assert r.names_in_flight == 1
        assert await r("hook.example", 443) == GOOD.addresses  # not behind the stalled name
        assert trio.current_time() == 0.0
    assert [name for name, _ in lookup.asked] == ["stall.example", "hook.example"]
    assert failed_at == [5.0] * 50  # all with the one question's answer


async def test_a_waiter_asks_again_when_the_question_it_waited_for_is_cancelled(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookup = FakeLookup({}, stalled=frozenset({"slow.example"}))
    r = resolver(lookup, timeout_seconds=5.0)
    async with trio.open_nursery() as nursery:
        first = trio.CancelScope()

        async def asker() -> None:
            with first:
                await r("slow.example", 443)

        async def waiter() -> None:
            with pytest.raises(ResolutionError):
                await r("slow.example", 443)

        nursery.start_soon(asker)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(1.0)
        first.cancel()  # the asker's delivery ended (its own deadline, say)
    assert lookup.asked == [("slow.example", 0.0), ("slow.example", 1.0)]
    assert trio.current_time() == 6.0  # the waiter's own question got the whole 5 s


async def test_the_cache_holds_a_bounded_number_of_names() -> None:
    answers: dict[str, Resolved | str] = {f"h{i}.example": GOOD for i in range(3)}
    lookup = FakeLookup(answers)
    r = resolver(lookup, max_names=2)
    for i in range(3):
        await r(f"h{i}.example", 443)
    assert r.names_cached == 2
    await r("h2.example", 443)
    await r("h0.example", 443)  # the oldest went
    assert [name for name, _ in lookup.asked] == [
        "h0.example", "h1.example", "h2.example", "h0.example",
    ]  # fmt: skip


def test_a_hosts_file_is_read_as_the_system_reads_it() -> None:
    text = """
        # comment
        127.0.0.1   localhost localhost.localdomain
        10.1.2.3    Receiver.Internal receiver   # trailing comment
        fd00::5     receiver.internal
        not-an-ip   ignored.example
        10.1.2.4
    """
    assert parse_hosts(text) == {
        "localhost": ("127.0.0.1",),
        "localhost.localdomain": ("127.0.0.1",),
        "receiver.internal": ("10.1.2.3", "fd00::5"),
        "receiver": ("10.1.2.3",),
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("192.0.2.53", ("192.0.2.53", 53)),
        ("192.0.2.53:5353", ("192.0.2.53", 5353)),
        ("2001:db8::53", ("2001:db8::53", 53)),
        ("[2001:db8::53]:5353", ("2001:db8::53", 5353)),
    ],
)
def test_a_nameserver_is_an_address_and_maybe_a_port(text: str, expected: tuple[str, int]) -> None:
    assert nameserver_address(text) == expected


@pytest.mark.parametrize("text", ["ns1.example", "ns1.example:53", "192.0.2.53:0", "", "[::1]"])
def test_a_nameserver_that_is_not_an_address_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"must be an IP address|port must be"):
        nameserver_address(text)
